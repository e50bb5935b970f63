#![no_main]

use std::sync::LazyLock;

use streamhost::fuzzing::{wit_value, WitTypes};

/// The `kinds` example component's parameter types: every WIT type kind.
/// Build it first: `cargo build --release --target wasm32-wasip2
/// --manifest-path examples/processors/Cargo.toml`.
static TYPES: LazyLock<WitTypes> = LazyLock::new(|| {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/processors/target/wasm32-wasip2/release/kinds.wasm"
    );
    let bytes = std::fs::read(path)
        .unwrap_or_else(|e| panic!("reading {path}: {e} (build the example processors first)"));
    WitTypes::of_component(&bytes).expect("the kinds component's types")
});

libfuzzer_sys::fuzz_target!(|data: &[u8]| wit_value(&TYPES, data));
