//! The server layer: HTTP and the admin API.

pub mod admin;
pub mod http;
