//! The WIT bindings are generated from `wit/` at compile time: a change
//! there must rebuild them (the bindings macro does not tell cargo which
//! files it read, so an added host function was "not found" until this
//! crate was touched).
fn main() {
    println!("cargo:rerun-if-changed=../../wit");
}
