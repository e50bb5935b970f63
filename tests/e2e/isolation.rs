//! Isolation between projects: one project's expressions, connections and
//! traffic can never slow, starve or fill up another's. Each probe runs
//! against the real binary.

use std::time::Duration;

use serde_json::{json, Value};

use crate::subscriptions::{data, subscribe, wait_count, P};
use crate::support::{assert_error, Server, SseClient};

/// Retries that would take minutes: a halt within seconds is a halt at once.
const SLOW_RETRIES: &str = r#"
[delivery]
max-attempts = 15
backoff-base-ms = 5000
backoff-max-ms = 60000
timeout-ms = 5000
"#;

fn ev(t: &str, payload: Value) -> Value {
    json!({"events": [{"type": t, "payload": payload}]})
}

#[tokio::test]
async fn a_wait_whose_condition_exceeds_a_bound_is_refused_naming_it() {
    let s = Server::start();
    s.post(&format!("{P}/evil:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    for (condition, bound) in [
        ("$count([1..9999999]) > 0", "jsonata-max-bytes"),
        ("$length($pad('', 300000000)) > 0", "jsonata-max-bytes"),
        (
            "($f := function($n) { $f($n + 1) }; $f(0)) > 0",
            "jsonata-timeout-ms",
        ),
        // Quadratic inside one built-in: bounded in time there too.
        ("$count($distinct([1..30000])) = 0", "jsonata-timeout-ms"),
    ] {
        let answer = s
            .post(
                &format!("{P}/evil:waitForEvent"),
                json!({"jsonataCondition": condition, "timeoutMs": 5000}),
            )
            .await;
        assert_error(&answer, 422, "jsonata-limit-exceeded", bound);
    }
    // One that exceeds a bound only on some event is refused when it meets it.
    let waiting = {
        let url = format!("{}{P}/evil:waitForEvent", s.url);
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&json!({"jsonataCondition": "$length($pad('', payload.n)) > 0", "timeoutMs": 20000}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    crate::support::wait_for(
        "the wait's connection",
        Duration::from_secs(10),
        async || {
            let (_, st) = s.get(&format!("{P}/evil:runtime")).await;
            st["connections"].as_object().is_some_and(|c| !c.is_empty())
        },
    )
    .await;
    s.post(
        &format!("{P}/evil:append"),
        ev("x.y/a", json!({"n": 300000000})),
    )
    .await;
    let answer = waiting.await.unwrap();
    assert_error(&answer, 422, "jsonata-limit-exceeded", "$pad");
}

#[tokio::test]
async fn a_connection_whose_condition_exceeds_a_bound_is_refused_before_it_streams() {
    let s = Server::start();
    s.post(&format!("{P}/evil:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    let condition = "$length($pad('', 300000000)) > 0";
    let path = format!(
        "{P}/evil:connect?jsonataCondition={}",
        form_urlencoded::byte_serialize(condition.as_bytes()).collect::<String>()
    );
    let refused = SseClient::open(&s, &path).await.err().expect("refused");
    assert_error(&refused, 422, "jsonata-limit-exceeded", "jsonata-max-bytes");
    // A condition that is fine streams.
    let ok = format!(
        "{P}/evil:connect?jsonataCondition={}",
        form_urlencoded::byte_serialize(b"payload.n > 1").collect::<String>()
    );
    assert!(SseClient::open(&s, &ok).await.is_ok());
}

/// The subscription `key` on `/src` halted at its first attempt, naming `mention`.
async fn halted_at_once(s: &Server, key: &str, mention: &str) -> Value {
    let halted = s
        .wait_halted(&format!("{P}/src"), key, Duration::from_secs(20))
        .await;
    assert_eq!(halted["attempts"], 1, "{halted}");
    let error = halted["error"].as_str().unwrap_or_default();
    assert!(error.contains(mention), "{halted}");
    halted
}

#[tokio::test]
async fn a_subscription_filter_that_exceeds_a_bound_halts_at_once() {
    let s = Server::start_with(Some(SLOW_RETRIES), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "evil",
               "filter": {"jsonataCondition": "$count([1..9999999]) > 0"}}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    halted_at_once(&s, "evil", "jsonata-max-bytes").await;
    assert!(data(&s, "/dst").await.is_empty());
}

#[tokio::test]
async fn a_copy_transform_that_builds_a_huge_value_halts_at_once_and_stores_nothing() {
    let s = Server::start_with(Some(SLOW_RETRIES), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "huge",
               "jsonataTransform": "{\"payload\": {\"x\": $pad(\"\", 5000000)}}"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    halted_at_once(&s, "huge", "jsonata-max-bytes").await;
    assert!(data(&s, "/dst").await.is_empty());
    // Parts shared inside the result count as written out.
    subscribe(
        &s,
        "/dst2",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "shared",
               "jsonataTransform": "($x := $pad('', 600000); {\"payload\": {\"a\": $x, \"b\": $x}})"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/b", json!({})))
        .await;
    halted_at_once(&s, "shared", "jsonata-max-bytes").await;
    assert!(data(&s, "/dst2").await.is_empty());
}

#[tokio::test]
async fn a_copied_event_over_the_append_limit_halts_at_once() {
    let config = format!("max-body-bytes = 4096\n{SLOW_RETRIES}");
    let s = Server::start_with(Some(&config), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "big",
               "jsonataTransform": "{\"payload\": {\"x\": $pad(\"\", 5000)}}"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    halted_at_once(&s, "big", "4096-byte append limit").await;
    assert!(data(&s, "/dst").await.is_empty());
    // A transform within the limit copies.
    subscribe(
        &s,
        "/ok",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "small",
               "jsonataTransform": "{\"payload\": {\"x\": $pad(\"\", 100)}}"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/b", json!({})))
        .await;
    wait_count(&s, "/ok", 1).await;
}

#[tokio::test]
async fn a_caller_cannot_pre_claim_the_key_of_a_copy_or_an_effect() {
    let s = Server::start();
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    let (_, st) = s.get(&format!("{P}/src:state")).await;
    let stream_id = st["streamId"].as_str().unwrap().to_string();
    // Keys of the shapes a copy, an effect and a resume use.
    for key in [
        format!("copy:acme:/src:{stream_id}:0:k:3"),
        "effect:effector:/orders:a".to_string(),
        "auto-resume:k:x:1".to_string(),
    ] {
        let answer = s
            .post(
                &format!("{P}/dst:append"),
                json!({"events": [{"type": "x.y/fake", "idempotencyKey": key}]}),
            )
            .await;
        assert_error(&answer, 400, "invalid-request", &key);
    }
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    let copies = wait_count(&s, "/dst", 1).await;
    assert!(copies[0]["source"]["copiedFrom"].is_array(), "{copies:?}");
    assert_eq!(copies[0]["type"], "x.y/a");
}

#[tokio::test]
async fn offsets_past_i64_and_nul_bytes_are_refused_naming_the_field_on_every_backend() {
    let s = Server::start();
    s.post(&format!("{P}/a:append"), ev("x.y/a", json!({})))
        .await;
    for over in ["9223372036854775808", "18446744073709551615"] {
        let answer = s.get(&format!("{P}/a:events?afterOffset={over}")).await;
        assert_error(&answer, 400, "invalid-request", "afterOffset");
        let answer = s
            .get(&format!("/v1/projects/acme/effects?afterId={over}"))
            .await;
        assert_error(&answer, 400, "invalid-request", "afterId");
        let answer = s
            .get(&format!("{P}/a:connect?replayAfterOffset={over}"))
            .await;
        assert_error(&answer, 400, "invalid-request", "replayAfterOffset");
        let big: u64 = over.parse().unwrap();
        let answer = s
            .post(
                &format!("{P}/a:waitForEvent"),
                json!({"afterOffset": big, "timeoutMs": 100}),
            )
            .await;
        assert_error(&answer, 400, "invalid-request", "afterOffset");
        let answer = s
            .post(
                &format!("{P}/a:append"),
                json!({"events": [{"type": "x.y/a", "offset": big}]}),
            )
            .await;
        assert_error(&answer, 400, "invalid-request", "events[0].offset");
    }
    // The largest offset itself is a valid (empty) read.
    let (status, page) = s
        .get(&format!("{P}/a:events?afterOffset=9223372036854775807"))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"], json!([]));

    let answer = s
        .post(
            &format!("{P}/a:append"),
            json!({"events": [{"type": "x.y/a", "idempotencyKey": "a\u{0}b"}]}),
        )
        .await;
    assert_error(&answer, 400, "invalid-request", "idempotencyKey");
    let answer = s
        .post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/a", "subscriptionKey": "k\u{0}x"}),
        )
        .await;
    assert_error(&answer, 400, "invalid-request", "subscriptionKey");
    let answer = s.get("/v1/projects/acme/effects?component=a%00b").await;
    assert_error(&answer, 400, "invalid-request", "component");
    // NUL inside a payload is data: stored and served back on both backends.
    let (status, out) = s
        .post(
            &format!("{P}/a:append"),
            ev("x.y/a", json!({"s": "a\u{0}b"})),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["events"][0]["payload"]["s"], "a\u{0}b");
    let events = s.all_events(&format!("{P}/a")).await;
    assert!(events.iter().any(|e| e["payload"]["s"] == "a\u{0}b"));
}

/// A loopback receiver that answers every POST `500` with a 1 MiB body;
/// returns its URL.
async fn loud_receiver() -> String {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "x".repeat(1024 * 1024),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// How many of `stream`'s subscription runs wait for a place; none has
/// failed an attempt (waiting, or a POST hanging, is no failure).
async fn waiting_for_place(s: &Server, stream: &str) -> usize {
    let (status, rt) = s.get(&format!("{stream}:runtime")).await;
    assert_eq!(status, 200, "{rt}");
    let runs = rt["subscriptions"].as_object().cloned().unwrap_or_default();
    for (key, run) in &runs {
        assert_eq!(
            run["attempt"], 0,
            "{key}: waiting or hanging is no failure: {run}"
        );
        assert!(run["lastError"].is_null(), "{key}: {run}");
    }
    runs.values()
        .filter(|run| run["waitingForPlace"] == true)
        .count()
}

fn webhook_subscription(key: &str, url: &str) -> Value {
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": key,
            "receiver": {"action": "webhook-post", "url": url,
                "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]})
}

#[tokio::test]
async fn open_mode_refuses_cross_site_requests() {
    let s = Server::start();
    let client = reqwest::Client::new();
    let url = format!("{}{P}/a:append", s.url);
    let body = r#"{"events": [{"type": "x.y/a"}]}"#;
    let send = async |origin: Option<&str>, content_type: &str| {
        let mut r = client
            .post(&url)
            .header("content-type", content_type)
            .body(body);
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        let r = r.send().await.unwrap();
        (
            r.status().as_u16(),
            r.json::<Value>().await.unwrap_or(Value::Null),
        )
    };
    let foreign = send(Some("https://evil.example"), "application/json").await;
    assert_error(&foreign, 403, "cross-origin", "https://evil.example");
    // What a form on any page can send without a preflight.
    let plain = send(None, "text/plain").await;
    assert_error(&plain, 415, "unsupported-media-type", "text/plain");
    let own = s.url.clone();
    assert_eq!(send(Some(&own), "application/json").await.0, 200);
    assert_eq!(send(None, "application/json; charset=utf-8").await.0, 200);
    // DNS rebinding: a page at evil.example, its name pointed at this
    // server, sends its own name as Host and as Origin.
    let port = s.url.rsplit(':').next().unwrap().to_string();
    let rebound = format!("evil.example:{port}");
    let r = client
        .post(&url)
        .header("host", &rebound)
        .header("origin", format!("http://{rebound}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let answer = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_error(&answer, 403, "host-not-allowed", &rebound);
    // Loopback names pass.
    let local = client
        .get(format!("{}/healthz", s.url))
        .header("host", format!("localhost:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(local.status().as_u16(), 200);
    // Nothing the refused requests sent was appended.
    let events = s.all_events(&format!("{P}/a")).await;
    assert_eq!(events.iter().filter(|e| e["type"] == "x.y/a").count(), 2);
}

#[tokio::test]
async fn open_mode_serves_a_host_name_listed_in_allowed_hosts() {
    let s = Server::start_with(
        Some("[http]\nallowed-hosts = [\"streams.example.org\"]\n"),
        &[],
    );
    let port = s.url.rsplit(':').next().unwrap().to_string();
    let get = async |host: &str| {
        reqwest::Client::new()
            .get(format!("{}/healthz", s.url))
            .header("host", host)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(get(&format!("streams.example.org:{port}")).await, 200);
    assert_eq!(get(&format!("other.example.org:{port}")).await, 403);
}

#[tokio::test]
async fn with_tokens_webhooks_cannot_reach_private_networks_and_a_refusal_is_final() {
    let url = loud_receiver().await;
    let port = url.split(':').nth(2).unwrap().split('/').next().unwrap();
    let config = format!("{}\n{SLOW_RETRIES}", crate::support::TOKENS);
    let mut s = Server::start_with(Some(&config), &[]);
    s.token = Some("t-admin".into());
    for (key, target) in [
        ("loopback", url.clone()),
        ("nat64", format!("http://[64:ff9b::7f00:1]:{port}/hook")),
        ("sixtofour", format!("http://[2002:a00:1::1]:{port}/hook")),
    ] {
        let (status, out) = s
            .post(
                &format!("{P}/src:append"),
                webhook_subscription(key, &target),
            )
            .await;
        assert_eq!(status, 200, "{out}");
    }
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    for (key, named) in [
        ("loopback", "a loopback address"),
        ("nat64", "a loopback address"),
        ("sixtofour", "a private address"),
    ] {
        let halted = halted_at_once(&s, key, "deny-private-networks").await;
        assert!(
            halted["error"].as_str().unwrap().contains(named),
            "{halted}"
        );
    }
}

#[tokio::test]
async fn a_failing_receivers_body_is_quoted_up_to_200_bytes() {
    let url = loud_receiver().await;
    let s = Server::start_with(Some(SLOW_RETRIES), &[]);
    s.post(
        &format!("{P}/src:append"),
        webhook_subscription("loud", &url),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    let mut error = String::new();
    crate::support::wait_for("the first failure", Duration::from_secs(20), async || {
        let (_, rt) = s.get(&format!("{P}/src:runtime")).await;
        error = rt["subscriptions"]["loud"]["lastError"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        !error.is_empty()
    })
    .await;
    assert!(error.contains("webhook responded 500"), "{error}");
    let quoted = error.matches('x').count();
    assert!(
        (190..=200).contains(&quoted),
        "{quoted} bytes quoted: {error}"
    );
}

#[tokio::test]
async fn an_effects_webhook_to_a_refused_address_fails_at_once() {
    let url = loud_receiver().await;
    let config = format!("{}\n{}", crate::support::TOKENS, crate::effects::EFFECTS);
    let mut s = Server::start_with(Some(&config), &[]);
    s.token = Some("t-admin".into());
    let src = format!("{P}/orders");
    crate::effects::effector_on(&s, &src).await;
    crate::effects::request(
        &s,
        &src,
        json!([{"key": "private", "webhook": {"url": url, "body": {}}}]),
    )
    .await;
    let failed = crate::effects::settled(&s, "private", "failed").await;
    assert_eq!(failed["attempts"], 1, "refused at once: {failed}");
    assert!(
        failed["lastError"]
            .as_str()
            .unwrap()
            .contains("deny-private-networks"),
        "{failed}"
    );
}

#[tokio::test]
async fn the_console_runs_no_inline_script_and_is_never_framed() {
    let s = Server::start();
    for path in ["/console", "/console/console.js", "/console/console.css"] {
        let r = reqwest::get(format!("{}{path}", s.url)).await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        let page = r.text().await.unwrap();
        if path == "/console" {
            // Everything the page runs comes from this host.
            assert!(
                !page.contains("<script>") && !page.contains("<style>"),
                "{page}"
            );
            assert!(
                !page.contains(" style=\"") && !page.contains(" onclick="),
                "{page}"
            );
            assert!(
                page.contains("<script src=\"/console/console.js\">"),
                "{page}"
            );
        }
    }
}

/// Reads from `tcp` until the server closes it (`true`) or `within` passes.
fn closed_within(tcp: &mut std::net::TcpStream, within: Duration) -> bool {
    use std::io::Read;
    let deadline = std::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        tcp.set_read_timeout(Some(left)).unwrap();
        match tcp.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

pub(crate) fn connect(s: &Server) -> std::net::TcpStream {
    std::net::TcpStream::connect(s.url.trim_start_matches("http://")).unwrap()
}

/// Sends `request` and reads one response head (and what follows of it).
pub(crate) fn exchange(tcp: &mut std::net::TcpStream, request: &str) -> String {
    use std::io::{Read, Write};
    tcp.write_all(request.as_bytes()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 65536];
    let n = tcp.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn a_connection_that_sends_no_whole_head_is_closed_after_the_header_timeout() {
    let s = Server::start_with(
        Some("[http]\nheader-timeout-ms = 300\nidle-timeout-ms = 600000\n"),
        &[],
    );
    let mut silent = connect(&s);
    let mut partial = connect(&s);
    std::io::Write::write_all(&mut partial, b"GET /healthz HT").unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(10)));
    assert!(closed_within(&mut partial, Duration::from_secs(10)));
    assert_eq!(s.get("/healthz").await.0, 200);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_and_a_long_request_is_not() {
    if crate::support::skipped_on_postgres(
        "connection timeouts are the HTTP server's, the same on either storage",
    ) {
        return;
    }
    let s = Server::start_with(
        Some("[http]\nheader-timeout-ms = 300\nidle-timeout-ms = 300\n"),
        &[],
    );
    s.post(&format!("{P}/a:append"), ev("x.y/a", json!({})))
        .await;
    let host = s.url.trim_start_matches("http://").to_string();
    let mut kept = connect(&s);
    let answer = exchange(
        &mut kept,
        &format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n"),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed_within(&mut kept, Duration::from_secs(10)));
    // A wait far longer than both timeouts is answered in full (on a new
    // connection: the pooled one was closed while this thread blocked).
    let r = reqwest::Client::new()
        .post(format!("{}{P}/a:waitForEvent", s.url))
        .json(&json!({"eventTypes": ["x.y/never"], "timeoutMs": 1500}))
        .send()
        .await
        .unwrap();
    let answer = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_error(&answer, 408, "timeout", "1500ms");
}

#[tokio::test]
async fn a_trickled_body_is_cut_off_with_408() {
    let s = Server::start_with(Some("[http]\nbody-timeout-ms = 300\n"), &[]);
    let host = s.url.trim_start_matches("http://").to_string();
    let mut slow = connect(&s);
    let answer = exchange(
        &mut slow,
        &format!(
            "POST {P}/a:append HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"events\": ["
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body-timeout-ms"), "{answer}");
}

#[tokio::test]
async fn the_token_is_checked_before_the_body_is_read() {
    let config = format!(
        "{}\n[http]\nbody-timeout-ms = 600000\n",
        crate::support::TOKENS
    );
    let s = Server::start_with(Some(&config), &[]);
    let host = s.url.trim_start_matches("http://").to_string();
    for token in ["wrong", "t-acme"] {
        let mut tcp = connect(&s);
        // The body never comes: an answer at all means it was not waited for.
        let answer = exchange(
            &mut tcp,
            &format!(
                "POST /v1/projects/other/streams/a:append HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
            ),
        );
        let status = if token == "wrong" { "401" } else { "403" };
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
    }
}

#[tokio::test]
async fn idle_connections_beyond_the_bound_wait_and_cannot_lock_others_out() {
    let s = Server::start_with(
        Some("[http]\nheader-timeout-ms = 500\nmax-connections = 8\n"),
        &[],
    );
    // Far more idle connections than the bound: each accepted one is closed
    // after the header timeout, so a real request gets its turn.
    let idle: Vec<_> = (0..40).map(|_| connect(&s)).collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let r = client
        .get(format!("{}/healthz", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    drop(idle);
}

#[tokio::test]
async fn connections_beyond_max_connections_wait_for_a_free_one() {
    if crate::support::skipped_on_postgres(
        "connection limits are the HTTP server's, the same on either storage",
    ) {
        return;
    }
    let s = Server::start_with(Some("[http]\nmax-connections = 4\n"), &[]);
    let mut held: Vec<_> = (0..4).map(|_| connect(&s)).collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let waited = client.get(format!("{}/healthz", s.url)).send().await;
    assert!(
        waited.as_ref().is_err_and(|e| e.is_timeout()),
        "a fifth connection is not served while four are open: {waited:?}"
    );
    held.pop();
    let r = reqwest::get(format!("{}/healthz", s.url)).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// A kept-alive connection from `from` (a loopback address of its own) that
/// has been served one `GET /healthz` with `token`: its answer's head.
async fn held_from(s: &Server, from: &str, token: Option<&str>) -> (std::net::TcpStream, String) {
    let to: std::net::SocketAddr = s.url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut tcp = socket.connect(to).await.unwrap().into_std().unwrap();
    tcp.set_nonblocking(false).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {to}\r\n{auth}\r\n");
    let answer = tokio::task::block_in_place(|| exchange(&mut tcp, &request));
    (tcp, answer)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_address_cannot_take_every_connection_and_the_last_are_kept_for_tokens() {
    let config = format!(
        "{}\n[http]\nmax-connections = 24\nmax-connections-per-address = 12\n\
         reserved-connections = 4\n",
        crate::support::TOKENS
    );
    let s = Server::start_with(Some(&config), &[]);
    // One client address takes its share and no more: the next is told why.
    let mut held = Vec::new();
    for _ in 0..12 {
        let (tcp, answer) = held_from(&s, "127.0.0.2", None).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        held.push(tcp);
    }
    let (_, refused) = held_from(&s, "127.0.0.2", None).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    for mention in [
        "too-many-connections",
        "127.0.0.2",
        "max-connections-per-address = 12",
    ] {
        assert!(refused.contains(mention), "{mention}: {refused}");
    }
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    // A second address is served meanwhile, and fills every place open to
    // anyone (24 - 4 reserved).
    for _ in 0..8 {
        let (tcp, answer) = held_from(&s, "127.0.0.3", None).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        held.push(tcp);
    }
    // Now an unauthenticated connection gets a reserved place only to be
    // told it is reserved; one with a token is served there.
    let (mut anonymous, answer) = held_from(&s, "127.0.0.4", None).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    for mention in ["connections-reserved", "reserved-connections = 4"] {
        assert!(answer.contains(mention), "{mention}: {answer}");
    }
    assert!(closed_within(&mut anonymous, Duration::from_secs(10)));
    let mut served = Vec::new();
    for _ in 0..4 {
        let (tcp, answer) = held_from(&s, "127.0.0.4", Some("t-admin")).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        served.push(tcp);
    }
    // Closing the first address's connections gives their places back.
    drop(held);
    let mut again = None;
    crate::support::wait_for("a place given back", Duration::from_secs(10), async || {
        let (tcp, answer) = held_from(&s, "127.0.0.2", None).await;
        again = Some(tcp);
        answer.starts_with("HTTP/1.1 200")
    })
    .await;
    let append = s
        .post_as(
            Some("t-acme"),
            "/v1/projects/acme/streams/a:append",
            ev("x.y/a", json!({})),
        )
        .await;
    assert_eq!(append.0, 200, "{append:?}");
}

/// A server with two places of guest calls a project (four in all), and
/// the `kinds` component deployed in `evil` and `good`.
async fn call_share_server() -> Server {
    let config = "[processors]\nmax-concurrent-calls = 4\nmax-concurrent-calls-per-project = 2\n\
                  [delivery]\ntimeout-ms = 4000\nmax-attempts = 50\nbackoff-base-ms = 10\n\
                  backoff-max-ms = 20\n";
    let s = Server::start_with(Some(config), &[]);
    for project in ["evil", "good"] {
        let (status, out) = s
            .deploy(project, "kinds", crate::support::guest("kinds"))
            .await;
        assert!(status == 200 || status == 201, "{out}");
    }
    s
}

/// Evil's ITX call, its share of calls taken, waits and is refused with
/// `429 too-many-calls`; good's calls answer at once.
async fn evils_call_is_refused_and_goods_run(s: &Server) {
    let add = json!({"expression": ["components", ["get", "kinds"], "add"], "args": [2, 3]});
    let mut refused = None;
    crate::support::wait_for(
        "evil's call refused at its share",
        Duration::from_secs(30),
        async || {
            let answer = s.post("/v1/projects/evil/itx", add.clone()).await;
            let at_share = answer.0 == 429;
            refused = Some(answer);
            at_share
        },
    )
    .await;
    assert_error(
        &refused.unwrap(),
        429,
        "too-many-calls",
        "max-concurrent-calls-per-project = 2",
    );
    for _ in 0..3 {
        let answer = s.post("/v1/projects/good/itx", add.clone()).await;
        assert_eq!(answer, (200, json!({"result": 5})), "good's call");
    }
}

/// `n` streams of `project` woken into `component` (the hostile guest)
/// with an event it spins on: each wake runs until its timeout, again and
/// again.
pub(crate) async fn spinning_wakes(s: &Server, project: &str, component: &str, n: usize) {
    for i in 0..n {
        let stream = format!("/v1/projects/{project}/streams/spin{i}");
        crate::effects::wake(s, &stream, "p", component).await;
        let spin = ev("hostile/loop", json!({}));
        assert_eq!(s.post(&format!("{stream}:append"), spin).await.0, 200);
    }
}

#[tokio::test]
async fn a_project_whose_calls_take_its_share_waits_and_another_projects_calls_do_not() {
    let s = call_share_server().await;
    // Six processors of evil's (the counter), then a shadow version (the
    // hostile guest) that spins on every step until its timeout, again
    // and again: more steps at once than evil's two places.
    let (status, out) = s
        .deploy("evil", "proc", crate::support::guest("counter"))
        .await;
    assert!(status == 200 || status == 201, "{out}");
    for i in 0..6 {
        let stream = format!("/v1/projects/evil/streams/spin{i}");
        crate::effects::wake(&s, &stream, "p", "proc").await;
        let spin = ev("hostile/loop", json!({}));
        assert_eq!(s.post(&format!("{stream}:append"), spin).await.0, 200);
        crate::processors::caught_up(&s, &stream, "proc").await;
    }
    let (status, out) = s
        .deploy_with_query(
            "evil",
            "proc",
            crate::support::guest("hostile"),
            "refold=shadow",
        )
        .await;
    assert_eq!(status, 200, "{out}");
    // Evil's own call waits behind its spinning shadow steps, then is
    // refused.
    evils_call_is_refused_and_goods_run(&s).await;
}

#[tokio::test]
async fn a_project_whose_effects_hang_takes_its_share_of_the_outbox_and_another_projects_run() {
    // Eight effects at once, two of one project's share (more only while
    // two places stay free); an execution may hang for two minutes before
    // it times out.
    let config = "[effects]\nconcurrency = 8\nconcurrency-per-project = 2\nlease-ms = 300000\n\
                  [delivery]\ntimeout-ms = 120000\n";
    let s = Server::start_with(Some(config), &[]);
    let r = crate::effects::Receiver::start().await;
    for project in ["evil", "good"] {
        let (status, out) = s
            .deploy(project, "effector", crate::support::guest("effector"))
            .await;
        assert_eq!(status, 200, "{out}");
        let stream = format!("/v1/projects/{project}/streams/orders");
        crate::effects::wake(&s, &stream, "fx", "effector").await;
    }
    // Ten webhooks of evil's to a receiver that never answers.
    let hang: Vec<Value> = (0..10)
        .map(|i| json!({"key": format!("hang-{i}"), "webhook": {"url": format!("{}/hang/{i}", r.base), "body": {}}}))
        .collect();
    crate::effects::request(&s, "/v1/projects/evil/streams/orders", json!(hang)).await;
    let evil_posts = || {
        r.posts
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.path.starts_with("/hang/"))
            .count()
    };
    // Evil alone takes the outbox but a share's worth of places: its own
    // two, and four more while two stay free.
    crate::support::wait_for(
        "evil's effects to take their places",
        Duration::from_secs(30),
        async || evil_posts() >= 6,
    )
    .await;
    // Another project's effect runs while evil's hang.
    crate::effects::request(
        &s,
        "/v1/projects/good/streams/orders",
        json!([{"key": "ok", "webhook": {"url": format!("{}/ok/good", r.base), "body": {}}}]),
    )
    .await;
    crate::support::wait_for(
        "good's effect to run",
        Duration::from_secs(30),
        async || !r.posts_to("/ok/good").is_empty(),
    )
    .await;
    // Evil never took the places kept for the others.
    assert_eq!(
        evil_posts(),
        6,
        "evil's hanging effects executing (8 places, 2 kept)"
    );
}

#[tokio::test]
async fn a_project_whose_webhooks_hang_takes_its_share_of_deliveries_and_another_projects_deliver()
{
    // Eight deliveries at once, two of one project's; an attempt may hang
    // for two minutes before it times out.
    let config = "[delivery]\nconcurrency = 8\nconcurrency-per-project = 2\ntimeout-ms = 120000\n\
                  [effects]\nlease-ms = 300000\n";
    let s = Server::start_with(Some(config), &[]);
    let r = crate::effects::Receiver::start().await;
    // Six subscriptions of evil's to a receiver that never answers.
    let evil = "/v1/projects/evil/streams/orders";
    for i in 0..6 {
        let url = format!("{}/hang/{i}", r.base);
        let sub = webhook_subscription(&format!("hang-{i}"), &url);
        assert_eq!(s.post(&format!("{evil}:append"), sub).await.0, 200);
    }
    let order = ev("order/placed", json!({"n": 1}));
    assert_eq!(
        s.post(&format!("{evil}:append"), order.clone()).await.0,
        200
    );
    let evil_posts = || {
        r.posts
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.path.starts_with("/hang/"))
            .count()
    };
    let waiting = async || waiting_for_place(&s, evil).await;
    crate::support::wait_for(
        "evil's deliveries to take their share and the rest to wait",
        Duration::from_secs(30),
        async || evil_posts() == 2 && waiting().await == 4,
    )
    .await;
    // Another project's delivery runs while evil's hang.
    let good = "/v1/projects/good/streams/orders";
    let url = format!("{}/ok/good", r.base);
    assert_eq!(
        s.post(&format!("{good}:append"), webhook_subscription("ok", &url))
            .await
            .0,
        200
    );
    assert_eq!(s.post(&format!("{good}:append"), order).await.0, 200);
    crate::support::wait_for("good's delivery", Duration::from_secs(30), async || {
        !r.posts_to("/ok/good").is_empty()
    })
    .await;
    assert_eq!(evil_posts(), 2, "evil's deliveries at once (its share)");
    assert_eq!(
        waiting().await,
        4,
        "evil's other deliveries wait for a place"
    );
}

#[tokio::test]
async fn a_projects_itx_effects_take_places_of_its_call_share() {
    let s = call_share_server().await;
    // Evil's effector asks for four ITX effects that each spin until the
    // execution's timeout, again and again: more calls at once than evil's
    // two places (the effect worker has many more).
    let (status, out) = s
        .deploy("evil", "effector", crate::support::guest("effector"))
        .await;
    assert!(status == 200 || status == 201, "{out}");
    let stream = "/v1/projects/evil/streams/fx";
    crate::effects::wake(&s, stream, "fx", "effector").await;
    let spin = json!({"expression": ["components", ["get", "kinds"], "spin"], "args": []});
    let effects: Vec<Value> = (0..4)
        .map(|i| json!({"key": format!("spin-{i}"), "itx": spin}))
        .collect();
    let request = json!({"events": [{"type": "events.example/effects-requested",
        "payload": {"effects": effects}}]});
    assert_eq!(s.post(&format!("{stream}:append"), request).await.0, 200);
    // Evil's own call waits behind its spinning effects, then is refused;
    // good's calls run at once.
    evils_call_is_refused_and_goods_run(&s).await;
}

#[tokio::test]
async fn a_projects_wakes_take_places_of_its_call_share() {
    let s = call_share_server().await;
    // Four processors of evil's that spin on every wake until its timeout,
    // again and again: more wakes at once than evil's two places.
    let (status, out) = s
        .deploy("evil", "proc", crate::support::guest("hostile"))
        .await;
    assert!(status == 200 || status == 201, "{out}");
    spinning_wakes(&s, "evil", "proc", 4).await;
    // Evil's own call waits behind its spinning wakes, then is refused.
    evils_call_is_refused_and_goods_run(&s).await;
}

#[tokio::test]
async fn a_component_keeps_its_newest_versions_and_the_bytes_of_older_ones_go() {
    let s = Server::start_with(Some("[processors]\nmax-versions-per-component = 2\n"), &[]);
    let kinds = crate::support::guest("kinds");
    // Bytes are stored once by digest: another project's component names
    // the first version's too.
    let (status, out) = s
        .deploy(
            "other",
            "kinds",
            crate::support::component_version(kinds.clone(), 0),
        )
        .await;
    assert!(status == 200 || status == 201, "{out}");
    let mut digests = Vec::new();
    for n in 0..5 {
        let (status, out) = s
            .deploy(
                "acme",
                "kinds",
                crate::support::component_version(kinds.clone(), n),
            )
            .await;
        assert!(status == 200 || status == 201, "{out}");
        digests.push(out["digest"].as_str().unwrap().to_string());
    }
    let (status, versions) = s.get("/v1/projects/acme/components/kinds/versions").await;
    assert_eq!(status, 200, "{versions}");
    let listed: Vec<&str> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["digest"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [digests[4].as_str(), digests[3].as_str()]);
    let db = s.db();
    let kept = |digest: &str| {
        db.query_i64(&format!(
            "SELECT count(*) FROM component_blobs WHERE digest = '{digest}'"
        )) == Some(1)
    };
    assert!(kept(&digests[0]), "named by the other project's component");
    assert!(
        !kept(&digests[1]) && !kept(&digests[2]),
        "let go, named by nothing"
    );
    assert!(kept(&digests[3]) && kept(&digests[4]));
    // The current version still calls.
    let add = json!({"expression": ["components", ["get", "kinds"], "add"], "args": [2, 3]});
    assert_eq!(
        s.post("/v1/projects/acme/itx", add).await,
        (200, json!({"result": 5}))
    );
}

#[tokio::test]
async fn a_project_at_its_live_connection_bound_gets_429_and_others_connect() {
    let s = Server::start_with(
        Some("[limits]\nmax-live-connections-per-project = 3\n"),
        &[],
    );
    for project in ["evil", "good"] {
        s.post(
            &format!("/v1/projects/{project}/streams/a:append"),
            ev("x.y/a", json!({})),
        )
        .await;
    }
    let evil = "/v1/projects/evil/streams/a:connect";
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(SseClient::open(&s, evil).await.expect("within the bound"));
    }
    let refused = SseClient::open(&s, evil).await.err().expect("refused");
    assert_error(&refused, 429, "too-many-connections", "\"evil\"");
    let wait = s
        .post(
            "/v1/projects/evil/streams/a:waitForEvent",
            json!({"timeoutMs": 100}),
        )
        .await;
    assert_error(
        &wait,
        429,
        "too-many-connections",
        "max-live-connections-per-project",
    );
    assert!(SseClient::open(&s, "/v1/projects/good/streams/a:connect")
        .await
        .is_ok());
    // A closed connection gives its place back.
    held.pop();
    let mut reopened = None;
    crate::support::wait_for("a freed place", Duration::from_secs(10), async || {
        reopened = SseClient::open(&s, evil).await.ok();
        reopened.is_some()
    })
    .await;
}

#[tokio::test]
async fn ephemeral_memory_is_bounded_and_one_project_cannot_take_all_of_it() {
    // A quarter of 400 KB per project.
    let s = Server::start_with(Some("[limits]\nmax-ephemeral-bytes = 400000\n"), &[]);
    let big = "x".repeat(20_000);
    let typing = |project: &str| {
        (
            format!("/v1/projects/{project}/streams/chat:append"),
            json!({"events": [{"type": "x.y/typing", "ephemeral": true, "payload": {"pad": big}}]}),
        )
    };
    let (path, body) = typing("evil");
    let mut refused = None;
    for _ in 0..20 {
        let answer = s.post(&path, body.clone()).await;
        if answer.0 != 200 {
            refused = Some(answer);
            break;
        }
    }
    let refused = refused.expect("evil's ephemeral appends are refused past its share");
    assert_error(
        &refused,
        503,
        "ephemeral-capacity-exhausted",
        "max-ephemeral-bytes",
    );
    // Durable appends of the same project go on; another project's
    // ephemeral ones too.
    assert_eq!(s.post(&path, ev("x.y/a", json!({}))).await.0, 200);
    let (path, body) = typing("good");
    let (status, out) = s.post(&path, body).await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test]
async fn a_project_at_its_ingest_share_gets_503_and_others_ingest() {
    // A quarter of 8 events per project.
    let s = Server::start_with(Some("[ingest]\nmax-pending-events = 8\n"), &[]);
    crate::ingest::set_paused(&s, "/v1/projects/evil/streams/held", true).await;
    let ingest = "/v1/projects/evil/ingest/held";
    let events: Vec<Value> = (1..=2)
        .map(|n| crate::ingest::order(&format!("e-{n}"), n))
        .collect();
    assert_eq!(s.post(ingest, json!({"events": events})).await.0, 202);
    let over = s
        .post(ingest, json!({"events": [crate::ingest::order("e-3", 3)]}))
        .await;
    assert_error(&over, 503, "capacity-exhausted", "project \"evil\"");
    for n in 1..=2 {
        let answer = s
            .post(
                "/v1/projects/good/ingest/orders",
                json!({"events": [crate::ingest::order(&format!("g-{n}"), n)]}),
            )
            .await;
        assert_eq!(answer.0, 202, "{}", answer.1);
    }
    crate::ingest::wait_orders(&s, "/v1/projects/good/streams/orders", 2).await;
}

#[tokio::test]
async fn a_webhook_transform_that_builds_a_huge_value_halts_at_once_and_posts_nothing() {
    let url = loud_receiver().await;
    let s = Server::start_with(Some(SLOW_RETRIES), &[]);
    let mut subscription = webhook_subscription("huge", &url);
    subscription["events"][0]["payload"]["receiver"]["jsonataTransform"] =
        json!("{\"payload\": {\"x\": $pad(\"\", 5000000)}}");
    let (status, out) = s.post(&format!("{P}/src:append"), subscription).await;
    assert_eq!(status, 200, "{out}");
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    let halted = halted_at_once(&s, "huge", "jsonata-max-bytes").await;
    // The receiver answers 500 to anything: a post would have said so.
    assert!(
        !halted["error"]
            .as_str()
            .unwrap()
            .contains("webhook responded"),
        "{halted}"
    );
}

#[tokio::test]
async fn a_slow_destination_holds_its_own_places_and_another_destination_is_served() {
    // Two POSTs at once to one destination; an attempt may hang for two
    // minutes before it times out.
    let config = "[delivery]\ntimeout-ms = 120000\n\
                  [effects]\nper-destination-concurrency = 2\nlease-ms = 300000\n";
    let s = Server::start_with(Some(config), &[]);
    // Two destinations (host names 127.0.0.1 and localhost): one never
    // answers, one answers at once.
    let slow = crate::effects::Receiver::start().await;
    let mut ok = crate::effects::Receiver::start().await;
    ok.base = ok.base.replace("127.0.0.1", "localhost");
    let stream = "/v1/projects/acme/streams/orders";
    for i in 0..5 {
        let sub = webhook_subscription(&format!("hang-{i}"), &format!("{}/hang/{i}", slow.base));
        assert_eq!(s.post(&format!("{stream}:append"), sub).await.0, 200);
    }
    let order = ev("order/placed", json!({"n": 1}));
    assert_eq!(
        s.post(&format!("{stream}:append"), order.clone()).await.0,
        200
    );
    let slow_posts = || slow.posts.lock().unwrap().len();
    let waiting = async || waiting_for_place(&s, stream).await;
    crate::support::wait_for(
        "two deliveries at the slow destination and three waiting for it",
        Duration::from_secs(30),
        async || slow_posts() == 2 && waiting().await == 3,
    )
    .await;
    // Another destination is served meanwhile: a delivery and an effect.
    let other = "/v1/projects/acme/streams/other";
    let sub = webhook_subscription("fine", &format!("{}/ok/delivery", ok.base));
    assert_eq!(s.post(&format!("{other}:append"), sub).await.0, 200);
    assert_eq!(s.post(&format!("{other}:append"), order).await.0, 200);
    let fx = "/v1/projects/acme/streams/fx";
    crate::effects::effector_on(&s, fx).await;
    crate::effects::request(
        &s,
        fx,
        json!([{"key": "held", "webhook": {"url": format!("{}/hang/fx", slow.base), "body": {}}},
               {"key": "fine", "webhook": {"url": format!("{}/ok/fx", ok.base), "body": {}}}]),
    )
    .await;
    crate::support::wait_for(
        "the other destination's delivery and effect",
        Duration::from_secs(30),
        async || !ok.posts_to("/ok/delivery").is_empty() && !ok.posts_to("/ok/fx").is_empty(),
    )
    .await;
    // The slow destination still has two POSTs: the effect waits too.
    assert_eq!(slow_posts(), 2);
    let (status, effects) = s.get("/v1/projects/acme/effects?limit=10").await;
    assert_eq!(status, 200, "{effects}");
    let held = effects["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "held")
        .cloned()
        .unwrap();
    assert_eq!(held["status"], "running", "{held}");
    assert_eq!(
        held["lastError"],
        Value::Null,
        "waiting is no failure: {held}"
    );
}

/// On PostgreSQL a large append commits on a connection of its own, beside
/// the writer's groups: held up in the database (its stream's row locked
/// by another session, as a slow commit of 7 MB would hold it), it holds
/// up no other project's append, nor its own project's other streams.
/// (Against one write connection the quiet appends wait for the lock,
/// here up to the database's 30 s lock timeout.)
/// SQLite writes large bodies in parts between the groups instead
/// (`storage/src/writer.rs`'s tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_append_held_up_in_the_database_holds_up_no_other_append() {
    if crate::support::skipped_on_sqlite(
        "a large append's own PostgreSQL connection is PostgreSQL's",
    ) {
        return;
    }
    // A lock wait fails after 30 s (5 s by default), well past the quiet
    // appends' bound below.
    let s = Server::start_with(Some("[cluster]\ndb-timeout-ms = 30000\n"), &[]);
    let big = "/v1/projects/loud/streams/big";
    assert_eq!(
        s.post(
            &format!("{big}:append"),
            json!({"events": [{"type": "x.y/a"}]})
        )
        .await
        .0,
        200
    );
    let url = s.postgres_url().expect("a PostgreSQL database").to_string();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connecting");
        let mut tx = c.transaction().expect("BEGIN");
        tx.query_one(
            "SELECT id FROM streams WHERE project = 'loud' AND path = '/big' FOR UPDATE",
            &[],
        )
        .expect("locking the stream's row");
        locked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        tx.rollback().expect("ROLLBACK");
    });
    locked_rx.recv().unwrap();

    // 600 KB: past the size that goes to the lane of large appends.
    let pad = "x".repeat(600_000);
    let large = {
        let (client, url) = (reqwest::Client::new(), format!("{}{big}:append", s.url));
        let body = json!({"events": [{"type": "x.y/big", "payload": {"pad": pad}}]});
        tokio::spawn(async move {
            let r = client.post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    // The large append's commit is in the database, waiting for the lock.
    let db = s.db();
    crate::support::wait_for(
        "the large append to wait for the stream's row",
        Duration::from_secs(20),
        async || {
            db.query_i64(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            ) == Some(1)
        },
    )
    .await;

    for (project, stream) in [("quiet", "canary"), ("loud", "other")] {
        let path = format!("/v1/projects/{project}/streams/{stream}:append");
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            s.post(&path, json!({"events": [{"type": "x.y/tick"}]})),
        )
        .await
        .unwrap_or_else(|_| panic!("{path} waited 10 s for another stream's large append"));
        assert_eq!(answer.0, 200, "{path}: {}", answer.1);
    }
    assert!(
        !large.is_finished(),
        "the large append did not wait for the lock"
    );

    release_tx.send(()).unwrap();
    holder.join().unwrap();
    let (status, answer) = tokio::time::timeout(Duration::from_secs(20), large)
        .await
        .expect("the large append answers once the lock is gone")
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    let events = s.all_events(big).await;
    let bigs: Vec<&Value> = events.iter().filter(|e| e["type"] == "x.y/big").collect();
    assert_eq!(bigs.len(), 1, "{} events", events.len());
    assert_eq!(
        bigs[0]["payload"]["pad"].as_str().map(str::len),
        Some(600_000)
    );
}
