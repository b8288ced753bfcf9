//! The workspace links plugins with 1 MiB of initial memory and a 256 KiB
//! stack (see `.cargo/config.toml`). This one's data alone (the embedded
//! documents and the script engine's tables) takes about 1.7 MB, and the
//! script engine's parser takes about 17 KiB of stack a level of nesting
//! (256 KiB ran out at 15 nested parentheses): it gets a 2 MiB stack and
//! starts with 6 MiB, so that, like the others, it needs no growth for a
//! typical request. (Only for wasm: the workspace's native test builds
//! link it too.)
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo::rustc-link-arg-cdylib=-zstack-size=2097152");
        println!("cargo::rustc-link-arg-cdylib=--initial-memory=6291456");
    }
}
