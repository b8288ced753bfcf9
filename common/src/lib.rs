//! Pure logic shared by the host and the plugins (no I/O, a few small
//! crates; builds for both the native host and the plugins' wasm targets).

pub mod amount;
pub mod etag;
pub mod hex;
pub mod media;
pub mod order;
pub mod parties;
pub mod secret;
pub mod text;
pub mod time;
pub mod uint;
pub mod url;
pub mod utf8;

/// Most keys one storage `get-many` call may name (the WIT `storage`): the
/// host refuses more, and plugins reading more ask in chunks of this size.
pub const MAX_GET_MANY: usize = 1000;

/// Largest value one storage write may hold (the WIT `storage`): the host
/// refuses more (a post with 16 attachments of 512 KiB fits).
pub const MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;
