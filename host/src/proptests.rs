//! Property tests over the parsers that take outside input: whatever they
//! are given, they answer (`Ok` or an error naming the problem) and never
//! panic, and what they accept has the shape they promise. A short run of
//! each is part of the normal test suite (`PROPTEST_CASES` raises it).

use proptest::prelude::*;
use serde_json::{Map, Value};

use crate::stream::{canonicalize_path, validate_input, Authority, EventInput, PATH_BYTES_MAX};

/// Any JSON value, a few levels deep, with keys that the parsers look for
/// mixed in with random ones.
fn json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("type".to_string()),
        Just("payload".to_string()),
        Just("idempotencyKey".to_string()),
        Just("offset".to_string()),
        Just("ephemeral".to_string()),
        Just("source".to_string()),
        Just("receiver".to_string()),
        Just("action".to_string()),
        Just("delivery".to_string()),
        Just("filter".to_string()),
        Just("subscriptionKey".to_string()),
        "[a-zA-Z]{1,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::String),
        Just(Value::String("copy-to-stream".into())),
        Just(Value::String("events.iterate.com/stream/paused".into())),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn object() -> impl Strategy<Value = Map<String, Value>> {
    json().prop_map(|v| match v {
        Value::Object(m) => m,
        other => Map::from_iter([("value".to_string(), other)]),
    })
}

proptest! {
    #[test]
    fn path_canonicalisation_is_total_and_idempotent(raw in "[/a-zA-Z0-9._~%: -]{0,80}|.{0,40}") {
        if let Ok(path) = canonicalize_path(&raw) {
            prop_assert!(path.starts_with('/'), "{path:?}");
            prop_assert!(path.len() <= PATH_BYTES_MAX);
            prop_assert!(!path.contains("//") && !path.contains("/./") && !path.ends_with("/.."));
            prop_assert_eq!(canonicalize_path(&path), Ok(path.clone()));
        }
    }

    #[test]
    fn event_input_validation_never_panics(v in json()) {
        if let Ok(event) = serde_json::from_value::<EventInput>(v) {
            for authority in [Authority::Public, Authority::Platform, Authority::Effect(1)] {
                let _ = validate_input(0, &event, authority);
            }
            if crate::ingest::validate_event(0, &event, 1024).is_ok() {
                prop_assert!(event.idempotency_key.is_some());
                prop_assert!(event.offset.is_none());
            }
        }
    }

    #[test]
    fn subscription_configuration_parsing_never_panics(payload in object()) {
        let parsed = crate::subscription::parse_payload::<crate::subscription::SubscriptionConfig>(
            "payload", &payload,
        );
        if let Err(message) = parsed {
            prop_assert!(message.starts_with("payload"), "{message}");
        }
    }

    #[test]
    fn itx_expression_validation_never_panics(expression in json()) {
        let _ = crate::itx::validate_expression("expression", &expression);
    }

    #[test]
    fn jsonata_compiles_or_refuses_and_evaluates_or_errs(
        text in "[a-z$.()\\[\\]{}0-9+*/&=<>!?:;,'\" -]{0,24}",
        input in json(),
    ) {
        if let Ok(expression) = crate::jsonata::compile(&text, Default::default()) {
            let _ = expression.evaluate(&crate::jsonata::Input::new(&input));
        }
    }

    #[test]
    fn jsonata_builtins_build_nothing_over_the_bound(
        i in 0..crate::fuzzing::JSONATA_BUILTINS.len(),
        args in "[a-z$.()\\[\\]{}0-9+*&,' -]{0,24}|'', [0-9]{1,10}|[0-9]{1,7}\\.\\.[0-9]{1,8}",
    ) {
        let call = format!("{}\n{args}", crate::fuzzing::JSONATA_BUILTINS[i]);
        crate::fuzzing::jsonata_builtins(call.as_bytes());
    }

    #[test]
    fn ingest_subjects_and_messages_never_panic(subject in "[a-zA-Z0-9.*>_-]{0,40}", body in prop::collection::vec(any::<u8>(), 0..64), id in proptest::option::of("[a-z0-9-]{0,8}")) {
        let _ = crate::ingest::parse_subject(&subject);
        let _ = crate::ingest::event_from_message(id.as_deref(), &body, 1024);
    }
}
