//! Test-only: type-checks as an endpoint component, but its `describe`
//! smoke call traps. The host must refuse it and keep the old one serving.

use marketplace_guest::endpoint_bindings::exports::marketplace::plugin::handler::Guest;
use marketplace_guest::{PluginInfo, Response, types};

struct SmokeTrap;

impl Guest for SmokeTrap {
    fn handle(_req: types::Request) -> Response {
        Response {
            status: 200,
            headers: vec![],
            body: b"{}".to_vec(),
        }
    }

    fn describe() -> PluginInfo {
        // As the guest crate's export macro does: the message reaches the
        // host's log.
        marketplace_guest::log_panics();
        panic!("deliberate trap in the smoke call")
    }

    fn describe_api() -> types::Api {
        panic!("deliberate trap in the smoke call")
    }
}

marketplace_guest::endpoint_bindings::export_endpoint!(SmokeTrap);
