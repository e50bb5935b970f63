//! Every subscription rejection of REFERENCE.md answers 4xx, names the bad
//! value, and commits nothing.

use serde_json::{json, Value};

use crate::subscriptions::{ev, subscribe, FAST, P};
use crate::support::{assert_error, Server};

fn configured(receiver: Value) -> Value {
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "k", "receiver": receiver}}]})
}

fn copy_to(path: &str) -> Value {
    json!({"action": "copy-to-stream", "receivingStreamPath": path,
           "delivery": {"start": "now", "onFailingEvent": "halt"}})
}

#[tokio::test]
async fn configuration_rejections_commit_nothing() {
    let s = Server::start_with(Some(FAST), &[]);
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    let append = format!("{P}/src:append");
    let webhook = |url: &str| json!({"action": "webhook-post", "url": url, "delivery": {"start": "now", "onFailingEvent": "skip"}});
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            configured(
                json!({"action": "copy-to-stream", "receivingStreamPath": "/dst",
                "delivery": {"onFailingEvent": "halt"}}),
            ),
            400,
            "invalid-request",
            "payload.receiver.delivery.start is missing",
        ),
        (
            configured(json!({"action": "webhook-post", "url": "http://x/h",
                "delivery": {"start": "now", "onFailingEvent": "halt", "retries": 3}})),
            400,
            "invalid-request",
            "payload.receiver.delivery.retries: unknown field `retries`",
        ),
        (
            configured(json!({"action": "itx-call",
                "delivery": {"start": "now", "onFailingEvent": "halt"}})),
            400,
            "invalid-request",
            "payload.receiver.expression is missing",
        ),
        (
            configured(copy_to("/src")),
            400,
            "invalid-request",
            "a stream cannot receive events from itself",
        ),
        (
            configured(copy_to("/x/../src")),
            400,
            "invalid-request",
            "a stream cannot receive events from itself",
        ),
        (
            configured(copy_to("/a/../../b")),
            400,
            "invalid-request",
            "/a/../../b",
        ),
        (
            configured(
                json!({"action": "copy-to-stream", "receivingStreamPath": "/dst",
                "delivery": {"start": "now", "onFailingEvent": "skip"}}),
            ),
            400,
            "invalid-request",
            "copy-to-stream cannot skip a failing event",
        ),
        (
            configured(
                json!({"action": "processor-wake", "expression": ["components", ["get", "c"], "wake"],
                "jsonataTransform": "$"}),
            ),
            400,
            "invalid-request",
            "processor-wake never accepts a jsonataTransform",
        ),
        (
            configured(webhook("ftp://example.com/x")),
            400,
            "invalid-request",
            "ftp://example.com/x",
        ),
        (
            configured(webhook("not a url")),
            400,
            "invalid-request",
            "not a url",
        ),
        (
            configured(
                json!({"action": "itx-call", "expression": ["workers", ["get", "w"]],
                "delivery": {"start": "now", "onFailingEvent": "halt"}}),
            ),
            400,
            "invalid-expression",
            "property step",
        ),
        (
            configured(
                json!({"action": "itx-call", "expression": ["workers", "__proto__", "run"],
                "delivery": {"start": "now", "onFailingEvent": "halt"}}),
            ),
            400,
            "invalid-expression",
            "__proto__",
        ),
        (
            configured(json!({"action": "processor-wake", "expression": ["constructor", "wake"]})),
            400,
            "invalid-expression",
            "constructor",
        ),
        (
            configured(
                json!({"action": "copy-to-stream", "receivingStreamPath": "/dst", "colour": "red",
                "delivery": {"start": "now", "onFailingEvent": "halt"}}),
            ),
            400,
            "invalid-request",
            "colour",
        ),
        (
            configured(json!({"action": "teleport"})),
            400,
            "invalid-request",
            "teleport",
        ),
        (
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"receiver": copy_to("/dst"), "extra": true}}]}),
            400,
            "invalid-request",
            "extra",
        ),
        (
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "k", "filter": {"jsonataCondition": "payload.total > "},
                            "receiver": copy_to("/dst")}}]}),
            400,
            "invalid-jsonata",
            "invalid JSONata expression (S0207, position",
        ),
        (
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "  ", "receiver": copy_to("/dst")}}]}),
            400,
            "invalid-request",
            "subscriptionKey",
        ),
        (
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": " orders ", "receiver": copy_to("/dst")}}]}),
            400,
            "invalid-request",
            "subscriptionKey \" orders \" has leading or trailing whitespace",
        ),
        (
            json!({"events": [{"type": "events.iterate.com/stream/subscription-cursor-set",
                "payload": {"subscriptionKey": "nope", "afterOffset": 1}}]}),
            404,
            "subscription-not-found",
            "subscription \"nope\" does not exist",
        ),
        (
            json!({"events": [{"type": "events.iterate.com/stream/subscription-removed",
                "payload": {"subscriptionKey": "nope", "reason": "requested"}}]}),
            404,
            "subscription-not-found",
            "\"nope\" does not exist",
        ),
        (
            json!({"events": [{"type": "events.iterate.com/stream/subscription-delivery-halted",
                "payload": {"subscriptionKey": "k", "reason": "delivery-failed", "afterOffset": 1, "attempts": 1}}]}),
            403,
            "platform-authored",
            "subscription-delivery-halted",
        ),
    ];
    for (body, status, code, mention) in cases {
        assert_error(&s.post(&append, body.clone()).await, status, code, mention);
    }
    let (_, state) = s.get(&format!("{P}/src:state")).await;
    assert_eq!(state["eventCount"], 2, "nothing committed");
    assert_eq!(state["subscriptions"]["outbound"]["byKey"], json!({}));

    // Webhooks need a project stream.
    assert_error(
        &s.post(
            "/v1/global/streams/src:append",
            configured(webhook("https://example.com/hook")),
        )
        .await,
        400,
        "invalid-request",
        "webhook subscriptions require a project stream",
    );
    // A valid webhook, ITX call and processor wake are stored.
    for (key, receiver) in [
        ("hook", webhook("https://example.com/hook")),
        (
            "itx",
            json!({"action": "itx-call", "expression": ["components", ["get", "billing"], "processEventBatch"],
                       "delivery": {"start": "beginning", "onFailingEvent": "skip"}}),
        ),
        (
            "wake",
            json!({"action": "processor-wake", "expression": ["components", ["get", "counter"], "wake"]}),
        ),
    ] {
        let body = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": key, "receiver": receiver}}]});
        let (status, out) = s.post(&append, body).await;
        assert_eq!(status, 200, "{out}");
    }
    let (_, state) = s.get(&format!("{P}/src:state")).await;
    let keys: Vec<_> = state["subscriptions"]["outbound"]["byKey"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, vec!["hook", "itx", "wake"]);
}

#[tokio::test]
async fn command_rejections() {
    let s = Server::start_with(Some(FAST), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
    )
    .await;
    let (_, before) = s.get(&format!("{P}/src:state")).await;
    assert_error(
        &s.post(
            &format!("{P}/src:setSubscriptionCursor"),
            json!({"subscriptionKey": "k", "afterOffset": 99}),
        )
        .await,
        400,
        "invalid-request",
        "afterOffset 99 is beyond this stream's current maximum offset 2",
    );
    for method in ["setSubscriptionCursor", "setSubscriptionCursorAndResume"] {
        assert_error(
            &s.post(
                &format!("{P}/src:{method}"),
                json!({"subscriptionKey": "nope", "afterOffset": 0}),
            )
            .await,
            404,
            "subscription-not-found",
            "subscription \"nope\" does not exist",
        );
    }
    assert_error(
        &s.post(
            &format!("{P}/src:resumeSubscription"),
            json!({"subscriptionKey": "nope"}),
        )
        .await,
        404,
        "subscription-not-found",
        "does not exist",
    );
    assert_error(
        &s.post(
            &format!("{P}/src:setSubscriptionCursor"),
            json!({"subscriptionKey": "k", "afterOffset": -1}),
        )
        .await,
        400,
        "invalid-request",
        "afterOffset",
    );
    assert_error(
        &s.post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/dst", "subscriptionKey": "x"}),
        )
        .await,
        400,
        "invalid-request",
        "a stream cannot receive events from itself",
    );
    assert_error(
        &s.post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/src", "subscriptionKey": "x", "start": "later"}),
        )
        .await,
        400,
        "invalid-request",
        "later",
    );
    assert_error(
        &s.post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/src", "subscriptionKey": "x", "jsonataTransform": "{"}),
        )
        .await,
        400,
        "invalid-jsonata",
        "invalid JSONata expression (",
    );
    assert_error(
        &s.post(
            &format!("{P}/dst:subscribeToEventsFrom"),
            json!({"sourceStreamPath": "/src", "subscriptionKey": "x", "bogus": 1}),
        )
        .await,
        400,
        "invalid-request",
        "bogus",
    );
    // The source names a different receiver: not this stream's to remove.
    assert_error(
        &s.post(
            &format!("{P}/other:unsubscribeFromEvents"),
            json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
        )
        .await,
        400,
        "invalid-request",
        "not a copy to \"/other\"",
    );
    // Commands on a stream that does not exist create nothing.
    assert_error(
        &s.post(
            &format!("{P}/ghost:resumeSubscription"),
            json!({"subscriptionKey": "k"}),
        )
        .await,
        404,
        "subscription-not-found",
        "does not exist",
    );
    assert_error(
        &s.get(&format!("{P}/ghost:state")).await,
        404,
        "stream-not-found",
        "/ghost",
    );
    let (_, after) = s.get(&format!("{P}/src:state")).await;
    assert_eq!(before, after);
}

#[tokio::test]
async fn public_callers_cannot_forge_copies_or_halts() {
    let s = Server::start_with(Some(FAST), &[]);
    let hop = json!({"projectId": "acme", "path": "/src", "streamId": "s", "streamCreatedAt": "2026-11-30T00:00:00.000Z",
        "offset": 2, "type": "x.y/a", "createdAt": "2026-11-30T00:00:00.000Z", "subscriptionKey": "k",
        "cursorChangedAtSourceOffset": 1});
    assert_error(
        &s.post(
            &format!("{P}/dst:append"),
            json!({"events": [{"type": "x.y/a", "source": {"copiedFrom": [hop]}}]}),
        )
        .await,
        403,
        "platform-authored",
        "source.copiedFrom",
    );
    assert_error(
        &s.post(&format!("{P}/dst:append"), json!({"events": [{"type": "events.iterate.com/stream/subscription-delivery-halted",
            "payload": {"subscriptionKey": "k", "reason": "delivery-failed", "afterOffset": 0, "attempts": 1}}]})).await,
        403,
        "platform-authored",
        "subscription-delivery-halted",
    );
}
