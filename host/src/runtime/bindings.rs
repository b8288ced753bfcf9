//! The bindings wasmtime generates from `wit/`: the `endpoint` world every
//! family's component exports and imports, and the `fee-policy` world.

/// The `endpoint` world.
pub mod endpoint {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "endpoint",
        // A request's call can run on an async worker and yield there
        // on epoch ticks ([`crate::runtime::Runtime::handle_inline`]);
        // off the workers, the runtime's `run_to_end` finishes it.
        // The imports that may wait are async: `dispatch.call`
        // (another request), `payments.quote` and `payments.charge` (a
        // fee component call on a blocking thread), and every import
        // that may open a write request's transaction, which waits for
        // the commit batch (storage, charges, signature checks that
        // record the signature, escrow).
        exports: { default: async },
        imports: {
            "marketplace:plugin/dispatch.call": async,
            "marketplace:plugin/payments.quote": async,
            "marketplace:plugin/payments.charge": async,
            "marketplace:plugin/payments.charge-price": async,
            "marketplace:plugin/auth.verify": async,
            "marketplace:plugin/storage": async,
            "marketplace:plugin/escrow": async,
            // Traps at once when the shortened deadline has passed.
            "marketplace:plugin/limits.limit-time": trappable,
        },
    });
}
/// The `fee-policy` world (sharing the `types` and `log` interfaces).
pub mod fees {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "fee-policy",
        with: {
            "marketplace:plugin/types": super::endpoint::marketplace::plugin::types,
            "marketplace:plugin/log": super::endpoint::marketplace::plugin::log,
            "marketplace:plugin/settings": super::endpoint::marketplace::plugin::settings,
        },
    });
}
