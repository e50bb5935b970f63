//! Bearer tokens: project tokens, admin tokens, open mode.

use serde_json::json;

use crate::support::{assert_error, Server, TOKENS};

#[tokio::test]
async fn tokens_grant_their_projects_and_admin_everything() {
    let s = Server::start_with(Some(TOKENS), &[]);
    let ev = json!({"events": [{"type": "x.y/a"}]});
    let acme = "/v1/projects/acme/streams/s";

    assert_error(
        &s.post_as(None, &format!("{acme}:append"), ev.clone()).await,
        401,
        "unauthorized",
        "Authorization",
    );
    assert_error(
        &s.post_as(Some("wrong"), &format!("{acme}:append"), ev.clone())
            .await,
        401,
        "unauthorized",
        "unknown token",
    );
    assert_eq!(
        s.post_as(Some("t-acme"), &format!("{acme}:append"), ev.clone())
            .await
            .0,
        200
    );
    assert_eq!(
        s.get_as(Some("t-acme"), &format!("{acme}:state")).await.0,
        200
    );
    assert_error(
        &s.post_as(
            Some("t-acme"),
            "/v1/projects/other/streams/s:append",
            ev.clone(),
        )
        .await,
        403,
        "forbidden",
        "\"other\"",
    );
    assert_error(
        &s.get_as(Some("t-acme"), "/v1/global/streams/s:state").await,
        403,
        "forbidden",
        "global",
    );
    assert_eq!(
        s.post_as(Some("t-admin"), "/v1/global/streams/s:append", ev.clone())
            .await
            .0,
        200
    );
    assert_eq!(
        s.post_as(Some("t-admin"), "/v1/projects/other/streams/s:append", ev)
            .await
            .0,
        200
    );

    // Health needs no token; metrics need an admin token.
    assert_eq!(s.get_as(None, "/healthz").await.0, 200);
    assert_error(
        &s.get_as(None, "/metrics").await,
        401,
        "unauthorized",
        "Authorization",
    );
    assert_error(
        &s.get_as(Some("t-acme"), "/metrics").await,
        403,
        "forbidden",
        "admin",
    );
    assert_eq!(s.get_as(Some("t-admin"), "/metrics").await.0, 200);
    // Health's detail names streams: a token's own projects', every
    // project's for an admin; none without a token.
    assert_error(
        &s.get_as(None, "/healthz?detail=true").await,
        401,
        "unauthorized",
        "Authorization",
    );
    // A subscription of project other halts (its transform throws).
    let other = "/v1/projects/other/streams/h";
    let halting = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "h", "receiver": {"action": "copy-to-stream",
            "receivingStreamPath": "/h-out", "jsonataTransform": "$error(\"no\")",
            "delivery": {"start": "now", "onFailingEvent": "halt"}}}},
        {"type": "x.y/e"}]});
    assert_eq!(
        s.post_as(Some("t-admin"), &format!("{other}:append"), halting)
            .await
            .0,
        200
    );
    crate::support::wait_for(
        "the subscription of project other to halt",
        std::time::Duration::from_secs(30),
        async || {
            s.get_as(Some("t-admin"), "/healthz?detail=true").await.1["halted"]
                .as_array()
                .is_some_and(|h| !h.is_empty())
        },
    )
    .await;
    let (status, acme) = s.get_as(Some("t-acme"), "/healthz?detail=true").await;
    assert_eq!(status, 200, "{acme}");
    assert_eq!(acme["attention"], "none", "{acme}");
    let (status, all) = s.get_as(Some("t-admin"), "/healthz?detail=true").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["attention"], "1 halted, 0 failing", "{all}");
    assert_eq!(all["halted"][0]["project"], "other", "{all}");
}

#[tokio::test]
async fn open_mode_warns_and_admits_everyone() {
    let s = Server::start();
    assert_eq!(s.get_as(None, "/metrics").await.0, 200);
    assert_eq!(
        s.post_as(
            None,
            "/v1/global/streams/s:append",
            json!({"events": [{"type": "x.y/a"}]})
        )
        .await
        .0,
        200
    );
    assert!(s.log().contains("no tokens configured"), "{}", s.log());
}

/// One project token of each scope.
const SCOPED: &str = r#"
[[tokens]]
token = "t-acme"
projects = ["acme"]

[[tokens]]
token = "t-producer"
projects = ["acme"]
scope = "append"
"#;

#[tokio::test]
async fn a_token_of_scope_append_appends_and_reads_events_but_configures_nothing() {
    let s = Server::start_with(Some(SCOPED), &[]);
    let producer = Some("t-producer");
    let stream = "/v1/projects/acme/streams/orders";
    // Events, an error line among them: appended and read.
    let events = json!({"events": [{"type": "x.y/order"},
        {"type": "events.iterate.com/stream/error-occurred", "payload": {"message": "seen"}}]});
    let (status, out) = s
        .post_as(producer, &format!("{stream}:append"), events)
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, page) = s.get_as(producer, &format!("{stream}:events")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"].as_array().unwrap().len(), 3, "{page}");

    // Configuration: refused, naming the scope and what was asked.
    let subscription = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "copy", "receiver": {"action": "copy-to-stream",
            "receivingStreamPath": "/copy", "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]});
    let refused = s
        .post_as(producer, &format!("{stream}:append"), subscription.clone())
        .await;
    assert_error(
        &refused,
        403,
        "scope-insufficient",
        "appending \"events.iterate.com/stream/subscription-configured\" on stream \"/orders\" needs a token of scope \"configure\"; this token's scope is \"append\"",
    );
    let pause = json!({"events": [{"type": "x.y/order"},
        {"type": "events.iterate.com/stream/paused", "payload": {"reason": "mine"}}]});
    assert_error(
        &s.post_as(producer, &format!("{stream}:append"), pause)
            .await,
        403,
        "scope-insufficient",
        "events.iterate.com/stream/paused",
    );
    assert_error(
        &s.post_as(
            producer,
            "/v1/projects/acme/streams/copy:subscribeToEventsFrom",
            json!({"sourceStreamPath": "/orders", "subscriptionKey": "c"}),
        )
        .await,
        403,
        "scope-insufficient",
        "subscribing",
    );
    assert_error(
        &s.post_as(producer, "/v1/projects/acme/effects/1:retry", json!({}))
            .await,
        403,
        "scope-insufficient",
        "retrying effect 1",
    );
    let deploy = reqwest::Client::new()
        .put(format!("{}/v1/projects/acme/components/counter", s.url))
        .bearer_auth("t-producer")
        .header("content-type", "application/wasm")
        .body(crate::support::guest("counter"))
        .send()
        .await
        .unwrap();
    let status = deploy.status().as_u16();
    let body: serde_json::Value = deploy.json().await.unwrap();
    assert_error(
        &(status, body),
        403,
        "scope-insufficient",
        "deploying component \"counter\"",
    );
    // Nothing of it landed: the log holds the events appended above only.
    let (_, page) = s.get_as(Some("t-acme"), &format!("{stream}:events")).await;
    assert_eq!(page["events"].as_array().unwrap().len(), 3, "{page}");
    // A token of scope configure (the default) does all of it.
    let (status, out) = s
        .post_as(Some("t-acme"), &format!("{stream}:append"), subscription)
        .await;
    assert_eq!(status, 200, "{out}");
}
