//! Bad input: each gets a 4xx whose message names the bad value, nothing is
//! committed, and the server keeps running.

use serde_json::json;

use crate::support::{assert_error, Server};

const S: &str = "/v1/projects/acme/streams/fresh";

/// Asserts that `/fresh` was never created.
async fn nothing_committed(s: &Server) {
    assert_error(
        &s.get(&format!("{S}:state")).await,
        404,
        "stream-not-found",
        "/fresh",
    );
}

#[tokio::test]
async fn bad_bodies_name_the_bad_value() {
    let s = Server::start();
    let append = format!("{S}:append");
    let cases: Vec<(&[u8], &str)> = vec![
        (b"{\"events\": [", "invalid JSON body"),
        (b"", "empty"),
        (b"[1, 2]", "invalid JSON body"),
        (
            br#"{"events": [{"type": "x.y/a",}]}"#,
            "invalid JSON body: trailing comma at line 1 column 30",
        ),
        (br#"{"events": [{"type": "x.y/a"}], "extra": 1}"#, "extra"),
        (br#"{"events": [{"type": "x.y/a", "colour": "red"}]}"#, "colour"),
        (br#"{"events": [{"type": 7}]}"#, "events[0].type"),
        (br#"{"events": [{"type": ""}]}"#, "events[0].type is empty"),
        (br#"{"events": [{"type": "   "}]}"#, "events[0].type is empty"),
        (br#"{"events": [{"type": "a b"}]}"#, "\"a b\""),
        (br#"{"events": [{"type": "x.y/a", "payload": [1]}]}"#, "events[0].payload"),
        (br#"{"events": [{"type": "x.y/a", "payload": "s"}]}"#, "events[0].payload"),
        (br#"{"events": [{"type": "x.y/a", "metadata": 3}]}"#, "events[0].metadata"),
        (br#"{"events": [{"type": "x.y/a", "offset": -1}]}"#, "events[0].offset"),
        (br#"{"events": [{"type": "x.y/a", "offset": 2.5}]}"#, "events[0].offset"),
        (br#"{"events": [{"type": "x.y/a", "offset": "2"}]}"#, "events[0].offset"),
        (br#"{"events": [{"type": "x.y/a", "offset": 0}]}"#, "events[0].offset 0"),
        (br#"{"events": [{"type": "x.y/a", "idempotencyKey": ""}]}"#, "events[0].idempotencyKey"),
        (br#"{"events": [{"type": "x.y/a", "ephemeral": "yes"}]}"#, "events[0].ephemeral"),
        (br#"{"events": []}"#, "events is empty"),
        (br#"{"events": [{"type": "x.y/a"}], "expectedStreamId": 5}"#, "expectedStreamId"),
        (br#"{"events": [{"type": "events.iterate.com/stream/bogus"}]}"#, "events.iterate.com/stream/bogus"),
        (br#"{"events": [{"type": "events.iterate.com/stream/paused", "payload": {"reason": 5}}]}"#, "reason"),
    ];
    for (body, mention) in cases {
        let answer = s.raw("POST", &append, body);
        assert_error(&answer, 400, "invalid-request", mention);
    }
    let too_many: Vec<_> = (0..1001).map(|_| json!({"type": "x.y/a"})).collect();
    assert_error(
        &s.post(&append, json!({"events": too_many})).await,
        413,
        "too-large",
        "1001",
    );
    nothing_committed(&s).await;
}

#[tokio::test]
async fn bad_paths_and_project_names_are_refused() {
    let s = Server::start();
    let body = br#"{"events": [{"type": "x.y/a"}]}"#;
    let long = format!("/v1/projects/acme/streams/{}:append", "a".repeat(512));
    let cases: Vec<(String, u16, &str, &str)> = vec![
        (
            "/v1/projects/acme/streams/a/../../b:append".into(),
            400,
            "invalid-request",
            "/a/../../b",
        ),
        (
            "/v1/projects/acme/streams/a:b/c:append".into(),
            400,
            "invalid-request",
            "\"a:b\"",
        ),
        (
            "/v1/projects/acme/streams/a%20b:append".into(),
            400,
            "invalid-request",
            "a%20b",
        ),
        (long, 400, "invalid-request", "513 bytes"),
        (
            "/v1/projects/Acme/streams/a:append".into(),
            400,
            "invalid-request",
            "\"Acme\"",
        ),
        (
            "/v1/projects/-acme/streams/a:append".into(),
            400,
            "invalid-request",
            "\"-acme\"",
        ),
        (
            format!("/v1/projects/{}/streams/a:append", "a".repeat(64)),
            400,
            "invalid-request",
            "aaaa",
        ),
        (
            "/v1/projects/acme/streams/a".into(),
            400,
            "invalid-request",
            "names no method",
        ),
        (
            "/v1/projects/acme/streams/a:explode".into(),
            404,
            "method-not-found",
            ":explode",
        ),
        (
            "/v1/projects/acme/streams/a:apend".into(),
            404,
            "method-not-found",
            "(did you mean :append?); stream methods: :append, :events",
        ),
        (
            "/v1/projects/acme/nothing".into(),
            404,
            "not-found",
            "/v1/projects/acme/nothing",
        ),
    ];
    for (path, status, code, mention) in cases {
        assert_error(&s.raw("POST", &path, body), status, code, mention);
    }
    assert_error(
        &s.raw("GET", "/v1/projects/acme/streams/a:append", b""),
        405,
        "method-not-allowed",
        ":append",
    );
    // A path of exactly 512 bytes is fine.
    let ok = format!("/v1/projects/acme/streams/{}:append", "a".repeat(511));
    assert_eq!(s.raw("POST", &ok, body).0, 200);
}

#[tokio::test]
async fn bad_queries_name_the_parameter_and_value() {
    let s = Server::start();
    s.post(
        &format!("{S}:append"),
        json!({"events": [{"type": "x.y/a"}]}),
    )
    .await;
    for (query, mention) in [
        ("afterOffset=-1", "\"-1\""),
        ("afterOffset=abc", "\"abc\""),
        ("limit=0", "\"0\""),
        ("limit=501", "\"501\""),
        ("includeEphemeral=maybe", "\"maybe\""),
        ("colour=red", "\"colour\""),
    ] {
        assert_error(
            &s.get(&format!("{S}:events?{query}")).await,
            400,
            "invalid-request",
            mention,
        );
    }
}

#[tokio::test]
async fn huge_bodies_get_413_and_the_server_stays_up() {
    let s = Server::start();
    // Default limit is 8 MiB.
    let huge = vec![b' '; 9 * 1024 * 1024];
    assert_error(
        &s.raw("POST", &format!("{S}:append"), &huge),
        413,
        "too-large",
        "8388608",
    );
    nothing_committed(&s).await;
    assert_eq!(s.get("/healthz").await.0, 200);
}
