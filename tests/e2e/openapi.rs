//! `GET /openapi.json`: the document describes every operation the router
//! serves and nothing else, and each described operation is routed by the
//! real binary (not answered by the fallback).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use crate::support::Server;

#[tokio::test]
async fn the_openapi_document_describes_every_route_and_only_those() {
    let server = Server::start_with(Some(crate::support::TOKENS), &[]);
    // Served without a token.
    let response = reqwest::get(format!("{}/openapi.json", server.url))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let doc: Value = response.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );

    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            assert!(
                operation["responses"]
                    .as_object()
                    .is_some_and(|r| !r.is_empty()),
                "{method} {path} documents no response"
            );
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let routed: BTreeSet<(String, String)> = streamhost::http::operations()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p))
        .collect();
    let missing: Vec<_> = routed.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&routed).collect();
    assert!(missing.is_empty(), "routed but not documented: {missing:?}");
    assert!(extra.is_empty(), "documented but not routed: {extra:?}");

    // The reference in the repository names every operation too.
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/http-api.md"),
    )
    .unwrap();
    for (method, path) in &routed {
        let tail = match path.rsplit_once("/{path}") {
            Some((_, method_part)) => method_part.to_string(),
            None => path.rsplit('/').next().unwrap().to_string(),
        };
        assert!(
            reference.contains(&tail),
            "docs/http-api.md does not mention {method} {path} ({tail:?})"
        );
    }

    // Walk every documented operation on the real binary: each must reach a
    // handler (any answer but the fallback's "no route", a 405 or an
    // unknown stream method).
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for (method, path) in &documented {
        let url = format!(
            "{}{}",
            server.url,
            path.replace("{project}", "acme")
                .replace("{path}", "walk/x")
                .replace("{component}", "c")
                .replace("{name}", "c")
                .replace("{id}", "1")
        );
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = client.request(method.clone(), &url).bearer_auth("t-admin");
        if method != reqwest::Method::GET {
            request = request.json(&serde_json::json!({}));
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let event_stream = response
            .headers()
            .get("content-type")
            .is_some_and(|c| c.to_str().unwrap().starts_with("text/event-stream"));
        let body: Value = if event_stream {
            Value::Null
        } else {
            response.json().await.unwrap_or(Value::Null)
        };
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert_ne!(status, 405, "{method} {path}: {body}");
        assert!(
            !message.contains("no route for")
                && !message.contains("unknown stream method")
                && !message.contains("names no method"),
            "{method} {path} is not routed: {body}"
        );
    }
    // The check above can fail: an undocumented path gets the fallback.
    let (status, body) = server.get("/v1/projects/acme/nothing").await;
    assert_eq!(status, 404);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no route for"));
}

/// The schema at `pointer` (a JSON pointer into the OpenAPI document) as a
/// validator: the whole document rides along, so its `$ref`s resolve.
fn validator(doc: &Value, pointer: &str) -> jsonschema::Validator {
    let mut schema = doc.clone();
    // A URI fragment: what a fragment may not hold percent-encoded.
    let fragment: String = pointer
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    schema["$ref"] = Value::String(format!("#{fragment}"));
    jsonschema::draft202012::new(&schema)
        .unwrap_or_else(|e| panic!("the schema at {pointer} does not compile: {e}"))
}

/// `value` checked against the schema at `pointer`: a mismatch, naming
/// every error, is added to `problems`.
fn check_fits(doc: &Value, pointer: &str, value: &Value, what: &str, problems: &mut Vec<String>) {
    let v = validator(doc, pointer);
    let errors: Vec<String> = v
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if !errors.is_empty() {
        problems.push(format!(
            "{what} does not fit {pointer}:\n{}\n{value}",
            errors.join("\n")
        ));
    }
}

/// A JSON pointer's escaping of one token.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// One real call: the documented operation, its concrete URL, its body.
struct Call {
    method: &'static str,
    template: &'static str,
    url: String,
    body: Option<Value>,
    wasm: Option<Vec<u8>>,
    /// A body of another content type (the Durable Streams protocol's).
    raw: Option<(&'static str, Vec<u8>)>,
    status: u16,
}

fn call(
    method: &'static str,
    template: &'static str,
    url: &str,
    body: Option<Value>,
    status: u16,
) -> Call {
    Call {
        method,
        template,
        url: url.to_string(),
        body,
        wasm: None,
        raw: None,
        status,
    }
}

#[tokio::test]
async fn every_operation_answers_a_real_request_as_the_openapi_document_says() {
    use serde_json::json;
    let s = Server::start();
    let doc: Value = serde_json::from_str(streamhost::http::OPENAPI).unwrap();
    let guest = crate::support::guest;
    let acme = "/v1/projects/acme";
    let stream = format!("{acme}/streams/orders");
    let global = "/v1/global/streams/g";
    // What the walk below needs: processors on /orders (a counter, the
    // ledger for keys, the effector for an effect) and a global stream.
    for (name, bytes) in [
        ("counter", guest("counter")),
        ("ledger", guest("ledger")),
        ("effector", guest("effector")),
        ("kinds", guest("kinds")),
        ("welcome", guest("welcome")),
    ] {
        assert_eq!(s.deploy("acme", name, bytes).await.0, 200);
    }
    let wake = |key: &str, component: &str| {
        json!({"type": "events.iterate.com/stream/subscription-configured", "payload": {"subscriptionKey": key,
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", component], "wake"]}}})
    };
    let (status, out) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [wake("count", "counter"), wake("ledger", "ledger"), wake("effects", "effector"),
                {"type": "events.iterate.com/stream/subscription-configured", "payload": {"subscriptionKey": "welcome.v1",
                    "filter": {"eventTypes": ["user-signed-up"]},
                    "receiver": {"action": "reactor", "expression": ["components", ["get", "welcome"], "react"]}}},
                {"type": "deposited", "payload": {"account": "a-1", "cents": 250}},
                {"type": "events.example/effects-requested", "payload": {"effects": [
                    {"key": "boom", "itx": {"expression": ["components", ["get", "kinds"], "boom"], "args": []}}]}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let head = out["events"][5]["offset"].clone();
    crate::support::wait_for(
        "the processors to catch up and the effect to fail",
        Duration::from_secs(60),
        async || {
            let (_, e) = s.get(&format!("{acme}/effects")).await;
            let (_, c) = s.get(&format!("{stream}:processors/counter")).await;
            let (_, l) = s.get(&format!("{stream}:processors/ledger")).await;
            let caught_up = |p: &Value| p["checkpointOffset"].as_u64() >= head.as_u64();
            e["effects"][0]["status"] == "failed" && caught_up(&c) && caught_up(&l)
        },
    )
    .await;
    let effect = s.get(&format!("{acme}/effects")).await.1["effects"][0]["id"].clone();
    let effect = format!("{acme}/effects/{effect}");
    assert_eq!(
        s.post(
            &format!("{global}:append"),
            json!({"events": [{"type": "x.y/g"}]})
        )
        .await
        .0,
        200
    );

    // Two sign-ups without a userId, which the welcome reactor refuses for
    // good: parked.
    let refused = crate::reactors::refused_sign_up;
    let (status, out) = s
        .post(
            &format!("{acme}/ingest/orders"),
            json!({"events": [refused("u-1"), refused("u-2")]}),
        )
        .await;
    assert_eq!(status, 202, "{out}");
    crate::support::wait_for("two parked", Duration::from_secs(30), async || {
        s.get(&format!("{acme}/ingest/parked")).await.1["parked"]
            .as_array()
            .is_some_and(|p| p.len() == 2)
    })
    .await;
    let parked = s.get(&format!("{acme}/ingest/parked")).await.1["parked"].clone();
    let parked = |i: usize| format!("{acme}/ingest/parked/{}", parked[i]["id"]);

    let p = "/v1/projects/{project}/streams/{path}";
    let g = "/v1/global/streams/{path}";
    let append = json!({"events": [{"type": "events.example/order-created", "payload": {"total": 120}, "idempotencyKey": "o-1"}]});
    let subscribe = json!({"sourceStreamPath": "/orders", "subscriptionKey": "copy", "start": "beginning", "filter": {"eventTypes": ["x.y/none"]}});
    let mut calls = vec![
        call("GET", "/healthz", "/healthz", None, 200),
        call("GET", "/healthz", "/healthz?detail=true", None, 200),
        call("GET", "/metrics", "/metrics", None, 200),
        call("GET", "/openapi.json", "/openapi.json", None, 200),
        call("GET", "/console", "/console", None, 200),
        call(
            "GET",
            "/v1/projects/{project}/streams",
            &format!("{acme}/streams?prefix=/orders"),
            None,
            200,
        ),
        call("GET", "/v1/global/streams", "/v1/global/streams", None, 200),
        call(
            "GET",
            "/v1/projects/{project}/components",
            &format!("{acme}/components"),
            None,
            200,
        ),
        call(
            "GET",
            "/v1/projects/{project}/components/{name}",
            &format!("{acme}/components/counter"),
            None,
            200,
        ),
        call(
            "GET",
            "/v1/projects/{project}/components/{name}/versions",
            &format!("{acme}/components/counter/versions"),
            None,
            200,
        ),
        call(
            "POST",
            "/v1/projects/{project}/itx",
            &format!("{acme}/itx"),
            Some(json!({"expression": ["components", ["get", "kinds"], "add"], "args": [1, 2]})),
            200,
        ),
        call(
            "GET",
            "/v1/projects/{project}/effects",
            &format!("{acme}/effects"),
            None,
            200,
        ),
        call(
            "GET",
            "/v1/projects/{project}/effects/{id}",
            &effect,
            None,
            200,
        ),
        call(
            "POST",
            "/v1/projects/{project}/effects/{id}:cancel",
            &format!("{effect}:cancel"),
            Some(json!({})),
            200,
        ),
        call(
            "POST",
            "/v1/projects/{project}/effects/{id}:retry",
            &format!("{effect}:retry"),
            Some(json!({})),
            200,
        ),
        call(
            "PUT",
            "/v1/projects/{project}/secrets/webhooks",
            &format!("{acme}/secrets/webhooks"),
            Some(json!({})),
            200,
        ),
        call(
            "POST",
            "/v1/projects/{project}/secrets/webhooks:retirePrevious",
            &format!("{acme}/secrets/webhooks:retirePrevious"),
            Some(json!({})),
            200,
        ),
        call(
            "POST",
            "/v1/projects/{project}/ingest",
            &format!("{acme}/ingest/paid"),
            Some(json!({"events": [{"type": "x.y/paid", "idempotencyKey": "p-1"}]})),
            202,
        ),
        call(
            "POST",
            "/v1/projects/{project}/ingest/{path}",
            &format!("{acme}/ingest/paid/eu"),
            Some(json!({"events": [{"type": "x.y/paid", "idempotencyKey": "p-2"}]})),
            202,
        ),
        call(
            "GET",
            "/v1/projects/{project}/ingest/parked",
            &format!("{acme}/ingest/parked?path=/orders&limit=10"),
            None,
            200,
        ),
        call(
            "POST",
            "/v1/projects/{project}/ingest/parked/{id}:redrive",
            &format!("{}:redrive", parked(0)),
            Some(json!({})),
            422,
        ),
        call(
            "POST",
            "/v1/projects/{project}/ingest/parked/{id}:discard",
            &format!("{}:discard", parked(1)),
            Some(json!({})),
            200,
        ),
        call("GET", "/v1/ingest", "/v1/ingest", None, 200),
        call(
            "POST",
            "/v1/ingest:register",
            "/v1/ingest:register",
            Some(json!({})),
            404,
        ),
        call("GET", "/v1/cluster", "/v1/cluster", None, 200),
        // A SQLite file; PostgreSQL's own tools back that log up.
        call(
            "GET",
            "/v1/backup",
            "/v1/backup",
            None,
            if crate::support::postgres_base().is_some() {
                409
            } else {
                200
            },
        ),
    ];
    for (base, prefix) in [(p, stream.clone()), (g, global.to_string())] {
        let project = base == p;
        let ops: Vec<(&str, &str, String, Option<Value>, u16)> = vec![
            (
                "POST",
                ":append",
                format!("{prefix}:append"),
                Some(append.clone()),
                200,
            ),
            (
                "GET",
                ":events",
                format!("{prefix}:events?afterOffset=0&limit=10"),
                None,
                200,
            ),
            ("GET", ":state", format!("{prefix}:state"), None, 200),
            ("GET", ":runtime", format!("{prefix}:runtime"), None, 200),
            (
                "GET",
                ":connect",
                format!("{prefix}:connect?replayAfterOffset=0"),
                None,
                200,
            ),
            (
                "POST",
                ":waitForEvent",
                format!("{prefix}:waitForEvent"),
                Some(json!({"afterOffset": 0, "timeoutMs": 1000})),
                200,
            ),
            (
                "POST",
                ":subscribeToEventsFrom",
                format!("{prefix}/copy:subscribeToEventsFrom"),
                Some(if project {
                    subscribe.clone()
                } else {
                    json!({"sourceStreamPath": "/g", "subscriptionKey": "copy", "start": "now"})
                }),
                200,
            ),
            (
                "POST",
                ":setSubscriptionCursor",
                format!("{prefix}:setSubscriptionCursor"),
                Some(json!({"subscriptionKey": "copy", "afterOffset": 1})),
                200,
            ),
            (
                "POST",
                ":resumeSubscription",
                format!("{prefix}:resumeSubscription"),
                Some(json!({"subscriptionKey": "copy"})),
                200,
            ),
            (
                "POST",
                ":setSubscriptionCursorAndResume",
                format!("{prefix}:setSubscriptionCursorAndResume"),
                Some(json!({"subscriptionKey": "copy", "afterOffset": 1})),
                200,
            ),
            (
                "POST",
                ":unsubscribeFromEvents",
                format!("{prefix}/copy:unsubscribeFromEvents"),
                Some(
                    json!({"sourceStreamPath": if project { "/orders" } else { "/g" }, "subscriptionKey": "copy"}),
                ),
                200,
            ),
            (
                "GET",
                ":processors/{component}",
                format!("{prefix}:processors/counter"),
                None,
                if project { 200 } else { 404 },
            ),
            (
                "POST",
                ":verifyProcessor",
                format!("{prefix}:verifyProcessor"),
                Some(json!({"component": "counter"})),
                if project { 200 } else { 404 },
            ),
            (
                "POST",
                ":backfillProcessor",
                format!("{prefix}:backfillProcessor"),
                Some(json!({"component": "counter", "afterOffset": 0})),
                if project { 200 } else { 404 },
            ),
            (
                "GET",
                ":processors/{component}/at/{offset}",
                format!("{prefix}:processors/ledger/at/2?keys=balance%2F"),
                None,
                if project { 200 } else { 404 },
            ),
            (
                "GET",
                ":events/{offset}/trace",
                format!("{prefix}:events/2/trace"),
                None,
                200,
            ),
            (
                "POST",
                ":backfillReactor",
                format!("{prefix}:backfillReactor"),
                Some(json!({"name": "welcome.v1", "afterOffset": 0})),
                if project { 200 } else { 404 },
            ),
            // No shadow is deployed here: each answers its documented 404
            // (`shadows::*` walks them with one).
            (
                "GET",
                ":processors/{component}/shadow",
                format!("{prefix}:processors/counter/shadow"),
                None,
                404,
            ),
            (
                "POST",
                ":promoteShadow",
                format!("{prefix}:promoteShadow"),
                Some(json!({"component": "counter", "runHeldEffects": false})),
                404,
            ),
            (
                "POST",
                ":discardShadow",
                format!("{prefix}:discardShadow"),
                Some(json!({"component": "counter"})),
                404,
            ),
            (
                "GET",
                ":processors/{component}/keys",
                format!("{prefix}:processors/ledger/keys?limit=10"),
                None,
                if project { 200 } else { 404 },
            ),
            (
                "GET",
                ":processors/{component}/keys/{key}",
                format!("{prefix}:processors/ledger/keys/balance%2Fa-1"),
                None,
                if project { 200 } else { 404 },
            ),
            (
                "POST",
                ":reset",
                format!("{prefix}:reset"),
                Some(json!({})),
                200,
            ),
        ];
        for (method, suffix, url, body, status) in ops {
            let template: &'static str = Box::leak(format!("{base}{suffix}").into_boxed_str());
            calls.push(call(method, template, &url, body, status));
        }
        // A stream of its own, whose offset 2 is the note appended first.
        let notes = if project {
            format!("{acme}/streams/notes")
        } else {
            "/v1/global/streams/notes".to_string()
        };
        let template = |suffix: &str| -> &'static str {
            Box::leak(format!("{base}{suffix}").into_boxed_str())
        };
        calls.push(call(
            "POST",
            template(":append"),
            &format!("{notes}:append"),
            Some(json!({"events": [{"type": "events.example/note", "payload": {"card": "4111"}}]})),
            200,
        ));
        calls.push(call(
            "POST",
            template(":redact"),
            &format!("{notes}:redact"),
            Some(json!({"offset": 2, "reason": "erasure request"})),
            200,
        ));
        calls.push(call(
            "POST",
            template(":configureRetention"),
            &format!("{notes}:configureRetention"),
            Some(json!({"maxEvents": 1000, "maxAgeMs": null})),
            200,
        ));
    }
    let mut deploy = call(
        "PUT",
        "/v1/projects/{project}/components/{name}",
        &format!("{acme}/components/counter?refold=true"),
        None,
        200,
    );
    deploy.wasm = Some(guest("counter"));
    calls.push(deploy);
    // The Durable Streams protocol: create, append, read, look, delete.
    let ds = "/ds/{project}/{path}";
    let text = |method, status, body: &[u8]| {
        let mut c = call(method, ds, "/ds/acme/walk/text", None, status);
        c.raw = Some(("text/plain", body.to_vec()));
        c
    };
    calls.push(text("PUT", 201, b"first"));
    calls.push(text("POST", 204, b" second"));
    calls.push(call("GET", ds, "/ds/acme/walk/text?offset=-1", None, 200));
    calls.push(call("HEAD", ds, "/ds/acme/walk/text", None, 200));
    calls.push(call("DELETE", ds, "/ds/acme/walk/text", None, 204));

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut covered = BTreeSet::new();
    let mut problems = Vec::new();
    for c in &calls {
        let operation = format!("/paths/{}/{}", escape(c.template), c.method.to_lowercase());
        assert!(
            doc.pointer(&operation).is_some(),
            "{} {} is not documented",
            c.method,
            c.template
        );
        let method = reqwest::Method::from_bytes(c.method.as_bytes()).unwrap();
        let mut request = client.request(method, format!("{}{}", s.url, c.url));
        if let Some(body) = &c.body {
            let schema = format!("{operation}/requestBody/content/application~1json/schema");
            if doc.pointer(&schema).is_some() {
                check_fits(
                    &doc,
                    &schema,
                    body,
                    &format!("the request of {} {}", c.method, c.url),
                    &mut problems,
                );
            }
            request = request.json(body);
        }
        if let Some(bytes) = &c.wasm {
            request = request
                .header("content-type", "application/wasm")
                .body(bytes.clone());
        }
        if let Some((content_type, bytes)) = &c.raw {
            request = request
                .header("content-type", *content_type)
                .body(bytes.clone());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let documented = format!("{operation}/responses/{status}");
        assert!(
            doc.pointer(&documented).is_some(),
            "{} {} answered {status}, which is not documented",
            c.method,
            c.url
        );
        let text = if content_type.starts_with("text/event-stream") {
            // The first batch is enough: a live connection does not end.
            drop(response);
            String::new()
        } else {
            response.text().await.unwrap()
        };
        assert_eq!(status, c.status, "{} {}: {text}", c.method, c.url);
        let json_schema = format!("{documented}/content/application~1json/schema");
        if content_type.starts_with("application/json") {
            assert!(
                doc.pointer(&json_schema).is_some(),
                "{} {} answered JSON the document does not describe",
                c.method,
                c.url
            );
            let value: Value = serde_json::from_str(&text).unwrap();
            check_fits(
                &doc,
                &json_schema,
                &value,
                &format!("the answer to {} {}", c.method, c.url),
                &mut problems,
            );
        }
        covered.insert((c.method.to_string(), c.template.to_string()));
    }
    let mut all = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            all.insert((method.to_uppercase(), path.clone()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    let missed: Vec<_> = all.difference(&covered).collect();
    assert!(
        missed.is_empty(),
        "operations no real call checked: {missed:?}"
    );
}
