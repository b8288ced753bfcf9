//! The component runtime: engine, families and their grants, linking per
//! capability, hot reload, and the host side of every WIT interface.
//!
//! Its modules, bottom first: [`status`] and [`bindings`]; the call
//! limits ([`long_calls`], [`limiter`]) and [`memo`]; the route table
//! ([`routes`], [`api`]); the host side of the WIT interfaces ([`host`]);
//! the [`Runtime`] itself ([`engine`]); the host's own routes
//! ([`native`]); [`serving`]; hot reload ([`reload`]). Each uses only
//! modules before it (`crate::layers` fails on a cycle among them): the
//! host interfaces reach the runtime, which runs the requests they
//! dispatch, only through [`host::Serving`], which [`serving`] implements
//! for [`Runtime`].

pub mod api;
pub mod bindings;
pub mod engine;
pub mod host;
pub mod limiter;
pub mod long_calls;
pub mod memo;
pub mod native;
pub mod reload;
pub mod routes;
pub mod serving;
pub mod status;

pub use engine::{FEES_FAMILY, Limits, LoadedPlugin, OneChange, Runtime};
pub use host::{Caller, MAX_DISPATCH_DEPTH};
pub use status::PluginStatus;
