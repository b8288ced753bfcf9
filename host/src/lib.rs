//! The marketplace host: HTTP, payments, signatures, storage and the
//! WebAssembly plugin runtime. The binary (`src/main.rs`) is a thin CLI over
//! this library; tests and benchmarks drive the library directly too.
//!
//! Layers, each importing only the ones below it ([`app`] ties the state
//! and the runtime together for the server):
//!
//! - [`server`]: HTTP (hyper), the router and route table, the admin API,
//!   the host's own routes (fees, cash) and the assembled OpenAPI document.
//! - [`runtime`]: the wasmtime engine, families and their grants, linking
//!   per capability, hot reload, and [`runtime::host`]: one file per WIT
//!   interface a plugin may import.
//! - [`money`]: the cash ledger, the 402 payment gate, escrow per contract.
//! - [`auth`]: Ed25519 signature checks.
//! - [`store`]: redb storage and group commit.
//! - [`state`]: configuration, storage, ledger, ids and clock, shared by
//!   the layers above (the runtime never sees [`App`]).
//! - [`capabilities`], [`config`], [`ids`], [`reply`]: grants, settings,
//!   ids, hex, time; the reply type.
//! - [`metrics`]: the process's Prometheus metrics (every layer counts);
//!   [`alerts`]: problems found at start that need the operator (every
//!   layer may raise one; health and a metric show them);
//!   [`backup`]: snapshots of a data dir and their restore; [`retention`]:
//!   the sweeper of used-signature and replay records.
//! - [`cli`]: the command line, over [`server::run`]; [`logging`]: the log
//!   writer (a busy async worker writes its lines in batches).

pub mod alerts;
pub mod app;
pub mod auth;
pub mod backup;
pub mod capabilities;
pub mod cli;
pub mod config;
pub mod ids;
pub mod logging;
pub mod metrics;
pub mod money;
pub mod reply;
pub mod retention;
pub mod runtime;
pub mod server;
pub mod state;
pub mod store;

pub use app::App;
pub use config::Config;
pub use reply::Reply;
