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

/// A shell word: single-quoted.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A shell command that reproduces `fold(state, batch)` with the wasmtime
/// CLI. A processor with keyed state (`keys`: what the call read, with
/// the values it read) gets `-S keyvalue` and the keys seeded with
/// `-S keyvalue-in-memory-data=KEY=VALUE`; a key the CLI cannot be given
/// (a value that is not UTF-8, a key with `=` or `,`) is named in a
/// trailing comment.
pub fn fold_command(
    component_path: &str,
    state: &str,
    b: &Batch,
    keys: Option<&[(String, Vec<u8>)]>,
) -> String {
    let call = quoted(&fold_call(state, b));
    let Some(keys) = keys else {
        return format!("wasmtime run --invoke {call} {component_path}");
    };
    let mut flags = String::from("-S keyvalue");
    let mut unseeded = Vec::new();
    for (k, v) in keys {
        match std::str::from_utf8(v) {
            Ok(v) if !k.contains(['=', ',']) && !v.contains(',') => {
                flags.push_str(&format!(
                    " -S {}",
                    quoted(&format!("keyvalue-in-memory-data={k}={v}"))
                ));
            }
            _ => unseeded.push(k.as_str()),
        }
    }
    let mut command = format!("wasmtime run {flags} --invoke {call} {component_path}");
    if !unseeded.is_empty() {
        command.push_str(&format!(
            "  # not seeded (the CLI takes UTF-8 values without ',' and keys without '=' or ','): {unseeded:?}"
        ));
    }
    command
}
