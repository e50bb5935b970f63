//! The Durable Streams protocol at `/ds/{project}{path}` against the real
//! binary: a stream written through the protocol is an ordinary stream
//! (a processor folds it, a subscription copies it, what the native API
//! appends is read through the protocol, live readers wake on either), and
//! every bad input gets the protocol's status, never a 500. The protocol's
//! own conformance suite runs against the server in `scripts/test`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::processors::{caught_up, PROC};
use crate::support::{guest, wait_for, Server};

const DS: &str = "/ds/acme/orders/eu";
const NATIVE: &str = "/v1/projects/acme/streams/orders/eu";

/// Status, headers and body of a protocol request.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    #[track_caller]
    fn expect(self, status: u16) -> Answer {
        assert_eq!(self.status, status, "{:?} {}", self.headers, self.text());
        self
    }
}

async fn ds(s: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let r = s.http(method, path, headers, body.to_vec()).await;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.bytes().await.expect("body").to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn a_stream_written_through_the_protocol_is_folded_copied_and_read_natively_and_back() {
    let s = Server::start_with(Some(PROC), &[]);
    for component in ["counter", "clocky"] {
        let (status, out) = s.deploy("acme", component, guest(component)).await;
        assert_eq!(status, 200, "{out}");
    }

    let created = ds(&s, "PUT", DS, &[JSON], b"[]").await.expect(201);
    let start = created.header("stream-next-offset").unwrap().to_string();
    assert_eq!(start.len(), 19, "{start}");

    // The stream is an ordinary stream: a processor, a copy and a reactor
    // subscribe.
    let wake = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "counter",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "counter"], "wake"]}}});
    let copy = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "copy", "filter": {"eventTypes": ["durable-streams/message"]},
            "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/orders/copy",
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}});
    let react = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "seen", "filter": {"eventTypes": ["durable-streams/message"]},
            "receiver": {"action": "reactor", "expression": ["components", ["get", "clocky"], "react"]}}});
    let (status, out) = s
        .post(
            &format!("{NATIVE}:append"),
            json!({"events": [wake, copy, react]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");

    // A live reader waits at the tail (the subscriptions are not data).
    let reader = tokio::spawn(
        reqwest::Client::new()
            .get(format!("{}{DS}?offset={start}&live=long-poll", s.url))
            .send(),
    );

    // A producer's batch, then a retry of it, then a plain message.
    let producer = [JSON, ("producer-id", "p1"), ("producer-epoch", "0")];
    let mut first = producer.to_vec();
    first.push(("producer-seq", "0"));
    let appended = ds(&s, "POST", DS, &first, br#"[{"n": 1}, {"n": 2}]"#)
        .await
        .expect(200);
    assert_eq!(appended.header("producer-seq"), Some("0"));
    ds(&s, "POST", DS, &first, br#"[{"n": 1}, {"n": 2}]"#)
        .await
        .expect(204);
    ds(&s, "POST", DS, &[JSON], br#"{"n": 4}"#)
        .await
        .expect(204);

    let woke = reader.await.unwrap().unwrap();
    assert_eq!(woke.status(), 200);
    let first_batch: Value = woke.json().await.unwrap();
    assert_eq!(first_batch[0], json!({"n": 1}), "{first_batch}");

    // The native API appends too; the protocol reads it as the event.
    let (status, out) = s
        .post(
            &format!("{NATIVE}:append"),
            json!({"events": [{"type": "events.example/adjusted", "payload": {"n": 8}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");

    let read = ds(&s, "GET", &format!("{DS}?offset=-1"), &[], b"")
        .await
        .expect(200);
    assert_eq!(read.header("stream-up-to-date"), Some("true"));
    let messages = read.json();
    let messages = messages.as_array().unwrap();
    assert_eq!(
        &messages[..3],
        &[json!({"n": 1}), json!({"n": 2}), json!({"n": 4})]
    );
    assert_eq!(
        messages[3]["type"], "events.example/adjusted",
        "{messages:?}"
    );
    assert_eq!(messages[3]["payload"], json!({"n": 8}));
    assert_eq!(
        messages.len(),
        4,
        "the retry appended nothing: {messages:?}"
    );

    // The processor folded every message (1 + 2 + 4) and the native event.
    let processor = caught_up(&s, NATIVE, "counter").await;
    assert_eq!(processor["state"]["sum"], 15, "{processor}");

    // The copy has the three messages, as events of its own stream.
    wait_for("three copies", Duration::from_secs(20), async || {
        let events = s.all_events("/v1/projects/acme/streams/orders/copy").await;
        events
            .iter()
            .filter(|e| e["type"] == "durable-streams/message")
            .count()
            == 3
    })
    .await;

    // The reactor ran in each message's append: its effects appended one
    // line per message elsewhere.
    wait_for("three reactions", Duration::from_secs(20), async || {
        let events = s.all_events("/v1/projects/acme/streams/clocky/seen").await;
        events
            .iter()
            .filter(|e| e["type"] == "clocky.example/seen")
            .count()
            == 3
    })
    .await;

    // SSE: from the beginning, then a message appended natively arrives.
    let mut sse = s
        .http("GET", &format!("{DS}?offset=-1&live=sse"), &[], Vec::new())
        .await;
    assert_eq!(sse.status(), 200);
    assert_eq!(
        sse.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut seen = String::new();
    let caught_up_at = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("\"upToDate\":true") {
        let chunk = tokio::time::timeout_at(caught_up_at, sse.chunk())
            .await
            .expect("the catch-up within 10 s")
            .unwrap()
            .expect("more of the SSE body");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        seen.contains("event: data\ndata:[{\"n\":1},{\"n\":2},{\"n\":4}"),
        "{seen}"
    );
    let (status, out) = s
        .post(
            &format!("{NATIVE}:append"),
            json!({"events": [{"type": "durable-streams/message", "payload": {"n": 16}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let live_at = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("{\"n\":16}") {
        let chunk = tokio::time::timeout_at(live_at, sse.chunk())
            .await
            .expect("the live message within 10 s")
            .unwrap()
            .expect("more of the SSE body");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }

    // Closed: appends are refused, readers at the end are told.
    let closed = ds(&s, "POST", DS, &[("stream-closed", "true")], b"")
        .await
        .expect(204);
    assert_eq!(closed.header("stream-closed"), Some("true"));
    let refused = ds(&s, "POST", DS, &[JSON], br#"{"n": 32}"#)
        .await
        .expect(409);
    assert_eq!(refused.header("stream-closed"), Some("true"));
    let tail = ds(&s, "GET", &format!("{DS}?offset=now"), &[], b"")
        .await
        .expect(200);
    assert_eq!(tail.header("stream-closed"), Some("true"));
    assert_eq!(tail.text(), "[]");
}

#[tokio::test]
async fn bytes_keep_their_content_type_and_survive_a_restart() {
    let mut s = Server::start();
    let path = "/ds/acme/blobs/one";
    let octets = ("content-type", "application/octet-stream");
    let bytes: Vec<u8> = (0..=255u8).chain([0, 13, 10, 255]).collect();
    ds(&s, "PUT", path, &[octets], &bytes).await.expect(201);
    ds(&s, "POST", path, &[octets], b"\xfftail")
        .await
        .expect(204);
    s.restart();
    let read = ds(&s, "GET", path, &[], b"").await.expect(200);
    assert_eq!(
        read.header("content-type"),
        Some("application/octet-stream")
    );
    let mut expected = bytes.clone();
    expected.extend_from_slice(b"\xfftail");
    assert_eq!(read.body, expected);
    // Natively: one event per append, the bytes in base64.
    let events = s.all_events("/v1/projects/acme/streams/blobs/one").await;
    let messages: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "durable-streams/message")
        .collect();
    assert_eq!(messages.len(), 2, "{events:?}");
    assert!(messages[0]["payload"]["base64"].is_string(), "{events:?}");
    // SSE of bytes is base64.
    let mut sse = s
        .http(
            "GET",
            &format!("{path}?offset=-1&live=sse"),
            &[],
            Vec::new(),
        )
        .await;
    assert_eq!(sse.headers()["stream-sse-data-encoding"], "base64");
    let chunk = tokio::time::timeout(Duration::from_secs(10), sse.chunk())
        .await
        .expect("the first SSE event within 10 s")
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&chunk).starts_with("event: data\ndata:AAEC"),
        "{chunk:?}"
    );
}

#[tokio::test]
async fn bad_input_gets_the_protocols_status_never_a_500() {
    let s = Server::start();
    let path = "/ds/acme/bad";
    let text = ("content-type", "text/plain");
    ds(&s, "PUT", path, &[text], b"first").await.expect(201);
    // The same configuration again is fine; another is a conflict.
    ds(&s, "PUT", path, &[text], b"").await.expect(200);
    ds(&s, "PUT", path, &[JSON], b"").await.expect(409);

    // Offsets that are not ours, given twice, or empty.
    for bad in [
        "abc",
        "42",
        "0000000000000000_0000000000000000",
        "-2",
        "99999999999999999999",
    ] {
        let a = ds(&s, "GET", &format!("{path}?offset={bad}"), &[], b"")
            .await
            .expect(400);
        assert!(a.text().contains(bad), "{}", a.text());
    }
    ds(&s, "GET", &format!("{path}?offset=-1&offset=-1"), &[], b"")
        .await
        .expect(400);
    ds(&s, "GET", &format!("{path}?offset="), &[], b"")
        .await
        .expect(400);
    ds(&s, "GET", &format!("{path}?live=long-poll"), &[], b"")
        .await
        .expect(400);
    ds(
        &s,
        "GET",
        &format!("{path}?offset=-1&live=forever"),
        &[],
        b"",
    )
    .await
    .expect(400);

    // Appends: another content type, no content type, an empty body.
    ds(&s, "POST", path, &[JSON], b"{}").await.expect(409);
    ds(&s, "POST", path, &[], b"x").await.expect(400);
    ds(&s, "POST", path, &[text], b"").await.expect(400);

    // JSON mode: invalid JSON, an empty batch.
    let json_path = "/ds/acme/bad-json";
    ds(&s, "PUT", json_path, &[JSON], b"").await.expect(201);
    ds(&s, "POST", json_path, &[JSON], b"{nope")
        .await
        .expect(400);
    ds(&s, "POST", json_path, &[JSON], b"[]").await.expect(400);

    // Producers: out of order, a zombie epoch, a new epoch not at 0, a
    // partial set of headers, values that are not plain integers.
    let p = |epoch: &'static str, seq: &'static str| {
        [
            text,
            ("producer-id", "p"),
            ("producer-epoch", epoch),
            ("producer-seq", seq),
        ]
    };
    let gap = ds(&s, "POST", path, &p("0", "3"), b"x").await.expect(409);
    assert_eq!(gap.header("producer-expected-seq"), Some("0"));
    assert_eq!(gap.header("producer-received-seq"), Some("3"));
    ds(&s, "POST", path, &p("0", "0"), b"x").await.expect(200);
    ds(&s, "POST", path, &p("2", "0"), b"y").await.expect(200);
    let zombie = ds(&s, "POST", path, &p("1", "1"), b"z").await.expect(403);
    assert_eq!(zombie.header("producer-epoch"), Some("2"));
    ds(&s, "POST", path, &p("3", "1"), b"z").await.expect(400);
    ds(&s, "POST", path, &[text, ("producer-id", "p")], b"z")
        .await
        .expect(400);
    ds(&s, "POST", path, &p("01", "0"), b"z").await.expect(400);
    ds(&s, "POST", path, &p("0", "1e3"), b"z").await.expect(400);
    // Stream-Seq must rise (byte order).
    ds(&s, "POST", path, &[text, ("stream-seq", "2")], b"a")
        .await
        .expect(204);
    ds(&s, "POST", path, &[text, ("stream-seq", "10")], b"b")
        .await
        .expect(409);

    // Lifetimes: both at once, a TTL that is not a plain integer, a bad time.
    for headers in [
        vec![
            text,
            ("stream-ttl", "60"),
            ("stream-expires-at", "2030-01-01T00:00:00Z"),
        ],
        vec![text, ("stream-ttl", "+60")],
        vec![text, ("stream-ttl", "6e1")],
        vec![text, ("stream-expires-at", "tomorrow")],
    ] {
        ds(&s, "PUT", "/ds/acme/lifetimes", &headers, b"")
            .await
            .expect(400);
    }

    // Closed: a close then an append.
    ds(&s, "POST", path, &[("stream-closed", "true")], b"")
        .await
        .expect(204);
    ds(&s, "POST", path, &[text], b"late").await.expect(409);

    // Missing streams, a bad project, a method the protocol has not.
    ds(&s, "GET", "/ds/acme/none", &[], b"").await.expect(404);
    ds(&s, "HEAD", "/ds/acme/none", &[], b"").await.expect(404);
    ds(&s, "POST", "/ds/acme/none", &[text], b"x")
        .await
        .expect(404);
    ds(&s, "DELETE", "/ds/acme/none", &[], b"")
        .await
        .expect(404);
    ds(&s, "GET", "/ds/Not%20A%20Project/x", &[], b"")
        .await
        .expect(400);
    ds(&s, "PATCH", path, &[], b"").await.expect(405);

    // The protocol's own events cannot be forged through the native API.
    let (status, out) = s
        .post(
            "/v1/projects/acme/streams/bad:append",
            json!({"events": [{"type": "events.iterate.com/stream/durable-stream-closed"}]}),
        )
        .await;
    assert_eq!(status, 403, "{out}");

    // Nothing above was a 500, and the stream still reads.
    let read = ds(&s, "GET", path, &[], b"").await.expect(200);
    assert_eq!(read.text(), "firstxya");

    // A body over the limit (last: the server closes that connection
    // without reading the rest of the body).
    let huge = vec![b'x'; 9 * 1024 * 1024];
    ds(&s, "POST", "/ds/acme/bad-json", &[JSON], &huge)
        .await
        .expect(413);
}

/// One project token of each scope, and another project's.
const TOKENS: &str = r#"
[[tokens]]
token = "t-acme"
projects = ["acme"]

[[tokens]]
token = "t-producer"
projects = ["acme"]
scope = "append"

[[tokens]]
token = "t-other"
projects = ["other"]
"#;

#[tokio::test]
async fn tokens_and_projects_hold_as_everywhere() {
    let s = Server::start_with(Some(TOKENS), &[]);
    let as_ = |t: &'static str| ("authorization", t);
    let text = ("content-type", "text/plain");
    ds(&s, "PUT", "/ds/acme/t", &[text], b"").await.expect(401);
    ds(&s, "PUT", "/ds/acme/t", &[text, as_("Bearer t-other")], b"")
        .await
        .expect(403);
    // Creating and deleting configure a stream; appending does not.
    ds(
        &s,
        "PUT",
        "/ds/acme/t",
        &[text, as_("Bearer t-producer")],
        b"",
    )
    .await
    .expect(403);
    ds(&s, "PUT", "/ds/acme/t", &[text, as_("Bearer t-acme")], b"")
        .await
        .expect(201);
    ds(
        &s,
        "POST",
        "/ds/acme/t",
        &[text, as_("Bearer t-producer")],
        b"hi",
    )
    .await
    .expect(204);
    ds(&s, "GET", "/ds/acme/t", &[as_("Bearer t-other")], b"")
        .await
        .expect(403);
    let read = ds(&s, "GET", "/ds/acme/t", &[as_("Bearer t-producer")], b"")
        .await
        .expect(200);
    assert_eq!(read.text(), "hi");
    ds(&s, "DELETE", "/ds/acme/t", &[as_("Bearer t-producer")], b"")
        .await
        .expect(403);
    ds(&s, "DELETE", "/ds/acme/t", &[as_("Bearer t-acme")], b"")
        .await
        .expect(204);
    ds(&s, "GET", "/ds/acme/t", &[as_("Bearer t-acme")], b"")
        .await
        .expect(404);
}

/// The protocol's public conformance suite (`tests/durable-streams`: npm's
/// `@durable-streams/server-conformance-tests`, pinned) against this
/// server: every test it runs passes (332 of 338; it skips 6 itself).
#[tokio::test]
async fn the_protocols_own_conformance_suite_passes() {
    if crate::support::skipped_on_postgres("the suite speaks HTTP only; the protocol's storage is the stream's, tested on both engines above") {
        return;
    }
    let s = Server::start_with(Some("[http]\nlong-poll-ms = 1500\n"), &[]);
    let suite = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/durable-streams");
    let vitest = suite.join("node_modules/.bin/vitest");
    assert!(
        vitest.exists(),
        "the conformance suite is not installed: npm ci --prefix tests/durable-streams (scripts/test does)"
    );
    let report = tempfile::tempdir().unwrap();
    let report_file = report.path().join("report.json");
    let url = format!("{}/ds/acme", s.url);
    let (out, report_file) = tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(&vitest)
            .current_dir(&suite)
            .args([
                "run",
                "conformance.test.mjs",
                "--reporter=json",
                "--outputFile",
            ])
            .arg(&report_file)
            .env("CONFORMANCE_TEST_URL", url)
            .output()
            .expect("running vitest");
        (out, report_file)
    })
    .await
    .unwrap();
    let report: Value = serde_json::from_slice(&std::fs::read(&report_file).unwrap_or_else(|e| {
        panic!(
            "no report from the suite ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }))
    .unwrap();
    let mut passed = 0;
    let mut failed = Vec::new();
    for file in report["testResults"].as_array().unwrap() {
        for t in file["assertionResults"].as_array().unwrap() {
            match t["status"].as_str() {
                Some("passed") => passed += 1,
                Some("failed") => failed.push((
                    t["fullName"].as_str().unwrap_or("").to_string(),
                    t["failureMessages"][0]
                        .as_str()
                        .unwrap_or("")
                        .chars()
                        .take(300)
                        .collect::<String>(),
                )),
                _ => {}
            }
        }
    }
    eprintln!(
        "the conformance suite: {passed} passed, {} failed (forks)",
        failed.len()
    );
    let not_forks: Vec<_> = failed
        .iter()
        .filter(|(name, _)| !name.starts_with("Fork - "))
        .collect();
    assert!(not_forks.is_empty(), "{not_forks:#?}");
    assert!(passed >= 275, "{passed} passed");
}

/// Several hosts (PostgreSQL): a stream one host owns is created, written
/// by a producer, read, long-polled and closed through the other, whose
/// requests its owner serves.
#[tokio::test]
async fn any_host_serves_the_protocol_through_the_streams_owner() {
    if crate::cluster::on_sqlite() {
        return;
    }
    let config = "[cluster]\nlease-ms = 1500\n[http]\nlong-poll-ms = 5000\n";
    let a = Server::start_with(Some(config), &[]);
    let b = Server::joining(&a, Some(config));
    let path = "/ds/acme/shared";
    // A creates it: A owns it.
    ds(&a, "PUT", path, &[JSON], b"[]").await.expect(201);
    let tail = ds(&b, "HEAD", path, &[], b"")
        .await
        .expect(200)
        .header("stream-next-offset")
        .unwrap()
        .to_string();
    // A long-poll through B waits on A's stream while B writes to it.
    let waiting = tokio::spawn(
        reqwest::Client::new()
            .get(format!("{}{path}?offset={tail}&live=long-poll", b.url))
            .send(),
    );
    let p = |seq: &'static str| {
        [
            JSON,
            ("producer-id", "p"),
            ("producer-epoch", "0"),
            ("producer-seq", seq),
        ]
    };
    ds(&b, "POST", path, &p("0"), br#"{"n": 1}"#)
        .await
        .expect(200);
    ds(&b, "POST", path, &p("0"), br#"{"n": 1}"#)
        .await
        .expect(204);
    ds(&b, "POST", path, &p("2"), br#"{"n": 3}"#)
        .await
        .expect(409);
    ds(&b, "POST", path, &p("1"), br#"{"n": 2}"#)
        .await
        .expect(200);
    let woke = waiting.await.unwrap().unwrap();
    assert_eq!(woke.status(), 200);
    assert_eq!(woke.json::<Value>().await.unwrap()[0], json!({"n": 1}));
    for host in [&a, &b] {
        let read = ds(host, "GET", path, &[], b"").await.expect(200);
        assert_eq!(read.json(), json!([{"n": 1}, {"n": 2}]));
    }
    ds(&b, "POST", path, &[("stream-closed", "true")], b"")
        .await
        .expect(204);
    let refused = ds(&a, "POST", path, &[JSON], b"{}").await.expect(409);
    assert_eq!(refused.header("stream-closed"), Some("true"));
    // Only A holds the stream.
    let (_, [a_row, b_row]) = crate::cluster::cluster_rows(&b, [&a.url, &b.url]).await;
    assert_eq!(
        (a_row["streams"].as_u64(), b_row["streams"].as_u64()),
        (Some(1), Some(0))
    );
}

/// A fork reads its source up to the fork offset (and the part of the
/// next message its sub-offset takes), then its own appends; a source
/// deleted while a fork reads it is gone for its own readers only, until
/// the fork is deleted too.
#[tokio::test]
async fn a_fork_reads_its_source_up_to_the_fork_then_its_own_and_outlives_a_deleted_source() {
    let s = Server::start();
    let source = "/ds/acme/chat/main";
    let fork = "/ds/acme/chat/branch";
    ds(&s, "PUT", source, &[JSON], br#"[{"m": 1}, {"m": 2}]"#)
        .await
        .expect(201);
    let at = ds(
        &s,
        "POST",
        source,
        &[JSON],
        br#"[{"m": 3}, {"m": 4}, {"m": 5}]"#,
    )
    .await
    .expect(204);
    let source_tail = at.header("stream-next-offset").unwrap().to_string();
    // The offset after {"m": 2}: the second message of the first read.
    let first = ds(&s, "GET", &format!("{source}?offset=-1"), &[], b"")
        .await
        .expect(200);
    assert_eq!(first.json().as_array().unwrap().len(), 5);
    let head = ds(&s, "HEAD", source, &[], b"").await.expect(200);
    assert_eq!(
        head.header("stream-next-offset"),
        Some(source_tail.as_str())
    );
    // Fork after {"m": 2}, taking {"m": 3} of the next batch of three.
    let two: u64 = source_tail.parse::<u64>().unwrap() - 3;
    let fork_at = format!("{two:019}");
    let created = ds(
        &s,
        "PUT",
        fork,
        &[
            ("stream-forked-from", "/chat/main"),
            ("stream-fork-offset", &fork_at),
            ("stream-fork-sub-offset", "1"),
        ],
        b"",
    )
    .await
    .expect(201);
    assert_eq!(
        created.header("content-type"),
        Some("application/json"),
        "inherited"
    );
    // A sub-offset past the batch is refused.
    ds(
        &s,
        "PUT",
        "/ds/acme/chat/too-far",
        &[
            ("stream-forked-from", "/chat/main"),
            ("stream-fork-offset", &fork_at),
            ("stream-fork-sub-offset", "4"),
        ],
        b"",
    )
    .await
    .expect(400);
    ds(&s, "POST", fork, &[JSON], br#"{"m": "own"}"#)
        .await
        .expect(204);
    ds(&s, "POST", source, &[JSON], br#"{"m": 6}"#)
        .await
        .expect(204);
    let read = ds(&s, "GET", &format!("{fork}?offset=-1"), &[], b"")
        .await
        .expect(200);
    assert_eq!(
        read.json(),
        json!([{"m": 1}, {"m": 2}, {"m": 3}, {"m": "own"}])
    );
    // Reading the fork from the fork offset: only what is its own.
    let own = ds(&s, "GET", &format!("{fork}?offset={fork_at}"), &[], b"")
        .await
        .expect(200);
    assert_eq!(own.json(), json!([{"m": 3}, {"m": "own"}]));
    let fork_next = own.header("stream-next-offset").unwrap().to_string();
    assert!(fork_next > fork_at, "{fork_next} after {fork_at}");

    // The source deleted: gone for its readers (410), its path taken (409),
    // the fork still reads what it inherited.
    ds(&s, "DELETE", source, &[], b"").await.expect(204);
    ds(&s, "GET", source, &[], b"").await.expect(410);
    ds(&s, "POST", source, &[JSON], b"{}").await.expect(410);
    ds(&s, "PUT", source, &[JSON], b"").await.expect(409);
    let read = ds(&s, "GET", &format!("{fork}?offset=-1"), &[], b"")
        .await
        .expect(200);
    assert_eq!(read.json().as_array().unwrap().len(), 4);
    // The fork deleted: the source goes for good; its path is free again.
    ds(&s, "DELETE", fork, &[], b"").await.expect(204);
    ds(&s, "GET", source, &[], b"").await.expect(404);
    ds(&s, "PUT", source, &[JSON], b"[]").await.expect(201);
    let fresh = ds(&s, "GET", source, &[], b"").await.expect(200);
    assert_eq!(fresh.json(), json!([]));
}

/// A producer's request sent twice at once, by several producers at once
/// on one stream: each request is appended exactly once, in each
/// producer's order, and the copy of it is answered as a duplicate.
#[tokio::test]
async fn a_producers_request_sent_twice_at_once_is_appended_once() {
    let s = Server::start();
    let path = "/ds/acme/race";
    ds(&s, "PUT", path, &[JSON], b"[]").await.expect(201);
    let producers = ["p0", "p1", "p2", "p3"];
    let requests = 25u64;
    let runs = producers.map(|p| {
        let url = format!("{}{path}", s.url);
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut statuses = Vec::new();
            for seq in 0..requests {
                let send = || {
                    client
                        .post(&url)
                        .header("content-type", "application/json")
                        .header("producer-id", p)
                        .header("producer-epoch", "0")
                        .header("producer-seq", seq.to_string())
                        .body(format!(r#"{{"p": "{p}", "seq": {seq}}}"#))
                        .send()
                };
                let (a, b) = tokio::join!(send(), send());
                let mut pair = [a.unwrap().status().as_u16(), b.unwrap().status().as_u16()];
                pair.sort();
                statuses.push(pair);
            }
            statuses
        })
    });
    for run in runs {
        for pair in run.await.unwrap() {
            assert_eq!(pair, [200, 204], "one append and one duplicate");
        }
    }
    let read = ds(&s, "GET", path, &[], b"").await.expect(200);
    let messages = read.json();
    let messages = messages.as_array().unwrap();
    assert_eq!(messages.len(), producers.len() * requests as usize);
    for p in producers {
        let seqs: Vec<u64> = messages
            .iter()
            .filter(|m| m["p"] == p)
            .map(|m| m["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (0..requests).collect::<Vec<_>>(), "{p}");
    }
}
