//! Direct ITX calls to exported WIT functions of a real component, with
//! every WIT type kind mapped from JSON and back.

use serde_json::{json, Value};

use crate::subscriptions::wait_for_type;
use crate::support::{assert_error, guest, wait_for, Server};

async fn deployed() -> Server {
    let s = Server::start_with(Some("[delivery]\ntimeout-ms = 500\n"), &[]);
    let (status, out) = s.deploy("acme", "kinds", guest("kinds")).await;
    assert_eq!(status, 200, "{out}");
    s
}

fn call(function: &str, args: Value) -> Value {
    json!({"expression": ["components", ["get", "kinds"], function], "args": args})
}

fn everything() -> Value {
    json!({
        "flag": true, "tiny": -128, "small": 255, "short": -32768, "ushort": 65535,
        "int": -2147483648i64, "uint": 4294967295u64, "big": 18446744073709551615u64,
        "neg": -9223372036854775808i64, "ratio": 1.5, "precise": "-Infinity", "letter": "ß",
        "name": "héllo \"wave\"", "items": [1, 2, 3], "pair": ["p", 7],
        "point": {"x": -1, "y": 2, "labelText": "origin"}, "color": "green",
        "shape": {"circle": 2.5}, "maybe": null, "outcome": {"err": "nope"}, "perms": ["read", "exec"]
    })
}

#[tokio::test]
async fn every_wit_type_kind_round_trips() {
    let s = deployed().await;
    let (status, out) = s
        .post(
            "/v1/projects/acme/itx",
            call("echo-everything", json!([everything()])),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["result"], everything());
    // camelCase method names, kebab-case record fields on input, other cases.
    let mut kebab = everything();
    let point = kebab["point"].as_object_mut().unwrap();
    let label = point.remove("labelText").unwrap();
    point.insert("label-text".into(), label);
    kebab["shape"] = json!({"nothing": null});
    kebab["maybe"] = json!("some");
    kebab["outcome"] = json!({"ok": 3});
    kebab["precise"] = json!("NaN");
    let (status, out) = s
        .post(
            "/v1/projects/acme/itx",
            call("echoEverything", json!([kebab])),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["result"]["point"]["labelText"], "origin");
    assert_eq!(out["result"]["shape"], json!({"nothing": null}));
    assert_eq!(out["result"]["maybe"], "some");
    assert_eq!(out["result"]["outcome"], json!({"ok": 3}));
    assert_eq!(out["result"]["precise"], "NaN");
    assert_eq!(
        s.post("/v1/projects/acme/itx", call("add", json!([2, 3])))
            .await,
        (200, json!({"result": 5}))
    );
    assert_eq!(
        s.post("/v1/projects/acme/itx", call("divide", json!([5, 2])))
            .await,
        (200, json!({"result": 2.5}))
    );
}

#[tokio::test]
async fn errors_name_the_argument_path_and_expected_type() {
    let s = deployed().await;
    let itx = "/v1/projects/acme/itx";
    let mut bad_point = everything();
    bad_point["point"]["x"] = json!("one");
    let mut bad_small = everything();
    bad_small["small"] = json!(256);
    let mut bad_enum = everything();
    bad_enum["color"] = json!("purple");
    let mut bad_flag = everything();
    bad_flag["perms"] = json!(["fly"]);
    let mut extra = everything();
    extra["extra"] = json!(1);
    let mut missing = everything();
    missing.as_object_mut().unwrap().remove("name");
    for (arg, mention) in [
        (bad_point, "args[0].point.x: expected an integer (s32)"),
        (
            bad_small,
            "args[0].small: expected an integer in the range of u8",
        ),
        (
            bad_enum,
            "args[0].color: expected enum (red | green | blue)",
        ),
        (bad_flag, "args[0].perms[0]"),
        (extra, "args[0].extra: unknown field"),
        (missing, "args[0].name: missing field of type string"),
    ] {
        assert_error(
            &s.post(itx, call("echo-everything", json!([arg]))).await,
            400,
            "invalid-argument",
            mention,
        );
    }
    assert_error(
        &s.post(itx, call("add", json!([1]))).await,
        400,
        "invalid-argument",
        "takes 2 argument(s), got 1",
    );
    assert_error(
        &s.post(itx, call("nope", json!([]))).await,
        404,
        "function-not-found",
        "\"nope\"",
    );
    assert_error(
        &s.post(
            itx,
            json!({"expression": ["components", ["get", "ghost"], "add"], "args": [1, 2]}),
        )
        .await,
        404,
        "component-not-found",
        "\"ghost\"",
    );
    assert_error(
        &s.post(itx, json!({"expression": ["workers", "add"], "args": []}))
            .await,
        400,
        "invalid-expression",
        "unknown root property \"workers\"",
    );
    assert_error(
        &s.post(itx, json!({"expression": ["components", "__proto__", "x"]}))
            .await,
        400,
        "invalid-expression",
        "__proto__",
    );
    assert_error(
        &s.post(itx, json!({"expression": ["components", ["get", "kinds"]]}))
            .await,
        400,
        "invalid-expression",
        "property step",
    );
    assert_error(
        &s.post(itx, call("divide", json!([1, 0]))).await,
        422,
        "itx-failed",
        "cannot divide 1 by zero",
    );
    assert_error(
        &s.post(itx, call("boom", json!([]))).await,
        422,
        "itx-failed",
        "trapped",
    );
    // The host keeps serving.
    assert_eq!(s.post(itx, call("add", json!([1, 1]))).await.1["result"], 2);
}

fn itx_subscription(on_failing: &str) -> Value {
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured", "payload": {
        "subscriptionKey": "itx", "filter": {"eventTypes": ["x.y/e"]},
        "receiver": {"action": "itx-call", "expression": ["components", ["get", "kinds"], "processEventBatch"],
                     "delivery": {"start": "now", "onFailingEvent": on_failing}}}}]})
}

/// The batches the kinds guest printed: (delivery id, offsets).
fn batches(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split("itx batch delivery-id=").nth(1)?;
            let (id, rest) = rest.split_once(' ')?;
            let offsets = rest.split("offsets=").nth(1)?.split(' ').next()?;
            Some((id.to_string(), offsets.to_string()))
        })
        .collect()
}

#[tokio::test]
async fn an_itx_receiver_gets_awaited_batches_and_skips_an_event_after_three_lone_attempts() {
    // Enough attempts that the skip policy, not the retry bound, decides.
    let config = "[delivery]\nmax-attempts = 8\nbackoff-base-ms = 5\nbackoff-max-ms = 20\ntimeout-ms = 5000\n";
    let s = Server::start_with(Some(config), &[]);
    s.deploy("acme", "kinds", guest("kinds")).await;
    let src = "/v1/projects/acme/streams/itx-src";
    s.post(&format!("{src}:append"), itx_subscription("skip"))
        .await;
    s.post(
        &format!("{src}:append"),
        json!({"events": [
            {"type": "x.y/e", "payload": {"n": 1}}, {"type": "x.y/e", "payload": {"bad": true}},
            {"type": "x.y/e", "payload": {"n": 3}},
        ]}),
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !batches(&s.log()).iter().any(|(_, o)| o == "5") {
        assert!(
            std::time::Instant::now() < deadline,
            "no batch with offset 5; log:\n{}",
            s.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let seen = batches(&s.log());
    let offsets: Vec<&str> = seen.iter().map(|(_, o)| o.as_str()).collect();
    assert_eq!(offsets[0], "3,4,5", "a full batch first: {offsets:?}");
    assert_eq!(
        offsets.iter().filter(|o| **o == "4").count(),
        3,
        "the failing event alone, exactly 3 times: {offsets:?}"
    );
    assert_eq!(*offsets.last().unwrap(), "5");
    let (state, _) = (s.get(&format!("{src}:state")).await.1, ());
    assert!(seen[0].0.starts_with(state["streamId"].as_str().unwrap()));
    assert!(seen[0].0.ends_with(":3-5"), "{:?}", seen[0]);
    // The skip line commits in the actor's next write group, which can land
    // after the next batch (offset 5) was delivered: wait for it.
    let lines = wait_for_type(&s, "/itx-src", "events.iterate.com/stream/error-occurred").await;
    let skip = &lines[0];
    assert!(skip["payload"]["message"]
        .as_str()
        .unwrap()
        .contains("skipped failing event at offset 4 after 3 event-specific attempts"));
}

#[tokio::test]
async fn a_final_failure_halts_at_once_under_halt_and_is_skipped_at_once_under_skip() {
    let s = Server::start_with(Some(crate::subscriptions::FAST), &[]);
    s.deploy("acme", "kinds", guest("kinds")).await;
    let src = "/v1/projects/acme/streams/itx-fatal";
    s.post(&format!("{src}:append"), itx_subscription("halt"))
        .await;
    s.post(
        &format!("{src}:append"),
        json!({"events": [{"type": "x.y/e", "payload": {"fatal": true}}]}),
    )
    .await;
    let halted = &s
        .wait_halted(src, "itx", std::time::Duration::from_secs(20))
        .await;
    assert_eq!(halted["attempts"], 1);
    assert!(
        halted["error"]
            .as_str()
            .unwrap()
            .contains("event 3 is fatal"),
        "{halted}"
    );
    let (_, rt) = s.get(&format!("{src}:runtime")).await;
    assert!(rt["subscriptions"]["itx"]["lastError"]
        .as_str()
        .unwrap()
        .contains("is fatal"));

    // Under skip, the same final failure is skipped at once (one attempt),
    // and the events after it are delivered.
    let skipping = "/v1/projects/acme/streams/itx-skip";
    s.post(&format!("{skipping}:append"), itx_subscription("skip"))
        .await;
    let (status, out) = s
        .post(
            &format!("{skipping}:append"),
            json!({"events": [{"type": "x.y/e", "payload": {"fatal": true}}, {"type": "x.y/e", "payload": {"n": 1}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let good = out["events"][1]["offset"].as_u64().unwrap();
    s.wait_acknowledged(skipping, "itx", good, "the event after the skipped one")
        .await;
    s.assert_skipped_at_once(skipping, "itx", &["is fatal"])
        .await;
    // Configure-time checks: unknown roots are refused.
    let mut bad = itx_subscription("halt");
    bad["events"][0]["payload"]["receiver"]["expression"] = json!(["workers", ["get", "w"], "run"]);
    assert_error(
        &s.post(&format!("{src}:append"), bad).await,
        400,
        "invalid-expression",
        "unknown root property \"workers\"",
    );
}

#[tokio::test]
async fn the_transform_shapes_each_event_of_an_itx_batch() {
    let s = Server::start_with(Some(crate::subscriptions::FAST), &[]);
    s.deploy("acme", "kinds", guest("kinds")).await;
    let src = "/v1/projects/acme/streams/itx-transform";
    let mut sub = itx_subscription("halt");
    // The guest fails on `"bad": true`; the transform replaces the payload,
    // so a bad event reaches the guest clean.
    sub["events"][0]["payload"]["receiver"]["jsonataTransform"] =
        json!("{\"payload\": {\"was\": payload.n}}");
    let (status, out) = s.post(&format!("{src}:append"), sub).await;
    assert_eq!(status, 200, "{out}");
    s.post(
        &format!("{src}:append"),
        json!({"events": [{"type": "x.y/e", "payload": {"bad": true, "n": 7}}]}),
    )
    .await;
    crate::support::wait_for(
        "the transformed event to be acknowledged",
        std::time::Duration::from_secs(20),
        async || {
            s.get(&format!("{src}:runtime")).await.1["subscriptions"]["itx"]["acknowledgedOffset"]
                == 3
        },
    )
    .await;
    let (_, rt) = s.get(&format!("{src}:runtime")).await;
    assert_eq!(
        rt["subscriptions"]["itx"]["attempt"], 0,
        "delivered at the first attempt: {rt}"
    );
}

/// What the kinds guest printed of each batch: (subscription key, run,
/// offsets), in call order.
fn stamps(log: &str) -> Vec<(String, u64, String)> {
    log.lines()
        .filter(|l| l.contains("itx batch delivery-id="))
        .filter_map(|l| {
            let field = |name: &str| Some(l.split(name).nth(1)?.split(' ').next()?.to_string());
            Some((
                field("subscription-key=")?,
                field("run=")?.parse().ok()?,
                field("offsets=")?,
            ))
        })
        .collect()
}

/// Every ITX batch carries its run's stamp as fields (`subscriptionKey`,
/// `cursorChangedAtSourceOffset`, beside the stream's id and creation
/// time): once a cursor set starts a new run, its batches (the history
/// again, then new events) carry the new stamp, and with nothing of the
/// old run in flight none of the old stamp follows.
#[tokio::test]
async fn itx_batches_carry_their_runs_stamp_and_a_new_run_redelivers_under_its_own() {
    let s = deployed().await;
    let src = "/v1/projects/acme/streams/itx-stamp";
    let (status, out) = s
        .post(&format!("{src}:append"), itx_subscription("halt"))
        .await;
    assert_eq!(status, 200, "{out}");
    let configured_at = out["events"][0]["offset"].as_u64().unwrap();
    let events = json!({"events": [
        {"type": "x.y/e", "payload": {"n": 1}}, {"type": "x.y/e", "payload": {"n": 2}},
    ]});
    s.post(&format!("{src}:append"), events.clone()).await;
    let delivered = |log: &str, run: u64, offset: &str| {
        stamps(log)
            .iter()
            .any(|(_, r, o)| *r == run && o.split(',').any(|x| x == offset))
    };
    let first = (configured_at + 1).to_string();
    let twenty = std::time::Duration::from_secs(20);
    wait_for("the first run's batch", twenty, async || {
        delivered(&s.log(), configured_at, &first)
    })
    .await;
    // A new run from the start: the same events again, under a new stamp,
    // while more arrive.
    let (status, set) = s
        .post(
            &format!("{src}:setSubscriptionCursor"),
            json!({"subscriptionKey": "itx", "afterOffset": 0}),
        )
        .await;
    assert_eq!(status, 200, "{set}");
    let run = set["subscriptionCursorSetEvent"]["offset"]
        .as_u64()
        .unwrap();
    assert!(run > configured_at);
    let (_, more) = s.post(&format!("{src}:append"), events).await;
    let last = more["events"][1]["offset"].as_u64().unwrap().to_string();
    wait_for("the new run's batches", twenty, async || {
        delivered(&s.log(), run, &last)
    })
    .await;
    let seen = stamps(&s.log());
    assert!(seen.iter().all(|(key, _, _)| key == "itx"), "{seen:?}");
    assert!(
        seen.iter()
            .all(|(_, r, _)| *r == configured_at || *r == run),
        "{seen:?}"
    );
    let first_new = seen.iter().position(|(_, r, _)| *r == run).unwrap();
    assert!(
        seen[first_new..].iter().all(|(_, r, _)| *r == run),
        "a batch of the superseded run after the new run's first: {seen:?}"
    );
    // The new run delivers the history again, from the first event.
    assert!(delivered(&s.log(), run, &first), "{seen:?}");
}
