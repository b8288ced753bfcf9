//! The marketplace host: HTTP, payments, signatures, storage and the
//! WebAssembly plugin runtime. The binary (`src/main.rs`) is a thin CLI over
//! this library; tests and benchmarks drive the library directly too.
//!
//! Layers, each importing only the ones below it (the order, bottom
//! first, is `layers::ORDER`, and a test holds the sources to it):
//!
//! - [`cli`]: the command line, over [`server::run`].
//! - [`server`]: HTTP (hyper), the router and route table, the admin API,
//!   the host's own routes (fees, cash) and the assembled OpenAPI document.
//! - [`app`]: the state and the runtime together, for the server.
//! - [`runtime`]: the wasmtime engine, families and their grants, linking
//!   per capability, hot reload, and [`runtime::host`]: one file per WIT
//!   interface a plugin may import; beside it [`backup`] (snapshots of a
//!   data dir and their restore) and [`retention`] (the sweeper of
//!   used-signature and replay records).
//! - [`state`]: configuration, storage, ledger, ids and clock, shared by
//!   the layers above (the runtime never sees [`App`]).
//! - [`auth`]: Ed25519 signature checks.
//! - [`money`]: the cash ledger, the 402 payment gate, escrow per
//!   contract, upstream mode (which works on the state through
//!   [`money::upstream::Books`], not by name).
//! - [`reply`]: the answer type and its JSON errors.
//! - [`store`]: redb storage, the shared PostgreSQL store, group commit.
//! - [`logging`] (the log writer: a busy async worker writes its lines in
//!   batches), [`config`] (settings), [`alerts`] (problems found at start
//!   that need the operator; health and a metric show them).
//! - [`ids`], [`capabilities`], [`metrics`]: ids and hex, grant names, the
//!   process's Prometheus metrics; [`heap`]: the binary's allocator
//!   (mimalloc; in an arena of small pages with `heap_huge_pages = false`).

pub mod alerts;
pub mod app;
pub mod auth;
pub mod backup;
pub mod capabilities;
pub mod cli;
pub mod config;
pub mod heap;
pub mod ids;
#[cfg(test)]
mod layers;
pub mod logging;
pub mod metrics;
pub mod money;
pub mod reply;
pub mod retention;
pub mod runtime;
pub mod server;
pub mod state;
pub mod store;
pub mod versions;

pub use app::App;
pub use config::Config;
pub use reply::Reply;
