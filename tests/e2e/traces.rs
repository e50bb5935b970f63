//! Traces end to end: a `traceparent` on an append is kept with the event,
//! carried by its copy, the wake that folds the copy, the effect that wake
//! asks and the webhook that effect posts; the spans a real OTLP/HTTP
//! receiver gets (protobuf, decoded here) tell the same story in one trace.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{json, Value};

use crate::effects::{deploy, settled, wake, Receiver, EFFECTS};
use crate::subscriptions::subscribe;
use crate::support::{assert_error, cli_with, wait_for, Server};

const P: &str = "/v1/projects/acme/streams";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// One span as the receiver decoded it.
#[derive(Debug, Clone)]
struct Got {
    trace_id: String,
    span_id: String,
    parent_id: String,
    name: String,
    attributes: HashMap<String, String>,
    failed: bool,
    /// The status message (a failed span's error).
    message: String,
    /// The span's events' names (a wake's guest output lines).
    events: Vec<String>,
    dropped_events: u32,
}

/// An OTLP/HTTP receiver on loopback: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, every span kept.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<Got>>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Got>>> = Arc::default();
        async fn traces(State(spans): State<Arc<Mutex<Vec<Got>>>>, body: Bytes) -> StatusCode {
            let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                return StatusCode::BAD_REQUEST;
            };
            let mut kept = spans.lock().unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    for s in scope.spans {
                        let attributes = s
                            .attributes
                            .iter()
                            .map(|kv| {
                                let v = kv
                                    .value
                                    .as_ref()
                                    .and_then(|v| v.value.as_ref())
                                    .map(|v| format!("{v:?}"))
                                    .unwrap_or_default();
                                (kv.key.clone(), v)
                            })
                            .collect();
                        kept.push(Got {
                            trace_id: hex(&s.trace_id),
                            span_id: hex(&s.span_id),
                            parent_id: hex(&s.parent_span_id),
                            name: s.name.clone(),
                            attributes,
                            failed: s.status.as_ref().is_some_and(|st| st.code == 2),
                            message: s
                                .status
                                .as_ref()
                                .map(|st| st.message.clone())
                                .unwrap_or_default(),
                            events: s.events.iter().map(|e| e.name.clone()).collect(),
                            dropped_events: s.dropped_events_count,
                        });
                    }
                }
            }
            StatusCode::OK
        }
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Collector { endpoint, spans }
    }

    fn of_trace(&self, trace_id: &str) -> Vec<Got> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }

    fn named(&self, trace_id: &str, name: &str) -> Vec<Got> {
        self.of_trace(trace_id)
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }
}

fn config(endpoint: &str) -> String {
    format!("{EFFECTS}\n[telemetry]\notlp-endpoint = \"{endpoint}\"\n")
}

/// The trace id and parent id of a served `traceparent`.
fn ids(traceparent: &Value) -> (String, String) {
    let t = traceparent
        .as_str()
        .unwrap_or_else(|| panic!("{traceparent}"));
    let parts: Vec<&str> = t.split('-').collect();
    assert_eq!(parts.len(), 4, "{t}");
    (parts[1].to_string(), parts[2].to_string())
}

#[tokio::test]
async fn one_event_is_followed_through_a_copy_a_wake_an_effect_and_a_webhook_in_one_trace() {
    let collector = Collector::start().await;
    let receiver = Receiver::start().await;
    let s = Server::start_with(Some(&config(&collector.endpoint)), &[]);
    // Orders are copied to /work, where the effector folds them.
    subscribe(
        &s,
        "/work",
        json!({"sourceStreamPath": "/orders", "subscriptionKey": "to-work"}),
    )
    .await;
    deploy(&s, "effector", "effector").await;
    wake(&s, &format!("{P}/work"), "fx", "effector").await;
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let url = format!("{}/ok/traced", receiver.base);
    let (status, out) = s
        .post_with_headers(
            &format!("{P}/orders:append"),
            &[("traceparent", &traceparent), ("tracestate", "vendor=1")],
            json!({"events": [{"type": "events.example/effects-requested",
                "payload": {"effects": [{"key": "notify", "webhook": {"url": url, "body": {"n": 1}}},
                    {"key": "record", "append": {"streamPath": "/done", "type": "events.example/notified", "payload": {}}}]}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    // The event keeps the trace, with the append's span as its parent.
    let appended = &out["events"][0];
    let (trace_id, append_span) = ids(&appended["trace"]["traceparent"]);
    assert_eq!(trace_id, TRACE_ID, "{appended}");
    assert_ne!(append_span, CALLER_SPAN);
    assert_eq!(appended["trace"]["tracestate"], "vendor=1");

    // The effect settles: the webhook arrives with the same trace.
    let effect = settled(&s, "notify", "succeeded").await;
    let posts = receiver.posts_to("/ok/traced");
    assert_eq!(posts.len(), 1, "{posts:?}");
    let posted = posts[0].traceparent.clone().expect("a traceparent header");
    let (posted_trace, posted_parent) = ids(&json!(posted));
    assert_eq!(posted_trace, TRACE_ID);
    assert_eq!(ids(&effect["trace"]["traceparent"]).0, TRACE_ID, "{effect}");

    // The copy on /work carries the trace on.
    let copies = s.all_events(&format!("{P}/work")).await;
    let copy = copies
        .iter()
        .find(|e| e["type"] == "events.example/effects-requested")
        .expect("the copy");
    let (copy_trace, copy_parent) = ids(&copy["trace"]["traceparent"]);
    assert_eq!(copy_trace, TRACE_ID, "{copy}");

    // The receiver got every hop's span, in one trace, each under the one
    // that caused it.
    wait_for(
        "the spans of the append, the copy, the wake and the effect",
        Duration::from_secs(20),
        async || {
            ["append", "delivery attempt", "wake", "effect attempt"]
                .iter()
                .all(|name| !collector.named(TRACE_ID, name).is_empty())
        },
    )
    .await;
    let one = |name: &str| -> Got {
        let spans = collector.named(TRACE_ID, name);
        assert!(!spans.is_empty(), "no {name} span: {spans:?}");
        spans[0].clone()
    };
    let append = one("append");
    assert_eq!(append.parent_id, CALLER_SPAN, "{append:?}");
    assert_eq!(append.span_id, append_span);
    assert_eq!(
        append
            .attributes
            .get("streamhost.stream.path")
            .map(String::as_str),
        Some("StringValue(\"/orders\")"),
        "{append:?}"
    );
    // The copy's delivery attempt, under the append; the copy under it.
    let copied = collector
        .named(TRACE_ID, "delivery attempt")
        .into_iter()
        .find(|s| s.span_id == copy_parent)
        .unwrap_or_else(|| {
            panic!(
                "no delivery span {copy_parent}: {:?}",
                collector.of_trace(TRACE_ID)
            )
        });
    assert_eq!(copied.parent_id, append.span_id, "{copied:?}");
    // The wake that folded the copy, and the effect it asked, under it.
    let woke = one("wake");
    assert_eq!(woke.parent_id, copied.span_id, "{woke:?}");
    // Both effects' attempts (the webhook and the append), under the wake's
    // cause; the webhook's traceparent names its own attempt's span.
    wait_for(
        "both effect attempts' spans",
        Duration::from_secs(20),
        async || collector.named(TRACE_ID, "effect attempt").len() >= 2,
    )
    .await;
    let attempts = collector.named(TRACE_ID, "effect attempt");
    for attempt in &attempts {
        assert_eq!(attempt.parent_id, copied.span_id, "{attempt:?}");
        assert!(!attempt.failed, "{attempt:?}");
    }
    // The POST is a client span of its own, under its effect's attempt;
    // the request's traceparent names it.
    wait_for(
        "the webhook POST's span",
        Duration::from_secs(20),
        async || !collector.named(TRACE_ID, "webhook POST").is_empty(),
    )
    .await;
    let post = collector
        .named(TRACE_ID, "webhook POST")
        .into_iter()
        .find(|p| p.span_id == posted_parent)
        .unwrap_or_else(|| {
            panic!(
                "the webhook's parent {posted_parent} is no webhook POST span: {:?}",
                collector.of_trace(TRACE_ID)
            )
        });
    assert!(
        attempts.iter().any(|a| a.span_id == post.parent_id),
        "the POST's parent {} is an effect attempt: {attempts:?}",
        post.parent_id
    );
    assert_eq!(
        post.attributes
            .get("http.response.status_code")
            .map(String::as_str),
        Some("IntValue(200)"),
        "{post:?}"
    );
    assert_eq!(
        post.attributes.get("url.full").map(String::as_str),
        Some(format!("StringValue({url:?})").as_str()),
        "{post:?}"
    );
    // The collector has the spans before the exporter hears its answer and
    // counts them.
    wait_for(
        "the exported spans to be counted",
        Duration::from_secs(10),
        async || {
            s.metric("streamhost_trace_spans_total{outcome=\"exported\"}")
                .await
                >= 4
        },
    )
    .await;

    // After the fact: the story of the order, told from storage.
    settled(&s, "record", "succeeded").await;
    let order_offset = appended["offset"].as_u64().unwrap();
    let (status, story) = s
        .get(&format!("{P}/orders:events/{order_offset}/trace"))
        .await;
    assert_eq!(status, 200, "{story}");
    assert_eq!(story["traceId"], TRACE_ID, "{story}");
    assert_eq!(story["event"]["offset"], order_offset);
    assert_eq!(story["truncated"], false);
    let copy_step = story["downstream"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "copy")
        .unwrap_or_else(|| panic!("no copy: {story:#}"));
    assert_eq!(copy_step["status"], "copied", "{copy_step:#}");
    assert_eq!(copy_step["stream"], "/work");
    assert_eq!(copy_step["offset"], copy["offset"]);
    let wake_step = copy_step["caused"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "wake")
        .unwrap_or_else(|| panic!("no wake: {copy_step:#}"));
    assert_eq!(wake_step["status"], "folded", "{wake_step:#}");
    assert_eq!(wake_step["component"], "effector");
    let effects: HashMap<String, Value> = wake_step["caused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["effectKey"].as_str().unwrap().to_string(), e.clone()))
        .collect();
    assert_eq!(effects.len(), 2, "{wake_step:#}");
    assert_eq!(effects["notify"]["status"], "succeeded");
    assert_eq!(effects["record"]["status"], "succeeded");
    let done = &effects["record"]["caused"][0];
    assert_eq!(done["kind"], "event", "{done:#}");
    assert_eq!(done["stream"], "/done");
    assert_eq!(done["type"], "events.example/notified");
    // The event the effect appended knows its way back to the order.
    let done_offset = done["offset"].as_u64().unwrap();
    let (status, back) = s.get(&format!("{P}/done:events/{done_offset}/trace")).await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["traceId"], TRACE_ID, "{back:#}");
    let kinds: Vec<(&str, &str)> = back["upstream"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["kind"].as_str().unwrap(), u["stream"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("effect", "/work"),
            ("event", "/work"),
            ("copied-from", "/orders")
        ],
        "{back:#}"
    );
    assert_eq!(back["upstream"][2]["offset"], order_offset);

    // The command line prints it as a tree.
    let (ok, out, err) = cli_with(
        &s,
        &[
            "trace",
            "/orders",
            &order_offset.to_string(),
            "--output",
            "pretty",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.starts_with(&format!("trace {TRACE_ID}\n")), "{out}");
    assert!(out.contains("└─ copy /work@"), "{out}");
    assert!(
        out.contains("wake effector") && out.contains(": folded"),
        "{out}"
    );
    assert!(out.contains("effect effector \"record\""), "{out}");

    // Exported after the fact: the same story as spans of its trace.
    let before = collector.of_trace(TRACE_ID).len();
    let (status, exported) = s
        .get(&format!(
            "{P}/orders:events/{order_offset}/trace?export=true"
        ))
        .await;
    assert_eq!(status, 200, "{exported}");
    let sent = exported["exportedSpans"].as_u64().unwrap() as usize;
    assert!(sent >= 6, "{exported:#}");
    wait_for("the story's spans", Duration::from_secs(20), async || {
        collector.of_trace(TRACE_ID).len() >= before + sent
    })
    .await;
    assert!(!collector.named(TRACE_ID, "wake effector").is_empty());

    // A missing offset is a 404 naming it; a bad one a 400.
    assert_error(
        &s.get(&format!("{P}/orders:events/999/trace")).await,
        404,
        "event-not-found",
        "offset 999",
    );
    assert_error(
        &s.get(&format!("{P}/orders:events/x/trace")).await,
        400,
        "invalid-request",
        "\"x\"",
    );
    assert_error(
        &s.get(&format!("{P}/orders:events/1/trace?exprot=true"))
            .await,
        400,
        "invalid-request",
        "exprot",
    );
}

#[tokio::test]
async fn a_long_copy_chain_is_told_to_depth_eight_and_marked_truncated() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    // /c0 -> /c1 -> ... -> /c10
    for i in 0..10 {
        subscribe(
            &s,
            &format!("/c{}", i + 1),
            json!({"sourceStreamPath": format!("/c{i}"), "subscriptionKey": "next"}),
        )
        .await;
    }
    let (status, out) = s
        .post(
            &format!("{P}/c0:append"),
            json!({"events": [{"type": "events.example/hop"}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let offset = out["events"][0]["offset"].as_u64().unwrap();
    wait_for(
        "the copy to reach /c10",
        Duration::from_secs(30),
        async || {
            s.events_once_created(&format!("{P}/c10"))
                .await
                .iter()
                .any(|e| e["type"] == "events.example/hop")
        },
    )
    .await;
    let (status, story) = s.get(&format!("{P}/c0:events/{offset}/trace")).await;
    assert_eq!(status, 200, "{story}");
    assert_eq!(story["truncated"], true, "{story:#}");
    let mut depth = 0;
    let mut step = &story["downstream"][0];
    while step["kind"] == "copy" {
        depth += 1;
        step = &step["caused"][0];
    }
    assert_eq!(depth, 8, "{story:#}");
    // From the far end, the whole chain upstream (the hops are in the copy).
    let last = s.all_events(&format!("{P}/c10")).await;
    let hop = last
        .iter()
        .find(|e| e["type"] == "events.example/hop")
        .unwrap();
    let (status, back) = s
        .get(&format!("{P}/c10:events/{}/trace", hop["offset"]))
        .await;
    assert_eq!(status, 200, "{back}");
    let upstream = back["upstream"].as_array().unwrap();
    assert_eq!(upstream.len(), 10, "{back:#}");
    assert_eq!(upstream[0]["stream"], "/c9");
    assert_eq!(upstream[9]["stream"], "/c0");
}

#[tokio::test]
async fn a_malformed_traceparent_is_ignored_and_without_an_endpoint_a_trace_passes_through() {
    // No endpoint: the caller's context is kept as sent and handed on.
    let receiver = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    let hook = format!("{}/ok/plain", receiver.base);
    let (status, out) = s
        .post(
            &format!("{P}/orders:append"),
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "hook", "filter": {"eventTypes": ["events.example/kept", "events.example/untraced"]},
                    "receiver": {"action": "webhook-post", "url": hook,
                        "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let (status, out) = s
        .post_with_headers(
            &format!("{P}/orders:append"),
            &[("traceparent", &traceparent)],
            json!({"events": [{"type": "events.example/kept"}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out["events"][0]["trace"]["traceparent"],
        traceparent.as_str()
    );
    for bad in [
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        let (status, out) = s
            .post_with_headers(
                &format!("{P}/orders:append"),
                &[("traceparent", bad)],
                json!({"events": [{"type": "events.example/untraced"}]}),
            )
            .await;
        assert_eq!(status, 200, "{bad}: {out}");
        assert!(out["events"][0].get("trace").is_none(), "{bad}: {out}");
    }
    // The webhook subscription posts the traced event with its context.
    wait_for("the webhook posts", Duration::from_secs(20), async || {
        receiver.posts_to("/ok/plain").len() >= 5
    })
    .await;
    let posts = receiver.posts_to("/ok/plain");
    let traced: Vec<_> = posts.iter().filter_map(|p| p.traceparent.clone()).collect();
    assert_eq!(traced, vec![traceparent.clone()], "{posts:?}");
}

#[tokio::test]
async fn an_unreachable_collector_costs_only_dropped_or_failed_spans() {
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let s = Server::start_with(
        Some(&format!(
            "[telemetry]\notlp-endpoint = \"http://127.0.0.1:{closed}\"\nmax-queued-spans = 4\n"
        )),
        &[],
    );
    for i in 0..50 {
        let (status, out) = s
            .post(
                &format!("{P}/orders:append"),
                json!({"events": [{"type": "events.example/n", "payload": {"i": i}}]}),
            )
            .await;
        assert_eq!(status, 200, "{out}");
        // A trace started here: the event carries it.
        assert!(
            out["events"][0]["trace"]["traceparent"].is_string(),
            "{out}"
        );
    }
    let counted = async || {
        s.metric("streamhost_trace_spans_total{outcome=\"dropped\"}")
            .await
            + s.metric("streamhost_trace_spans_total{outcome=\"failed\"}")
                .await
    };
    wait_for(
        "the spans to be counted as dropped or failed",
        Duration::from_secs(30),
        async || counted().await == 50,
    )
    .await;
    assert_eq!(
        s.metric("streamhost_trace_spans_total{outcome=\"exported\"}")
            .await,
        0
    );
}

#[tokio::test]
async fn a_reactor_call_is_a_span_and_its_webhook_carries_the_trace() {
    let collector = Collector::start().await;
    let receiver = Receiver::start().await;
    let s = Server::start_with(Some(&config(&collector.endpoint)), &[]);
    deploy(&s, "welcome", "welcome").await;
    crate::reactors::welcome_reactor(&s, &format!("{P}/users"), "welcome.v1").await;
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let (status, out) = s
        .post_with_headers(
            &format!("{P}/users:append"),
            &[("traceparent", &traceparent)],
            json!({"events": [crate::reactors::sign_up(Some("ada"), &format!("{}/ok/welcome/ada", receiver.base))]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let effect = settled(&s, "welcome:ada", "succeeded").await;
    assert_eq!(
        effect["cause"]["fromOffset"], out["events"][0]["offset"],
        "{effect}"
    );
    wait_for(
        "the reactor's and the effect's spans",
        Duration::from_secs(20),
        async || {
            !collector.named(TRACE_ID, "reactor").is_empty()
                && !collector.named(TRACE_ID, "effect attempt").is_empty()
        },
    )
    .await;
    let reactor = collector.named(TRACE_ID, "reactor")[0].clone();
    let append = collector.named(TRACE_ID, "append")[0].clone();
    assert_eq!(reactor.parent_id, append.span_id, "{reactor:?}");
    // The effect carries the reactor's span on; its webhook POST is a span
    // under its attempt, named by the request's traceparent.
    let attempt = collector.named(TRACE_ID, "effect attempt")[0].clone();
    assert_eq!(attempt.parent_id, reactor.span_id, "{attempt:?}");
    wait_for(
        "the webhook POST's span",
        Duration::from_secs(20),
        async || !collector.named(TRACE_ID, "webhook POST").is_empty(),
    )
    .await;
    let post = collector.named(TRACE_ID, "webhook POST")[0].clone();
    assert_eq!(post.parent_id, attempt.span_id, "{post:?}");
    let posted = receiver.posts_to("/ok/welcome/ada");
    let header = posted[0].traceparent.clone().expect("a traceparent");
    assert_eq!(
        ids(&json!(header)),
        (TRACE_ID.to_string(), post.span_id.clone())
    );
}

#[tokio::test]
async fn a_wake_span_keeps_the_guests_output_bounded_and_a_failed_wake_is_a_failed_span() {
    let collector = Collector::start().await;
    let s = Server::start_with(Some(&config(&collector.endpoint)), &[]);
    deploy(&s, "hostile", "hostile").await;
    wake(&s, &format!("{P}/noisy"), "fold", "hostile").await;
    wake(&s, &format!("{P}/broken"), "fold", "hostile").await;
    let append = async |path: &str, trace_id: &str, event_type: &str| {
        let traceparent = format!("00-{trace_id}-{CALLER_SPAN}-01");
        let (status, out) = s
            .post_with_headers(
                &format!("{P}{path}:append"),
                &[("traceparent", &traceparent)],
                json!({"events": [{"type": event_type, "payload": {}}]}),
            )
            .await;
        assert_eq!(status, 200, "{out}");
    };
    // 40 lines of 2,000 bytes on stderr (80 kB, more than a call's output
    // keeps): the guest does not trap for it, and the span keeps 32 lines,
    // each cut.
    const NOISY: &str = "5bf92f3577b34da6a3ce929d0e0e4737";
    append("/noisy", NOISY, "hostile/chatter").await;
    // A panic: the wake fails, its span says why and shows the panic.
    const BROKEN: &str = "6bf92f3577b34da6a3ce929d0e0e4738";
    append("/broken", BROKEN, "hostile/trap").await;
    wait_for("both wakes' spans", Duration::from_secs(30), async || {
        !collector.named(NOISY, "wake").is_empty() && !collector.named(BROKEN, "wake").is_empty()
    })
    .await;
    let noisy = collector.named(NOISY, "wake").remove(0);
    assert!(!noisy.failed, "{noisy:?}");
    assert_eq!(noisy.events.len(), 32, "{noisy:?}");
    assert!(noisy.dropped_events > 0, "{noisy:?}");
    assert!(
        noisy.events[0].starts_with("stderr: chatter 0: xxx"),
        "{:?}",
        noisy.events[0]
    );
    assert!(
        noisy.events[31].starts_with("stderr: chatter 31: "),
        "{:?}",
        noisy.events[31]
    );
    // "stderr: " and the 1,024 bytes kept of the line, marked as cut.
    assert!(
        noisy
            .events
            .iter()
            .all(|e| e.len() == 8 + 1024 + "…".len() && e.ends_with('…')),
        "{:?}",
        noisy.events.iter().map(String::len).collect::<Vec<_>>()
    );

    let broken = collector.named(BROKEN, "wake");
    // Every failed attempt is a span; each failed, naming the trap.
    assert!(broken.iter().all(|w| w.failed), "{broken:?}");
    let first = &broken[0];
    assert!(
        first.message.contains("the hostile guest traps on purpose"),
        "{first:?}"
    );
    assert!(
        first
            .events
            .iter()
            .any(|e| e.starts_with("stderr: ") && e.contains("the hostile guest traps on purpose")),
        "{first:?}"
    );
}
