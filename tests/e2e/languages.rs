//! Processors and reactors written in TypeScript, JavaScript and Python,
//! built with the SDKs in `guest-sdk/js` and `guest-sdk/python` by the
//! standard component tools (componentize-js, componentize-py), run by the
//! real server beside the Rust guests: the same folds give the same states,
//! keyed state and effects work the same, and a guest's own error is the
//! failure's message.

use std::time::Duration;

use serde_json::{json, Value};

use crate::effects::{all_effects, Receiver};
use crate::processors::{caught_up, caught_up_within};
use crate::support::{guest, language_guest, run_cli, wait_for, Server};

/// A first wake of a 12–18 MiB component waits for the deploy's compile
/// (not counted) and instantiates it from the compiled code: 3 s is
/// plenty.
const LANG: &str = r#"
[delivery]
max-attempts = 3
backoff-base-ms = 10
backoff-max-ms = 40
timeout-ms = 3000

[effects]
max-attempts = 3
lease-ms = 5000
concurrency = 4

[webhooks]
deny-private-networks = false
"#;

const S: &str = "/v1/projects/acme/streams/orders";
const CONFIGURED: &str = "events.iterate.com/stream/subscription-configured";

async fn deploy(s: &Server, name: &str, bytes: Vec<u8>) {
    let (status, out) = s.deploy("acme", name, bytes).await;
    assert_eq!(status, 200, "deploying {name}: {out}");
}

async fn append(s: &Server, stream: &str, events: Value) -> (u16, Value) {
    s.post(&format!("{stream}:append"), json!({ "events": events }))
        .await
}

fn wake(component: &str) -> Value {
    json!({"type": CONFIGURED, "payload": {"subscriptionKey": component,
        "receiver": {"action": "processor-wake",
            "expression": ["components", ["get", component], "wake"]}}})
}

#[tokio::test(flavor = "multi_thread")]
async fn counters_in_typescript_and_python_fold_every_event_as_the_rust_counter_does() {
    let s = Server::start_with(Some(LANG), &[]);
    deploy(&s, "counter-rs", guest("counter")).await;
    deploy(
        &s,
        "counter-ts",
        language_guest("examples/js/dist/counter.wasm"),
    )
    .await;
    deploy(
        &s,
        "counter-py",
        language_guest("examples/python/dist/counter.wasm"),
    )
    .await;
    let (status, out) = append(
        &s,
        S,
        json!([wake("counter-rs"), wake("counter-ts"), wake("counter-py")]),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    // Integers count; a fraction, a string and a missing `n` add nothing
    // in every language.
    for batch in [
        json!([{"type": "n", "payload": {"n": 5}}, {"type": "n", "payload": {"n": -7}}]),
        json!([{"type": "n", "payload": {"n": 2.5}}, {"type": "n", "payload": {"n": "3"}}]),
        json!([{"type": "n", "payload": {}}, {"type": "n", "payload": {"n": 9007199254740_i64}}]),
    ] {
        let (status, out) = append(&s, S, batch).await;
        assert_eq!(status, 200, "{out}");
    }
    let rust = caught_up(&s, S, "counter-rs").await;
    let events = s.all_events(S).await;
    assert_eq!(
        rust["state"],
        json!({"events": events.len(), "sum": 5 - 7 + 9007199254740_i64,
            "last_offset": events.last().unwrap()["offset"]}),
        "{rust}"
    );
    for port in ["counter-ts", "counter-py"] {
        let p = caught_up(&s, S, port).await;
        assert_eq!(p["state"], rust["state"], "{port}: {p}");
        assert_eq!(p["status"], "active", "{port}: {p}");
    }

    // Time travel folds each port up to an earlier offset as Rust does, and
    // verify refolds each and finds the state it stored.
    let middle = events[events.len() / 2]["offset"].as_u64().unwrap();
    let (status, then) = s
        .get(&format!("{S}:processors/counter-rs/at/{middle}"))
        .await;
    assert_eq!(status, 200, "{then}");
    assert_eq!(then["state"]["last_offset"], middle, "{then}");
    for port in ["counter-ts", "counter-py"] {
        let (status, at) = s.get(&format!("{S}:processors/{port}/at/{middle}")).await;
        assert_eq!(status, 200, "{port}: {at}");
        assert_eq!(at["state"], then["state"], "{port} at {middle}: {at}");
        let (status, v) = s
            .post(&format!("{S}:verifyProcessor"), json!({"component": port}))
            .await;
        assert_eq!(status, 200, "{port}: {v}");
        assert_eq!(v["matches"], true, "{port}: {v}");
    }

    // A new version in another language, as a shadow: the Python port
    // shadows the TypeScript counter, folds the history to the same state
    // (an empty diff) and, promoted, folds what comes next.
    let (status, v2) = s
        .deploy_with_query(
            "acme",
            "counter-ts",
            language_guest("examples/python/dist/counter.wasm"),
            "refold=shadow",
        )
        .await;
    assert_eq!(status, 200, "{v2}");
    let shadow = crate::support::shadow_ready(&s, S, "counter-ts").await;
    assert_eq!(shadow["digest"], v2["digest"], "{shadow}");
    assert_eq!(shadow["stateDiff"], json!([]), "{shadow}");
    let (status, promoted) = s
        .post(
            &format!("{S}:promoteShadow"),
            json!({"component": "counter-ts"}),
        )
        .await;
    assert_eq!(status, 200, "{promoted}");
    assert_eq!(promoted["outcome"], "promoted", "{promoted}");
    let (status, out) = append(&s, S, json!([{"type": "n", "payload": {"n": 4}}])).await;
    assert_eq!(status, 200, "{out}");
    let rust = caught_up(&s, S, "counter-rs").await;
    let promoted = caught_up(&s, S, "counter-ts").await;
    assert_eq!(promoted["digest"], v2["digest"], "{promoted}");
    assert_eq!(promoted["state"], rust["state"], "{promoted}");

    // CPython's and SpiderMonkey's instances cost milliseconds to make:
    // the calls above (wakes, time travel, verify, the shadow) took
    // instances made ahead of them, and folded as the fresh ones the Rust
    // counter's calls make (the states above are equal); a few are parked.
    let made_ahead = s.metric("streamhost_guest_calls_made_ahead").await;
    assert!(made_ahead > 0, "no call took an instance made ahead");
    let parked = s.metric("streamhost_guest_instances_parked").await;
    assert!(parked <= 8, "{parked} instances parked");
}

#[tokio::test(flavor = "multi_thread")]
async fn order_totals_in_typescript_and_python_keep_regions_in_keyed_state_and_confirm_orders() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(LANG), &[]);
    let hook = format!("{}/ok/orders", r.base);
    let mut keys = Vec::new();
    for (name, file) in [
        ("totals-ts", "examples/js/dist/order-totals.wasm"),
        ("totals-py", "examples/python/dist/order-totals.wasm"),
    ] {
        deploy(&s, name, language_guest(file)).await;
        let stream = format!("/v1/projects/acme/streams/orders-{name}");
        let orders = json!([
            wake(name),
            {"type": "events.example/order-webhook-set", "payload": {"url": hook}},
            {"type": "events.example/order-created",
             "payload": {"region": "eu", "total": 10.5, "orderId": format!("{name}-1")}},
            {"type": "events.example/order-created",
             "payload": {"region": "eu", "total": 2, "orderId": format!("{name}-2")}},
            {"type": "events.example/order-created", "payload": {"region": "us", "total": 3}},
            {"type": "events.example/ignored", "payload": {}},
        ]);
        let (status, out) = append(&s, &stream, orders).await;
        assert_eq!(status, 200, "{out}");
        let p = caught_up_within(&s, &stream, name, COMPILE_WAIT).await;
        assert_eq!(
            p["state"],
            json!({"orders": 3, "webhook": hook}),
            "{name}: {p}"
        );
        let (status, page) = s
            .get(&format!("{stream}:processors/{name}/keys?prefix=region/"))
            .await;
        assert_eq!(status, 200, "{page}");
        let found: Vec<(String, Value)> = page["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                let value = k["value"].as_str().unwrap();
                (
                    k["key"].as_str().unwrap().to_string(),
                    serde_json::from_str(value).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            found,
            vec![
                ("region/eu".to_string(), json!({"orders": 2, "total": 12.5})),
                ("region/us".to_string(), json!({"orders": 1, "total": 3})),
            ],
            "{name}: {page}"
        );
        keys.push(found);
        // Verify refolds the state and every key and finds what is stored.
        let (status, v) = s
            .post(
                &format!("{stream}:verifyProcessor"),
                json!({"component": name}),
            )
            .await;
        assert_eq!(status, 200, "{name}: {v}");
        assert_eq!(v["matches"], true, "{name}: {v}");
        assert_eq!(v["keysCompared"], 2, "{name}: {v}");

        // Each order with an id is confirmed on /orders/confirmed, once.
        let confirmed = "/v1/projects/acme/streams/orders/confirmed";
        crate::support::wait_for(
            &format!("{name}'s confirmations"),
            Duration::from_secs(30),
            async || {
                s.events_once_created(confirmed)
                    .await
                    .iter()
                    .filter(|e| {
                        e["payload"]["orderId"]
                            .as_str()
                            .is_some_and(|id| id.starts_with(name))
                    })
                    .count()
                    == 2
            },
        )
        .await;
        let second = s
            .all_events(confirmed)
            .await
            .into_iter()
            .find(|e| e["payload"]["orderId"] == format!("{name}-2"))
            .unwrap();
        assert_eq!(
            second["payload"],
            json!({"orderId": format!("{name}-2"), "region": "eu", "total": 2, "regionTotal": 12.5}),
            "{second}"
        );
        crate::support::wait_for(
            &format!("{name}'s webhooks"),
            Duration::from_secs(30),
            async || {
                r.posts_to("/ok/orders")
                    .iter()
                    .filter(|p| {
                        p.body["orderId"]
                            .as_str()
                            .is_some_and(|id| id.starts_with(name))
                    })
                    .count()
                    == 2
            },
        )
        .await;
    }
    assert_eq!(keys[0], keys[1], "both ports keep the same keys");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thrown_javascript_error_and_a_python_exception_halt_with_the_guests_own_message_and_line(
) {
    let s = Server::start_with(Some(LANG), &[]);
    for (name, file, says) in [
        (
            "throws",
            "tests/guests/dist/throws.wasm",
            [
                "TypeError: can't access property \"deeper\", state.missing is undefined",
                // The author's file and line (the bundle's, mapped back).
                "(at tests/guests/throws.js:13)",
            ],
        ),
        (
            "raises",
            "tests/guests/dist/raises.wasm",
            [
                "KeyError: 'missing' (at raises.py:10)",
                "Traceback (most recent call last)",
            ],
        ),
    ] {
        deploy(&s, name, language_guest(file)).await;
        let stream = format!("/v1/projects/acme/streams/bugs-{name}");
        // First, time through the SDK: two timers an hour after their
        // events, the second cancelled by a later event.
        let (status, out) = append(
            &s,
            &stream,
            json!([wake(name), {"type": "timer", "payload": {"remindAfterMs": 3_600_000}},
                {"type": "timer", "payload": {"remindAfterMs": 3_600_000}}]),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        let (kept, dropped) = (&out["events"][1], &out["events"][2]);
        let (status, out) = append(
            &s,
            &stream,
            json!([{"type": "stop", "payload": {"cancel": format!("remind:{}", dropped["offset"])}}]),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        let stop = out["events"][0]["offset"].as_u64().unwrap();
        wait_for(
            &format!("{name} to fold through {stop}"),
            Duration::from_secs(60),
            async || {
                let (_, p) = s.get(&format!("{stream}:processors/{name}")).await;
                p["checkpointOffset"].as_u64().is_some_and(|o| o >= stop)
            },
        )
        .await;
        let (_, page) = s
            .get(&format!(
                "/v1/projects/acme/effects?stream=/bugs-{name}&limit=10"
            ))
            .await;
        let effect = |key: String| {
            page["effects"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["key"] == json!(key))
                .cloned()
                .unwrap_or_else(|| panic!("{name}: no effect {key}: {page}"))
        };
        let timer = effect(format!("remind:{}", kept["offset"]));
        assert_eq!(timer["status"], "pending", "{name}: {timer}");
        let events = s.all_events(&stream).await;
        let kept = events
            .iter()
            .find(|e| e["offset"] == kept["offset"])
            .expect("the timer's event");
        let created = chrono::DateTime::parse_from_rfc3339(kept["createdAt"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        let not_before = chrono::DateTime::parse_from_rfc3339(timer["notBefore"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        assert_eq!(not_before, created + 3_600_000, "{name}: {timer}");
        assert_eq!(
            (&timer["type"], &timer["group"]),
            (&json!("Remind"), &json!("g")),
            "{name}"
        );
        let cancelled = effect(format!("remind:{}", dropped["offset"]));
        assert_eq!(cancelled["status"], "cancelled", "{name}: {cancelled}");
        let cancel = effect(format!("cancel:remind:{}", dropped["offset"]));
        assert_eq!(cancel["status"], "succeeded", "{name}: {cancel}");

        let (status, out) = append(
            &s,
            &stream,
            json!([{"type": "ok", "payload": {}}, {"type": "bad", "payload": {"boom": true}}]),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        let boom = out["events"][1]["offset"].clone();
        let halted = s.wait_halted(&stream, name, Duration::from_secs(60)).await;
        let error = halted["error"].as_str().unwrap_or_default();
        for said in says {
            assert!(error.contains(said), "{name}: {said:?} in {halted}");
        }
        // A bug repeats on every retry: it halts at once.
        assert_eq!(halted["attempts"], 1, "{halted}");
        let (_, p) = s.get(&format!("{stream}:processors/{name}")).await;
        assert_eq!(p["lastFailure"]["offset"], boom, "{p}");
        let message = p["lastFailure"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(says[0]), "the guest's words first: {p}");
        assert!(
            !message.contains("guest-sdk/js/") && !message.contains(".bundle.js"),
            "the author's frames only, at their own files: {p}"
        );
        // The wake folded `ok` and the bad event together and committed
        // neither: the message says so.
        assert!(
            message.contains("was committed: the checkpoint stays before offset")
                && message.contains(&format!("before offset {boom} fold without failing")),
            "{p}"
        );
        assert!(
            p["checkpointOffset"].as_u64() < boom.as_u64(),
            "nothing of the batch committed: {p}"
        );
        // The repro folds the failing event from the state before it.
        let repro = p["lastFailure"]["repro"].as_str().unwrap_or_default();
        assert!(
            repro.contains(r#"fold("{\"seen\":[3,4,5,6]}""#),
            "the repro starts from the state before the failing event: {p}"
        );
    }
}

/// What an author can get wrong is refused in their terms: the JavaScript
/// counter built with componentize-js's defaults (which import wasi:http)
/// or against an older wit/ is refused at deploy, naming the import or both
/// versions; a fold that returns a function for its state halts saying so.
#[tokio::test(flavor = "multi_thread")]
async fn a_misbuilt_component_is_refused_at_deploy_and_a_state_that_is_not_json_halts_naming_it() {
    let s = Server::start_with(Some(LANG), &[]);
    let refused = s
        .deploy(
            "acme",
            "with-http",
            language_guest("tests/guests/dist/with-http.wasm"),
        )
        .await;
    crate::support::assert_error(
        &refused,
        400,
        "invalid-component",
        "`wasi:http/outgoing-handler@0.2.",
    );
    let message = refused.1["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the component imports `wasi:http/")
            && message.contains("which the host does not give")
            && message.contains(r#"disableFeatures: ["http", "fetch-event"]"#),
        "{message}"
    );
    let refused = s
        .deploy(
            "acme",
            "old-wit",
            language_guest("tests/guests/dist/old-wit.wasm"),
        )
        .await;
    crate::support::assert_error(
        &refused,
        400,
        "invalid-component",
        "built against streamhost:processor/processor@0.1.0, and this host runs streamhost:processor@0.3.0 (and @0.2.0)",
    );
    let (status, list) = s.get("/v1/projects/acme/components").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list["components"],
        json!([]),
        "nothing was deployed: {list}"
    );

    deploy(
        &s,
        "throws",
        language_guest("tests/guests/dist/throws.wasm"),
    )
    .await;
    let stream = "/v1/projects/acme/streams/shapeless";
    let (status, out) = append(
        &s,
        stream,
        json!([wake("throws"), {"type": "ok", "payload": {}}, {"type": "odd", "payload": {"shapeless": true}}]),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let halted = s
        .wait_halted(stream, "throws", Duration::from_secs(60))
        .await;
    let error = halted["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("the state is not a JSON value: () => event.offset"),
        "{halted}"
    );
    let (_, p) = s.get(&format!("{stream}:processors/throws")).await;
    assert_eq!(
        p["lastFailure"]["offset"], out["events"][2]["offset"],
        "{p}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn welcome_reactors_in_typescript_and_python_commit_a_typed_webhook_or_refuse_the_append() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(LANG), &[]);
    for (name, file) in [
        ("welcome-ts", "examples/js/dist/welcome.wasm"),
        ("welcome-py", "examples/python/dist/welcome.wasm"),
    ] {
        deploy(&s, name, language_guest(file)).await;
        let stream = format!("/v1/projects/acme/streams/users-{name}");
        let (status, out) = append(
            &s,
            &stream,
            json!([{"type": CONFIGURED, "payload": {"subscriptionKey": name,
                "filter": {"eventTypes": ["user-signed-up"]},
                "receiver": {"action": "reactor",
                    "expression": ["components", ["get", name], "react"]}}}]),
        )
        .await;
        assert_eq!(status, 200, "{out}");

        // Refused for good: the reactor's own message, nothing committed.
        let before = s.all_events(&stream).await.len();
        let (status, out) = append(
            &s,
            &stream,
            json!([{"type": "user-signed-up", "payload": {"welcomeUrl": "http://127.0.0.1:9/"}}]),
        )
        .await;
        assert_eq!(status, 422, "{out}");
        assert_eq!(out["error"]["code"], "reactor-failed", "{out}");
        let message = out["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("the user-signed-up event at offset 3 has no userId"),
            "{name}: {out}"
        );
        assert_eq!(
            s.all_events(&stream).await.len(),
            before,
            "nothing committed"
        );

        // Accepted: the webhook is in the outbox with its envelope, then sent.
        let url = format!("{}/ok/welcome/{name}", r.base);
        let (status, out) = append(
            &s,
            &stream,
            json!([{"type": "user-signed-up",
                "payload": {"userId": "ada", "email": "ada@example.com", "welcomeUrl": url}}]),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        let offset = out["events"][0]["offset"].as_u64().unwrap();
        let effects = all_effects(&s, &format!("&component=reactor:{name}")).await;
        assert_eq!(effects.len(), 1, "{effects:?}");
        let ada = &effects[0];
        assert_eq!(ada["key"], "welcome:ada", "{ada}");
        assert_eq!(ada["type"], "SendWelcome", "{ada}");
        assert_eq!(
            ada["metadata"],
            json!({"correlationId": format!("sign-up-{offset}")}),
            "{ada}"
        );
        assert_eq!(
            ada["target"]["webhook"]["body"],
            json!({"userId": "ada", "email": "ada@example.com", "template": "welcome"}),
            "{ada}"
        );
        let path = format!("/ok/welcome/{name}");
        crate::support::wait_for("the welcome", Duration::from_secs(30), async || {
            r.posts_to(&path).len() == 1
        })
        .await;
    }
}

/// `streamhost test A --against B --events FILE`: the Rust counter and its
/// Python port agree at every offset; its TypeScript port does not where a
/// payload's `n` is written `1000.0` (a JavaScript number has no integer
/// kind), and the report names that offset and both states. The
/// order-totals ports keep equal states but different keyed bytes for a
/// total written `1000.0` (`1000` in JavaScript, `1000.0` in Python): the
/// report names the key.
/// How long a first wake may wait for an 18 MiB component's compile: it
/// is niced and shares 2 cores with the rest of the suite (7 s alone, over
/// 30 s beside the README's builds).
const COMPILE_WAIT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn test_against_names_the_first_offset_where_two_components_fold_differently() {
    if crate::support::skipped_on_postgres("an offline comparison uses no server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: Vec<u8>| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_string()
    };
    let rust = write("counter-rs.wasm", guest("counter"));
    let ts = write(
        "counter-ts.wasm",
        language_guest("examples/js/dist/counter.wasm"),
    );
    let py = write(
        "counter-py.wasm",
        language_guest("examples/python/dist/counter.wasm"),
    );
    let events = write(
        "events.jsonl",
        br#"{"type": "n", "payload": {"n": 5}}
{"type": "n", "payload": {"n": "7"}}
{"type": "n", "payload": {"n": 1000.0}}
{"type": "n", "payload": {"n": 1}}
"#
        .to_vec(),
    );

    let (ok, out, err) = run_cli(&["test", &rust, "--against", &py, "--events", &events]);
    assert!(ok, "{err}");
    assert!(
        out.contains("same state and keyed state after each of 4 offsets"),
        "{out}"
    );

    let (ok, _, err) = run_cli(&["test", &rust, "--against", &ts, "--events", &events]);
    assert!(!ok, "the ports differ");
    assert!(err.contains("at offset 3 (n) the states differ"), "{err}");
    assert!(
        err.contains(r#"counter-rs.wasm ends in {"events":3,"sum":5,"last_offset":3}"#),
        "{err}"
    );
    assert!(
        err.contains(r#"counter-ts.wasm ends in {"events":3,"sum":1005,"last_offset":3}"#),
        "{err}"
    );
    // The repro of each side's call, with the keyed-state flag that
    // guests built with the SDKs need.
    assert!(
        err.contains("reproduce with: wasmtime run -S keyvalue --invoke 'fold("),
        "{err}"
    );
    assert!(
        err.contains("and: wasmtime run -S keyvalue --invoke 'fold("),
        "{err}"
    );

    let totals_ts = write(
        "totals-ts.wasm",
        language_guest("examples/js/dist/order-totals.wasm"),
    );
    let totals_py = write(
        "totals-py.wasm",
        language_guest("examples/python/dist/order-totals.wasm"),
    );
    let orders = write(
        "orders.jsonl",
        br#"{"type": "events.example/order-created", "payload": {"region": "eu", "total": 2}}
{"type": "events.example/ignored", "payload": {}}
{"type": "events.example/order-created", "payload": {"region": "eu", "total": 1000.0}}
"#
        .to_vec(),
    );
    let (ok, _, err) = run_cli(&[
        "test",
        &totals_ts,
        "--against",
        &totals_py,
        "--events",
        &orders,
    ]);
    assert!(!ok, "the keyed bytes differ");
    assert!(
        err.contains(r#"at offset 3 (events.example/order-created) the keyed states differ at key "region/eu""#),
        "{err}"
    );
    assert!(
        err.contains(r#"has "{\"orders\":2,\"total\":1002}""#),
        "{err}"
    );
    assert!(
        err.contains(r#"has "{\"orders\":2,\"total\":1002.0}""#),
        "{err}"
    );
    // Both must be components that load: a missing file is named.
    let (ok, _, err) = run_cli(&[
        "test",
        &rust,
        "--against",
        "/nonexistent.wasm",
        "--events",
        &events,
    ]);
    assert!(!ok && err.contains("/nonexistent.wasm"), "{err}");
}

/// One attempt of 100 ms: a first wake whose timeout counted the compile of
/// an 18 MiB component (a second or more, even when the functions of the
/// Python runtime are in the compile cache) would halt its subscription.
const TIGHT: &str = r#"
[delivery]
max-attempts = 1
timeout-ms = 100
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_large_component_is_deployed_before_it_compiles_and_a_first_wake_waits_for_its_compile() {
    if crate::support::skipped_on_postgres(
        "compiling is the host's own work, the same on either storage",
    ) {
        return;
    }
    let mut s = Server::start_with(Some(TIGHT), &[]);
    // The Python counter with a custom section of its own: a digest that
    // no server compiled before (the suite's servers share a compile
    // cache), folding as the counter does.
    let bytes = with_custom_section(
        language_guest("examples/python/dist/counter.wasm"),
        "streamhost-test",
        format!("{:?}", std::time::SystemTime::now()).as_bytes(),
    );
    let (status, deployed) = s.deploy("acme", "counter-py", bytes.clone()).await;
    assert_eq!(status, 200, "{deployed}");
    assert_eq!(deployed["compiling"], true, "{deployed}");
    let exports: Vec<&str> = deployed["exports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for export in ["describe", "initial-state", "fold"] {
        assert!(exports.contains(&export), "{export}: {deployed}");
    }

    // Another project is served while it compiles: its append commits and
    // the component is still compiling when the answer is back.
    let (status, out) = append(
        &s,
        "/v1/projects/quiet/streams/canary",
        json!([{"type": "x.y/n", "payload": {"n": 1}}]),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let (status, listed) = s.get("/v1/projects/acme/components/counter-py").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["compiling"], true,
        "an append of another project waits for no compile: {listed}"
    );

    // The first wake waits for the compile; its 100 ms start after it.
    let (status, out) = append(
        &s,
        S,
        json!([wake("counter-py"), {"type": "n", "payload": {"n": 5}}]),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let p = caught_up_within(&s, S, "counter-py", COMPILE_WAIT).await;
    assert_eq!(p["status"], "active", "{p}");
    assert_eq!(p["state"]["sum"], 5, "{p}");
    assert!(p["lastFailure"].is_null(), "no attempt timed out: {p}");
    let (_, listed) = s.get("/v1/projects/acme/components/counter-py").await;
    assert!(listed.get("compiling").is_none(), "compiled: {listed}");

    // The same bytes again (another name): compiled once per digest, so
    // there is nothing to compile.
    let (status, again) = s.deploy("acme", "counter-py-2", bytes).await;
    assert_eq!(status, 200, "{again}");
    assert!(again.get("compiling").is_none(), "{again}");

    // Restarted without its compiled form (a host that did not take the
    // deploy, a lost cache): the next wake compiles it first, outside its
    // 100 ms, and folds.
    s.stop();
    let digest = deployed["digest"].as_str().unwrap();
    let cache = crate::support::shared_compile_cache();
    let mut removed = 0;
    for entry in std::fs::read_dir(&cache).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(digest)
        {
            std::fs::remove_file(&path).unwrap();
            removed += 1;
        }
    }
    assert_eq!(removed, 1, "its compiled form in {}", cache.display());
    s.launch();
    let (status, out) = append(&s, S, json!([{"type": "n", "payload": {"n": 7}}])).await;
    assert_eq!(status, 200, "{out}");
    let p = caught_up_within(&s, S, "counter-py", COMPILE_WAIT).await;
    assert_eq!(p["status"], "active", "{p}");
    assert_eq!(p["state"]["sum"], 12, "{p}");
    assert!(p["lastFailure"].is_null(), "no attempt timed out: {p}");
}

/// `component` with a custom section `name` holding `payload` appended (a
/// component may carry custom sections anywhere at its top level): other
/// bytes, and so another digest, for the same code.
fn with_custom_section(mut component: Vec<u8>, name: &str, payload: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb128(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    component.push(0); // a custom section
    leb128(body.len(), &mut component);
    component.extend_from_slice(&body);
    component
}
