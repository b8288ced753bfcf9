//! Pure logic shared by the host and the plugins (no dependencies, builds
//! for both the native host and wasm32-wasip2).

pub mod amount;
pub mod hex;
pub mod order;
pub mod secret;
pub mod text;
pub mod time;
pub mod uint;
pub mod url;
