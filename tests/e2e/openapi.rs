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
