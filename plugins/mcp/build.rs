//! The workspace links plugins with 1 MiB of initial memory (see
//! `.cargo/config.toml`); this one's data alone (the embedded documents
//! and the script engine's tables) takes about 1.7 MB, so it starts with
//! 4 MiB and, like the others, needs no growth for a typical request.
//! (Only for wasm: the workspace's native test builds link it too.)
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo::rustc-link-arg-cdylib=--initial-memory=4194304");
    }
}
