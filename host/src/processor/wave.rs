//! WAVE (WebAssembly Value Encoding) text for processor calls, so a failing
//! fold can be reproduced with the plain `wasmtime` CLI:
//! `wasmtime run --invoke 'fold("…", {…})' processor.wasm`.

use super::runtime::{Batch, Event, StreamInfo};

/// A WAVE string literal.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\'' => out.push_str("\\'"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn option_string(s: &Option<String>) -> String {
    match s {
        Some(v) => format!("some({})", string(v)),
        None => "none".to_string(),
    }
}

fn stream_info(s: &StreamInfo) -> String {
    format!(
        "{{project-id: {}, path: {}, stream-id: {}, stream-created-at: {}, max-offset: {}}}",
        option_string(&s.project_id),
        string(&s.path),
        string(&s.stream_id),
        string(&s.stream_created_at),
        s.max_offset
    )
}

fn event(e: &Event) -> String {
    format!(
        "{{offset: {}, %type: {}, payload: {}, metadata: {}, created-at: {}, idempotency-key: {}}}",
        e.offset,
        string(&e.type_),
        string(&e.payload),
        option_string(&e.metadata),
        string(&e.created_at),
        option_string(&e.idempotency_key)
    )
}

/// The WAVE value of a batch record.
pub fn batch(b: &Batch) -> String {
    let events: Vec<String> = b.events.iter().map(event).collect();
    format!(
        "{{%stream: {}, events: [{}], scanned-through-offset: {}}}",
        stream_info(&b.stream),
        events.join(", "),
        b.scanned_through_offset
    )
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
