//! WAVE (WebAssembly Value Encoding) text for processor calls, so a failing
//! fold can be reproduced with the plain `wasmtime` CLI:
//! `wasmtime run --invoke 'fold("…", {…})' processor.wasm`.

//!
//! The values are built as `wasmtime::component::Val`s and printed by the
//! `wasm-wave` crate (re-exported by wasmtime), the same code the wasmtime
//! CLI parses `--invoke` with.

use wasmtime::component::{wasm_wave, Val};

use super::runtime::{Batch, StreamInfo};

fn text(s: &str) -> Val {
    Val::String(s.to_string())
}

fn option_text(s: &Option<String>) -> Val {
    Val::Option(s.as_deref().map(|v| Box::new(text(v))))
}

fn record(fields: Vec<(&str, Val)>) -> Val {
    Val::Record(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

fn stream_info(s: &StreamInfo) -> Val {
    record(vec![
        ("project-id", option_text(&s.project_id)),
        ("path", text(&s.path)),
        ("stream-id", text(&s.stream_id)),
        ("stream-created-at", text(&s.stream_created_at)),
        ("max-offset", Val::U64(s.max_offset)),
    ])
}

fn print(v: &Val) -> String {
    // Printing a value built from strings, integers, options, lists and
    // records cannot fail.
    wasm_wave::to_string(v).expect("a WAVE value of strings, numbers and records")
}

/// A WAVE string literal.
pub fn string(s: &str) -> String {
    print(&text(s))
}

/// The WAVE value of a batch record.
pub fn batch(b: &Batch) -> String {
    print(&record(vec![
        ("stream", stream_info(&b.stream)),
        ("events", text(&b.events)),
        ("scanned-through-offset", Val::U64(b.scanned_through_offset)),
    ]))
}

/// The `--invoke` argument for `fold(state, batch)`.
pub fn fold_call(state: &str, b: &Batch) -> String {
    format!("fold({}, {})", string(state), batch(b))
}

/// A shell command that reproduces `fold(state, batch)` with the wasmtime CLI.
pub fn fold_command(component_path: &str, state: &str, b: &Batch) -> String {
    let call = fold_call(state, b).replace('\'', "'\\''");
    format!("wasmtime run --invoke '{call}' {component_path}")
}
