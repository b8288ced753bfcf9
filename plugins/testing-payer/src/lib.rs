//! Test-only: a family that needs only the `payments` grant and tries to
//! charge past it. `POST /_payer/{how}` charges `post` as the fee policy
//! prices it (`fixed`), off a basis of its own choosing (`basis`, what a
//! percentage fee is priced off: 1 webcash), or at a price it names
//! (`price`). The host takes only the first: a charge with a basis and
//! `charge-price` are the escrow holder's.

use marketplace_guest::openapi::{self, Op, op};
use marketplace_guest::prelude::*;

const OPS: &[Op] = &[Op {
    paid: Some("post"),
    ok: (201, "PayerPaid"),
    errors: &[400],
    ..op(
        "POST",
        "/_payer/{how}",
        "payerCharge",
        "testing",
        "Charge as asked",
        "`fixed`: the policy's price of post; `basis`: post off a basis of 1 webcash; `price`: post at 1 webcash.",
    )
}];

struct Payer;

impl Endpoint for Payer {
    const NAME: &'static str = "testing-payer";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> = Some(&[]);

    fn api() -> marketplace_guest::types::Api {
        let schemas =
            json!({"PayerPaid": openapi::obj(&[("payment", openapi::payment())], &["payment"])});
        openapi::api(OPS, schemas)
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        const WHOLE: u64 = 100_000_000;
        let payment = match req.param("how") {
            "fixed" => charge("post", None)?,
            "basis" => charge("post", Some(WHOLE))?,
            "price" => charge_price("post", WHOLE)?,
            other => return Err(ApiError::not_found(format!("charge kind {other}"))),
        };
        kv::put("paid", "yes")?;
        Ok(json(201, &json!({"payment": payment})))
    }
}

marketplace_guest::endpoint_plugin!(Payer);
