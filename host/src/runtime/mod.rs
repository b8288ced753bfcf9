//! The component runtime: engine, families and their grants, linking per
//! capability, hot reload, and the host side of every WIT interface.

pub mod api;
pub mod engine;
pub mod host;
pub mod limiter;
pub mod long_calls;
pub mod memo;
pub mod native;
pub mod reload;
pub mod routes;

pub use engine::{FEES_FAMILY, Limits, LoadedPlugin, PluginStatus, Runtime, bindings};
