//! The marketplace host: HTTP, payments, signatures, storage and the
//! WebAssembly plugin runtime. The binary (`src/main.rs`) is a thin CLI over
//! this library; tests and benchmarks drive the library directly too.

pub mod admin;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod group_commit;
pub mod host_api;
pub mod http;
pub mod ids;
pub mod ledger;
pub mod payments;
pub mod reload;
pub mod routes;
pub mod runtime;
pub mod storage;

pub use app::{App, Reply};
pub use config::Config;
