//! Entry points for the fuzz targets in `fuzz/` and for the replay of their
//! committed seed corpus in the test suite. Each takes raw bytes, as a
//! fuzzer gives them, and drives one parser of outside input. None may
//! panic on any input, and what a parser accepts must have the shape it
//! promises (an assertion here that fails is a finding, like a panic).

use serde_json::Value;
use wasmtime::component::types::{ComponentItem, Type};

use crate::processor::value::{to_json, to_val, ToVal};
use crate::stream::{canonicalize_path, validate_input, Authority, EventInput, PATH_BYTES_MAX};

/// The fuzz targets, by name (as in `fuzz/fuzz_targets/<name>.rs` and
/// `fuzz/corpus/<name>/`).
pub const TARGETS: &[&str] = &[
    "event_input",
    "subscription_config",
    "stream_path",
    "itx_expression",
    "jsonata",
    "jsonata_builtins",
    "wit_value",
    "http_mapping",
];

/// The built-in functions `jsonata_builtins` calls.
pub const JSONATA_BUILTINS: &[&str] = &[
    "abs",
    "append",
    "assert",
    "average",
    "base64decode",
    "base64encode",
    "boolean",
    "ceil",
    "contains",
    "count",
    "decodeUrl",
    "decodeUrlComponent",
    "distinct",
    "each",
    "encodeUrl",
    "encodeUrlComponent",
    "error",
    "eval",
    "exists",
    "filter",
    "floor",
    "formatBase",
    "formatInteger",
    "formatNumber",
    "fromMillis",
    "join",
    "keys",
    "length",
    "lookup",
    "lowercase",
    "map",
    "match",
    "max",
    "merge",
    "min",
    "not",
    "number",
    "pad",
    "parseInteger",
    "power",
    "reduce",
    "replace",
    "reverse",
    "round",
    "shuffle",
    "sift",
    "single",
    "sort",
    "split",
    "spread",
    "sqrt",
    "string",
    "substring",
    "substringAfter",
    "substringBefore",
    "sum",
    "toMillis",
    "trim",
    "type",
    "uppercase",
    "zip",
];

fn json(data: &[u8]) -> Option<Value> {
    serde_json::from_slice(data).ok()
}

/// An `:append` body's event: deserialized, then validated with every
/// authority and as an ingest message would be.
pub fn event_input(data: &[u8]) {
    let Some(event) = json(data).and_then(|v| serde_json::from_value::<EventInput>(v).ok()) else {
        return;
    };
    for authority in [Authority::Public, Authority::Platform, Authority::Effect(1)] {
        let _ = validate_input(0, &event, authority);
    }
    if crate::ingest::validate_event(0, &event, 1024 * 1024).is_ok() {
        assert!(
            event.idempotency_key.is_some(),
            "ingest accepted an event without a key"
        );
        assert!(event.offset.is_none(), "ingest accepted an expected offset");
    }
}

/// A `subscription-configured` payload; a refusal names the payload path.
pub fn subscription_config(data: &[u8]) {
    let Some(Value::Object(payload)) = json(data) else {
        return;
    };
    let parsed = crate::subscription::parse_payload::<crate::subscription::SubscriptionConfig>(
        "payload", &payload,
    );
    if let Err(message) = parsed {
        assert!(message.starts_with("payload"), "{message}");
    }
}

/// A stream path: canonical paths are absolute, bounded, free of dot
/// segments and canonical again.
pub fn stream_path(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(path) = canonicalize_path(raw) {
        assert!(path.starts_with('/'), "{path:?}");
        assert!(path.len() <= PATH_BYTES_MAX, "{path:?}");
        assert!(
            !path.contains("//") && !path.contains("/./") && !path.ends_with("/.."),
            "{path:?}"
        );
        assert_eq!(canonicalize_path(&path), Ok(path.clone()), "{raw:?}");
    }
}

/// A `{stream}:method` call as the server's handlers read it: the first
/// line is `GET|POST name[?query]`, the rest is the body. The parser answers
/// every input (no request may panic the server), and what it accepts
/// renders back to a call that it reads as the same request.
pub fn http_mapping(data: &[u8]) {
    use crate::http::mapping::{parse, render};
    use axum::http::Method;
    let (line, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return;
    };
    let (method, call) = match line.split_once(' ') {
        Some(("POST", call)) => (Method::POST, call),
        Some((_, call)) => (Method::GET, call),
        None => (Method::GET, line),
    };
    let (name, query) = match call.split_once('?') {
        Some((name, query)) => (name, Some(query)),
        None => (call, None),
    };
    let Ok(request) = parse(name, &method, query, body) else {
        return;
    };
    let call = render(&request);
    let body = call
        .body
        .as_ref()
        .map(|b| serde_json::to_vec(b).expect("a body serializes"))
        .unwrap_or_default();
    let query = (!call.query.is_empty()).then_some(call.query.as_str());
    let back = parse(&call.name, &call.method, query, &body)
        .unwrap_or_else(|e| panic!("{call:?} (rendered from {request:?}) does not parse: {e:?}"));
    assert_eq!(back, request, "{call:?}");
}

/// An ITX call expression.
pub fn itx_expression(data: &[u8]) {
    if let Some(expression) = json(data) {
        let _ = crate::itx::validate_expression("expression", &expression);
    }
}

/// A JSONata expression (the first line) evaluated against JSON (the rest),
/// through the wrapper the filters and transforms use.
pub fn jsonata(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (expression, input) = text.split_once('\n').unwrap_or((text, "null"));
    let input = serde_json::from_str(input).unwrap_or(Value::Null);
    if let Ok(compiled) = crate::jsonata::compile(expression, Default::default()) {
        let _ = compiled.evaluate(&crate::jsonata::Input::new(&input));
    }
}

/// A built-in call: the function's name, a newline, its arguments (JSONata
/// text), then optionally another newline and JSON input. Whatever the
/// arguments, a result is within the value bound (`[limits]
/// jsonata-max-bytes`); the time and allocation bounds end the rest.
pub fn jsonata_builtins(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (name, rest) = text.split_once('\n').unwrap_or((text, ""));
    if !JSONATA_BUILTINS.contains(&name.trim()) {
        return;
    }
    let (args, input) = rest.split_once('\n').unwrap_or((rest, "null"));
    let input = serde_json::from_str(input).unwrap_or(Value::Null);
    let limits = crate::jsonata::Limits::default();
    let Ok(compiled) = crate::jsonata::compile(&format!("${}({args})", name.trim()), limits) else {
        return;
    };
    let limit = limits.max_bytes;
    if let Ok(Some(v)) = compiled.evaluate(&crate::jsonata::Input::new(&input)) {
        // JSON text may escape what the bound counts raw (`\u0000` is six
        // bytes of one): allow for it.
        let bytes = v.to_string().len();
        assert!(
            bytes <= 6 * limit + 64,
            "${name}({args}) built {bytes} bytes, over the {limit}-byte bound"
        );
    }
}

/// The parameter types of every function a component exports: what ITX
/// arguments are mapped onto.
pub struct WitTypes(Vec<Type>);

impl WitTypes {
    /// Reads the parameter types of `component` (component bytes).
    pub fn of_component(component: &[u8]) -> anyhow::Result<WitTypes> {
        let engine = wasmtime::Engine::new(&wasmtime::Config::new())?;
        let component = wasmtime::component::Component::new(&engine, component)?;
        let mut types = Vec::new();
        let mut add = |item: ComponentItem| {
            if let ComponentItem::ComponentFunc(f) = item {
                types.extend(f.params().map(|(_, t)| t));
            }
        };
        for (_, item) in component.component_type().exports(&engine) {
            match item.ty {
                ComponentItem::ComponentInstance(instance) => {
                    for (_, item) in instance.exports(&engine) {
                        add(item.ty);
                    }
                }
                other => add(other),
            }
        }
        anyhow::ensure!(
            !types.is_empty(),
            "the component exports no function with parameters"
        );
        Ok(WitTypes(types))
    }
}

/// JSON mapped onto a WIT type (the first byte picks which) and back: what
/// maps, maps back to JSON that maps again to the same value.
pub fn wit_value(types: &WitTypes, data: &[u8]) {
    let Some((pick, rest)) = data.split_first() else {
        return;
    };
    let ty = &types.0[*pick as usize % types.0.len()];
    let Some(input) = json(rest) else {
        return;
    };
    for opts in [
        ToVal::default(),
        ToVal {
            ignore_unknown_fields: true,
        },
    ] {
        if let Ok(val) = to_val(&input, ty, "arg", opts) {
            let out = to_json(&val);
            let again = to_val(&out, ty, "arg", ToVal::default()).unwrap_or_else(|e| {
                panic!("{out} (from {input}) does not map back: {}", e.message)
            });
            assert_eq!(
                to_json(&again),
                out,
                "the round trip of {input} is not stable"
            );
        }
    }
}
