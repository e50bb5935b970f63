//! Signed webhooks (Standard Webhooks): a receiver verifies every delivery
//! and webhook effect with an independent implementation, the
//! `standardwebhooks` package from PyPI (pinned; `scripts/test` installs
//! it), running the verification snippet of docs/http-api.md as written,
//! across a rotation of the project's secret.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::{wait_for, Server};

/// One POST as it arrived: its headers and its body's bytes.
#[derive(Debug, Clone)]
struct Raw {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A loopback receiver that keeps every POST whole and answers 200.
async fn receiver() -> (String, Arc<Mutex<Vec<Raw>>>) {
    let posts: Arc<Mutex<Vec<Raw>>> = Arc::default();
    async fn hook(
        State(posts): State<Arc<Mutex<Vec<Raw>>>>,
        uri: axum::http::Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> StatusCode {
        let headers = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        posts.lock().unwrap().push(Raw {
            path: uri.path().to_string(),
            headers,
            body: body.to_vec(),
        });
        StatusCode::OK
    }
    let app = Router::new()
        .route("/{*rest}", post(hook))
        .with_state(posts.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, posts)
}

/// The verification snippet of docs/http-api.md ("Webhook signatures").
fn documented_snippet() -> String {
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/http-api.md"),
    )
    .unwrap();
    let section = reference
        .split("## Webhook signatures")
        .nth(1)
        .expect("docs/http-api.md has a section \"Webhook signatures\"");
    let code = section
        .split("```python\n")
        .nth(1)
        .expect("the section shows a Python snippet");
    code.split("```").next().unwrap().to_string()
}

/// What the documented snippet answers for `post` under `secret`: the
/// verified body, or the verifier's error.
fn verify(secret: &str, post: &Raw) -> Result<Value, String> {
    use std::io::Write;
    let driver = format!(
        "{}\nimport base64, json, sys\n\
         d = json.load(sys.stdin)\n\
         try:\n    \
             out = {{'ok': verified(d['secret'], base64.b64decode(d['body']), d['headers'])}}\n\
         except Exception as e:\n    \
             out = {{'error': type(e).__name__ + ': ' + str(e)}}\n\
         print(json.dumps(out))\n",
        documented_snippet()
    );
    let input = json!({
        "secret": secret,
        "body": base64::engine::general_purpose::STANDARD.encode(&post.body),
        "headers": post.headers.iter().cloned().collect::<std::collections::HashMap<_, _>>(),
    });
    let mut child = std::process::Command::new("python3")
        .args(["-c", &driver])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the verifier did not run (is the standardwebhooks package installed? \
         scripts/test installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    match answer.get("ok") {
        Some(v) => Ok(v.clone()),
        None => Err(answer["error"].as_str().unwrap_or("").to_string()),
    }
}

async fn put_secret(s: &Server, token: Option<&str>, project: &str) -> (u16, Value, String) {
    let mut request =
        reqwest::Client::new().put(format!("{}/v1/projects/{project}/secrets/webhooks", s.url));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let cache = response
        .headers()
        .get("cache-control")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, response.json().await.unwrap(), cache)
}

const SRC: &str = "/v1/projects/acme/streams/src";

/// Appends one event the webhook subscription delivers and waits for its
/// POST (the `n`th to `/hook`).
async fn delivered(s: &Server, posts: &Arc<Mutex<Vec<Raw>>>, n: usize) -> Raw {
    let (status, out) = s
        .post(
            &format!("{SRC}:append"),
            json!({"events": [{"type": "x.y/e", "payload": {"n": n, "text": "grüße"}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let hooks = || -> Vec<Raw> {
        posts
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.path == "/hook")
            .cloned()
            .collect()
    };
    wait_for("the delivery", Duration::from_secs(30), async || {
        hooks().len() >= n
    })
    .await;
    hooks()[n - 1].clone()
}

#[tokio::test]
async fn deliveries_and_effects_verify_with_an_independent_implementation_across_a_rotation() {
    let s = Server::start();
    let (base, posts) = receiver().await;
    let sub = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "signed hook é", "filter": {"eventTypes": ["x.y/e"]},
            "receiver": {"action": "webhook-post", "url": format!("{base}/hook"),
                "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]});
    let (status, out) = s.post(&format!("{SRC}:append"), sub).await;
    assert_eq!(status, 200, "{out}");

    // No secret yet: unsigned.
    let first = delivered(&s, &posts, 1).await;
    assert_eq!(first.header("webhook-signature"), None, "{first:?}");

    let (status, made, cache) = put_secret(&s, None, "acme").await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(cache, "no-store");
    let one = made["secret"].as_str().unwrap().to_string();
    assert!(one.starts_with("whsec_"), "{one}");

    let signed = delivered(&s, &posts, 2).await;
    assert_eq!(verify(&one, &signed), Ok(signed.json()));
    // The id is the delivery's (printable ASCII: the key's non-ASCII
    // escaped), the same as the body's deliveryId otherwise.
    let id = signed.header("webhook-id").unwrap();
    assert_eq!(
        id.replace("\\u0020", " ").replace("\\u00e9", "é"),
        signed.json()["deliveryId"].as_str().unwrap()
    );
    // A changed body does not verify.
    let mut tampered = signed.clone();
    tampered.body = signed
        .body
        .iter()
        .map(|b| if *b == b'2' { b'3' } else { *b })
        .collect();
    assert!(verify(&one, &tampered).is_err());

    // A rotation: both secrets sign until the previous is retired.
    let (_, made, _) = put_secret(&s, None, "acme").await;
    let two = made["secret"].as_str().unwrap().to_string();
    assert_ne!(one, two);
    let during = delivered(&s, &posts, 3).await;
    assert_eq!(
        during
            .header("webhook-signature")
            .unwrap()
            .split(' ')
            .count(),
        2
    );
    assert_eq!(verify(&two, &during), Ok(during.json()));
    assert_eq!(verify(&one, &during), Ok(during.json()));

    let retire = "/v1/projects/acme/secrets/webhooks:retirePrevious";
    assert_eq!(
        s.post(retire, json!({})).await,
        (200, json!({"retired": true}))
    );
    assert_eq!(
        s.post(retire, json!({})).await,
        (200, json!({"retired": false}))
    );
    let after = delivered(&s, &posts, 4).await;
    assert_eq!(verify(&two, &after), Ok(after.json()));
    let refused = verify(&one, &after).unwrap_err();
    assert!(refused.contains("No matching signature"), "{refused}");

    // A webhook effect is signed too, its id the effect's.
    crate::effects::effector_on(&s, "/v1/projects/acme/streams/orders").await;
    crate::effects::request(
        &s,
        "/v1/projects/acme/streams/orders",
        json!([{"key": "notify", "webhook": {"url": format!("{base}/effect"), "body": {"hello": "world"}}}]),
    )
    .await;
    let effect = || -> Option<Raw> {
        posts
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.path == "/effect")
            .cloned()
    };
    wait_for("the effect's POST", Duration::from_secs(30), async || {
        effect().is_some()
    })
    .await;
    let effect = effect().unwrap();
    assert_eq!(
        verify(&two, &effect),
        Ok(json!({"hello": "world"})),
        "{effect:?}"
    );
    assert_eq!(
        effect.header("webhook-id"),
        effect.header("idempotency-key"),
        "the effect's id"
    );

    // No secret in the server's output.
    let log = s.all_logs();
    assert!(!log.contains(&one[6..]) && !log.contains(&two[6..]));
}

#[tokio::test]
async fn only_an_admin_makes_or_retires_a_secret_and_another_projects_webhooks_stay_unsigned() {
    // (Tokens turn private networks off for webhooks; the receiver is on
    // loopback.)
    let config = format!(
        "{}\n[webhooks]\ndeny-private-networks = false\n",
        crate::support::TOKENS
    );
    let s = Server::start_with(Some(&config), &[]);
    let (status, out, _) = put_secret(&s, Some("t-acme"), "acme").await;
    assert_eq!(status, 403, "{out}");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs an admin token"),
        "{out}"
    );
    let (status, _, _) = put_secret(&s, None, "acme").await;
    assert_eq!(status, 401);
    let (status, out) = s
        .post_as(
            Some("t-acme"),
            "/v1/projects/acme/secrets/webhooks:retirePrevious",
            json!({}),
        )
        .await;
    assert_eq!(status, 403, "{out}");
    let (status, out, _) = put_secret(&s, Some("t-admin"), "acme").await;
    assert_eq!(status, 200, "{out}");
    // The command line does the same.
    let (ok, out, err) = crate::support::cli_with(
        &s,
        &[
            "webhook-secret",
            "rotate",
            "--token",
            "t-admin",
            "--output",
            "json",
        ],
    );
    assert!(ok, "{err}");
    let made: Value = serde_json::from_str(&out).unwrap();
    assert!(
        made["secret"].as_str().unwrap().starts_with("whsec_"),
        "{out}"
    );
    let (ok, out, err) = crate::support::cli_with(
        &s,
        &[
            "webhook-secret",
            "retire-previous",
            "--token",
            "t-admin",
            "--output",
            "json",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({"retired": true})
    );
    let (ok, _, err) =
        crate::support::cli_with(&s, &["webhook-secret", "rotate", "--token", "t-acme"]);
    assert!(!ok && err.contains("needs an admin token"), "{err}");
    // Wrong methods and names, and a bad project, say what is there.
    let (status, out) = s
        .post_as(
            Some("t-admin"),
            "/v1/projects/acme/secrets/webhooks",
            json!({}),
        )
        .await;
    assert_eq!(status, 405, "{out}");
    let (status, out) = s
        .post_as(
            Some("t-admin"),
            "/v1/projects/acme/secrets/other",
            json!({}),
        )
        .await;
    assert_eq!(status, 404, "{out}");
    assert!(out["error"]["message"].as_str().unwrap().contains("other"));
    let (status, _, _) = put_secret(&s, Some("t-admin"), "Not_A_Project").await;
    assert_eq!(status, 400);

    // Another project has no secret: its webhooks go unsigned.
    let (base, posts) = receiver().await;
    let stream = "/v1/projects/other/streams/src";
    let sub = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "h", "receiver": {"action": "webhook-post",
            "url": format!("{base}/hook"), "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]});
    assert_eq!(
        s.post_as(Some("t-admin"), &format!("{stream}:append"), sub)
            .await
            .0,
        200
    );
    let event = json!({"events": [{"type": "x.y/e"}]});
    assert_eq!(
        s.post_as(Some("t-admin"), &format!("{stream}:append"), event)
            .await
            .0,
        200
    );
    wait_for("other's delivery", Duration::from_secs(30), async || {
        !posts.lock().unwrap().is_empty()
    })
    .await;
    let got = posts.lock().unwrap()[0].clone();
    assert_eq!(got.header("webhook-signature"), None, "{got:?}");
}
