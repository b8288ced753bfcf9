//! Helpers for marketplace plugins.
//!
//! A plugin crate implements [`Endpoint`] (or [`FeePolicy`]) and calls
//! [`endpoint_plugin!`] (or [`fee_plugin!`]); everything else here turns the
//! raw WIT bindings into plain Rust: JSON bodies, query/path parameters,
//! protocol errors (`{"code","message"}`) and typed storage.
//!
//! ```ignore
//! use marketplace_guest::prelude::*;
//! struct Hello;
//! impl Endpoint for Hello {
//!     const NAME: &'static str = "hello";
//!     fn handle(req: &Request) -> Result<Response, ApiError> {
//!         match (req.method(), req.route()) {
//!             ("GET", "/api/hello") => Ok(json(200, &serde_json::json!({"hello": "world"}))),
//!             _ => Err(ApiError::not_found("route")),
//!         }
//!     }
//!     fn api() -> marketplace_guest::types::Api {
//!         use marketplace_guest::openapi::{op, api};
//!         api(&[op("GET", "/api/hello", "hello", "hello", "Say hello", "")], json!({}))
//!     }
//! }
//! marketplace_guest::endpoint_plugin!(Hello);
//! ```

extern crate self as marketplace_guest;

pub use serde_json;
pub use wit_bindgen;

mod error;
pub use error::{ApiError, Detail, clip};

/// The allocator of the lean build (`wasm32-unknown-unknown`, see README
/// "Writing a plugin"): dlmalloc, which there takes the linker's initial
/// heap (`__heap_base` to `__heap_end`: what the 1 MiB of initial memory
/// leaves after the stack and data) before it grows the memory. std's own
/// allocator on that target grows the memory for every region it uses, so
/// every request would grow its instance's memory (and the host would pay
/// page-table changes to reset the pooled slot): 17 µs a trivial call
/// in-process instead of 11.
///
/// Small blocks come from free lists in front of it ([`small_alloc`]).
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
#[global_allocator]
static HEAP: small_alloc::Small<dlmalloc::GlobalDlmalloc> =
    small_alloc::Small::new(dlmalloc::GlobalDlmalloc);

pub mod small_alloc;

/// The operator's settings a component declares and checks at load.
pub mod settings;
pub use settings::Setting;

/// Log a panic's message with `log` (the world's host log, at error
/// level) before the instance traps: the default hook would write to a
/// standard stream, which the host does not give a plugin. Each export of
/// the plugin macros sets it first.
#[cfg(any(feature = "endpoint", feature = "fee-policy"))]
pub(crate) fn log_panics_with(log: fn(&str)) {
    std::panic::set_hook(Box::new(move |info| {
        log(&format!("plugin panicked: {info}"));
    }));
}

#[cfg(feature = "endpoint")]
mod endpoint;
#[cfg(feature = "endpoint")]
pub use endpoint::*;

/// Per-actor caps on writes per window of time (429 `rate_limited`).
#[cfg(feature = "endpoint")]
pub mod quota;

/// The public post document (shared by timeline, search and mcp).
#[cfg(feature = "endpoint")]
pub mod posts;

/// The search index's keys and statistics (shared by timeline and search).
#[cfg(feature = "endpoint")]
pub mod index;

/// Routes and OpenAPI of a family (the `describe-api` export).
#[cfg(feature = "endpoint")]
pub mod openapi;

#[cfg(feature = "fee-policy")]
mod fees;
#[cfg(feature = "fee-policy")]
pub use fees::*;

/// Raw bindings of the `endpoint` world.
#[cfg(feature = "endpoint")]
pub mod endpoint_bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "endpoint",
        pub_export_macro: true,
        export_macro_name: "export_endpoint",
        default_bindings_module: "marketplace_guest::endpoint_bindings",
        runtime_path: "marketplace_guest::wit_bindgen::rt",
    });
}

/// Raw bindings of the `fee-policy` world.
#[cfg(feature = "fee-policy")]
pub mod fee_bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "fee-policy",
        pub_export_macro: true,
        export_macro_name: "export_fee_policy",
        default_bindings_module: "marketplace_guest::fee_bindings",
        runtime_path: "marketplace_guest::wit_bindgen::rt",
    });
}

/// Everything a plugin usually needs.
pub mod prelude {
    #[cfg(feature = "endpoint")]
    pub use crate::endpoint::{
        Body, Endpoint, Request, Response, answer_retries_with, charge, charge_price, json,
        json_members, json_text, kv, object, precheck, require_identity, unregistered, unsigned,
        verify, verify_in_order,
    };
    pub use crate::error::{ApiError, Detail};
    #[cfg(feature = "fee-policy")]
    pub use crate::fees::{FeePolicy, amount, standard};
    pub use crate::settings::Setting;
    pub use serde_json::{Value, json};
}
