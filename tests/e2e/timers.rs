//! Time end to end: effects that wait for their `not-before`, timers as
//! delayed appends to a processor's own stream (the `reminder` example),
//! `cancel`, and components built against `streamhost:processor@0.2.0`
//! running beside 0.3.0's.

use std::time::Duration;

use serde_json::{json, Value};

use crate::effects::{all_effects, deploy, effector_on, request, settled, wake, Receiver, EFFECTS};
use crate::support::{assert_error, component_version, guest, shadow_ready, wait_for, Server};

const ORDERS: &str = "/v1/projects/acme/streams/orders";
const FX: &str = "/v1/projects/acme/effects";
const DUE: &str = "orders.example/payment-reminder-due";

/// Milliseconds since the epoch of an RFC 3339 time the API served.
fn ms(time: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(time.as_str().unwrap_or_else(|| panic!("{time}")))
        .unwrap()
        .timestamp_millis()
}

/// The effect of the project with `key`.
async fn effect(s: &Server, key: &str) -> Value {
    all_effects(s, "")
        .await
        .into_iter()
        .find(|e| e["key"] == key)
        .unwrap_or_else(|| panic!("no effect {key:?}"))
}

/// Appends one event to the orders stream; answers it as committed.
async fn order(s: &Server, event_type: &str, payload: Value) -> Value {
    let (status, out) = s
        .post(
            &format!("{ORDERS}:append"),
            json!({"events": [{"type": event_type, "payload": payload}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let offset = out["events"][0]["offset"].as_u64().unwrap();
    let events = s.all_events(ORDERS).await;
    events
        .into_iter()
        .find(|e| e["offset"] == offset)
        .expect("the appended event")
}

/// The reminder processor's instance on the orders stream once it has folded
/// through `offset`.
async fn folded_through(s: &Server, offset: u64) -> Value {
    let mut seen = Value::Null;
    wait_for(
        &format!("the reminder to fold through offset {offset}"),
        Duration::from_secs(30),
        async || {
            let (_, p) = s.get(&format!("{ORDERS}:processors/reminder")).await;
            let done = p["checkpointOffset"].as_u64().is_some_and(|o| o >= offset);
            seen = p;
            done
        },
    )
    .await;
    seen
}

#[tokio::test]
async fn a_reminder_fires_once_when_due_and_a_payment_cancels_it_across_a_kill() {
    let mut s = Server::start_with(Some(EFFECTS), &[]);
    deploy(&s, "reminder", "reminder").await;
    wake(&s, ORDERS, "r", "reminder").await;
    let a = order(
        &s,
        "orders.example/order-placed",
        json!({"orderId": "A", "remindAfterMs": 3000}),
    )
    .await;
    order(
        &s,
        "orders.example/order-placed",
        json!({"orderId": "B", "remindAfterMs": 3000}),
    )
    .await;
    order(
        &s,
        "orders.example/order-placed",
        json!({"orderId": "C", "remindAfterMs": 3_600_000}),
    )
    .await;
    let paid = order(&s, "orders.example/order-paid", json!({"orderId": "B"})).await;
    folded_through(&s, paid["offset"].as_u64().unwrap()).await;

    // The timer's time is the order's own `createdAt` plus its delay.
    let timer_a = effect(&s, "reminder:A").await;
    assert_eq!(timer_a["status"], "pending", "{timer_a}");
    assert_eq!(
        ms(&timer_a["notBefore"]),
        ms(&a["createdAt"]) + 3000,
        "{timer_a}"
    );
    assert_eq!(timer_a["nextAttemptAt"], timer_a["notBefore"], "{timer_a}");
    assert_eq!(timer_a["type"], "PaymentReminder", "{timer_a}");
    // The payment cancelled B's in the commit of its fold.
    assert_eq!(effect(&s, "reminder:B").await["status"], "cancelled");
    let cancel = effect(&s, "cancel:reminder:B").await;
    assert_eq!(cancel["status"], "succeeded", "{cancel}");
    assert_eq!(cancel["target"], json!({"cancel": {"key": "reminder:B"}}));
    // What will run by A's time: A, not C (an hour later), not B.
    let by_a = all_effects(
        &s,
        &format!("&due=before:{}", timer_a["notBefore"].as_str().unwrap()),
    )
    .await;
    let keys: Vec<&str> = by_a.iter().filter_map(|e| e["key"].as_str()).collect();
    assert_eq!(keys, ["reminder:A"], "{by_a:?}");
    assert!(s.metric("streamhost_effects{status=\"waiting\"}").await >= 2);

    // SIGKILL while A waits for its time: it fires after the restart, once.
    assert_eq!(effect(&s, "reminder:A").await["status"], "pending");
    s.restart();
    let reminded = async |s: &Server| {
        let (_, p) = s.get(&format!("{ORDERS}:processors/reminder")).await;
        p["state"]["reminded"].clone()
    };
    wait_for(
        "A's reminder to be folded",
        Duration::from_secs(30),
        async || reminded(&s).await == json!(["A"]),
    )
    .await;
    let due = s.events_of_type(ORDERS, DUE).await;
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(due[0]["payload"], json!({"orderId": "A"}));
    assert_eq!(
        due[0]["source"]["effect"]["key"], "reminder:A",
        "{}",
        due[0]
    );
    assert!(
        ms(&due[0]["createdAt"]) >= ms(&timer_a["notBefore"]),
        "appended at or after its time: {} vs {}",
        due[0],
        timer_a
    );
    assert_eq!(settled(&s, "reminder:A", "succeeded").await["attempts"], 1);
    assert_eq!(effect(&s, "reminder:C").await["status"], "pending");
    assert!(s.metric("streamhost_effect_due_lag_seconds_count").await >= 1);

    // A refold agrees with what the wakes did, timers and all.
    let (status, verified) = s
        .post(
            &format!("{ORDERS}:verifyProcessor"),
            json!({"component": "reminder"}),
        )
        .await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["matches"], true, "{verified}");

    // A shadow of a new version folds the same state, and holds the timer
    // of an order placed after it started, with the same time as the live
    // version's.
    let (status, out) = s
        .deploy_with_query(
            "acme",
            "reminder",
            component_version(guest("reminder"), 1),
            "refold=shadow",
        )
        .await;
    assert_eq!(status, 200, "{out}");
    shadow_ready(&s, ORDERS, "reminder").await;
    let d = order(
        &s,
        "orders.example/order-placed",
        json!({"orderId": "D", "remindAfterMs": 3_600_000}),
    )
    .await;
    folded_through(&s, d["offset"].as_u64().unwrap()).await;
    let shadow = shadow_ready(&s, ORDERS, "reminder").await;
    assert_eq!(shadow["stateDiff"], json!([]), "{shadow}");
    let held = &shadow["heldEffects"];
    assert_eq!(held["count"], 1, "{shadow}");
    assert_eq!(held["sample"][0]["key"], "reminder:D", "{shadow}");
    let live_d = effect(&s, "reminder:D").await;
    assert_eq!(
        held["sample"][0]["notBefore"], live_d["notBefore"],
        "{shadow}"
    );
    assert_eq!(ms(&live_d["notBefore"]), ms(&d["createdAt"]) + 3_600_000);
}

#[tokio::test]
async fn effects_wait_for_their_time_keep_their_envelope_and_a_time_too_far_fails_the_fold() {
    let s = Server::start_with(Some(EFFECTS), &[]);
    let r = Receiver::start().await;
    const SRC: &str = "/v1/projects/acme/streams/jobs";
    effector_on(&s, SRC).await;
    request(
        &s,
        SRC,
        json!([
            {"key": "past", "append": {"streamPath": "/out", "type": "x.y/past", "payload": {}},
             "notBefore": 1000},
            {"key": "later", "webhook": {"url": format!("{}/ok/later", r.base), "body": {"n": 1}},
             "afterMs": 3_600_000, "type": "Remind", "metadata": {"m": 1}, "group": "g1"},
            {"key": "nothing", "cancel": "no-such-effect"},
        ]),
    )
    .await;
    // A time in the past runs at once.
    let past = settled(&s, "past", "succeeded").await;
    assert_eq!(past["notBefore"], "1970-01-01T00:00:01.000Z", "{past}");
    // A time an hour ahead waits, its envelope kept and served.
    let later = effect(&s, "later").await;
    assert_eq!(later["status"], "pending", "{later}");
    assert_eq!(
        (&later["type"], &later["metadata"], &later["group"]),
        (&json!("Remind"), &json!({"m": 1}), &json!("g1")),
        "{later}"
    );
    assert_eq!(later["target"]["webhook"]["body"], json!({"n": 1}));
    let not_before = ms(&later["notBefore"]);
    let now = chrono::Utc::now().timestamp_millis();
    assert!(not_before > now + 3_500_000, "{later}");
    let before = |t: i64| format!("&due=before:{t}");
    assert!(all_effects(&s, &before(now)).await.is_empty());
    let by_then = all_effects(&s, &before(not_before)).await;
    assert_eq!(by_then.len(), 1, "{by_then:?}");
    assert_eq!(by_then[0]["key"], "later");
    // Cancelling an effect that does not exist did nothing but itself (the
    // SDK keys a cancel `cancel:<key>`).
    assert_eq!(
        effect(&s, "cancel:no-such-effect").await["status"],
        "succeeded"
    );
    assert_eq!(all_effects(&s, "&status=cancelled").await.len(), 0);

    // A cancel in a later fold cancels it; retried, it waits for its time
    // again instead of running at once.
    request(&s, SRC, json!([{"key": "stop", "cancel": "later"}])).await;
    settled(&s, "later", "cancelled").await;
    let id = effect(&s, "later").await["id"].as_i64().unwrap();
    let (status, retried) = s.post(&format!("{FX}/{id}:retry"), json!({})).await;
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["status"], "pending", "{retried}");
    assert_eq!(retried["nextAttemptAt"], later["notBefore"], "{retried}");
    assert!(r.posts_to("/ok/later").is_empty(), "it never ran");

    // A malformed `due` names itself.
    let answer = s.get(&format!("{FX}?due=after:1")).await;
    assert_error(
        &answer,
        400,
        "invalid-request",
        "due \"after:1\" must be before:T",
    );

    // More than ten years ahead of its event: the fold fails naming the
    // field, and halts (the same events would fail the same way).
    const FAR: &str = "/v1/projects/acme/streams/far";
    effector_on(&s, FAR).await;
    let eleven_years = 11 * 366 * 86_400_000u64;
    request(
        &s,
        FAR,
        json!([{"key": "far", "append": {"streamPath": "/out", "type": "x.y/far", "payload": {}},
                "afterMs": eleven_years}]),
    )
    .await;
    let halted = s.wait_halted(FAR, "fx", Duration::from_secs(30)).await;
    let message = halted.to_string();
    assert!(
        message.contains("effects[0].not-before") && message.contains("more than 10 years"),
        "{halted}"
    );
    assert!(all_effects(&s, "").await.iter().all(|e| e["key"] != "far"));
}

#[tokio::test]
async fn a_component_built_against_0_2_0_deploys_and_folds_beside_0_3_0s() {
    let s = Server::start();
    // `minimal` is built against streamhost:processor@0.2.0, `counter` (the
    // SDK) against 0.3.0.
    for (name, guest_name) in [("old", "minimal"), ("new", "counter")] {
        let (status, out) = s.deploy("acme", name, guest(guest_name)).await;
        assert_eq!(status, 200, "{name}: {out}");
    }
    const S: &str = "/v1/projects/acme/streams/both";
    wake(&s, S, "old", "old").await;
    wake(&s, S, "new", "new").await;
    let (status, out) = s
        .post(
            &format!("{S}:append"),
            json!({"events": [{"type": "x.y/one", "payload": {}}, {"type": "x.y/two", "payload": {}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let head = out["events"][1]["offset"].as_u64().unwrap();
    for name in ["old", "new"] {
        wait_for(
            &format!("{name} to fold through {head}"),
            Duration::from_secs(30),
            async || {
                let (_, p) = s.get(&format!("{S}:processors/{name}")).await;
                p["checkpointOffset"].as_u64().is_some_and(|o| o >= head)
            },
        )
        .await;
    }
    let (_, old) = s.get(&format!("{S}:processors/old")).await;
    // minimal counts the events of its batches: the two and the platform's
    // own (the stream's creation and two subscriptions).
    assert!(old["state"].as_u64().is_some_and(|n| n >= 2), "{old}");
    let (_, new) = s.get(&format!("{S}:processors/new")).await;
    assert!(new["state"].is_object(), "{new}");
}

#[tokio::test]
async fn a_timer_of_a_killed_host_fires_once_on_the_host_that_takes_its_stream_over() {
    if crate::cluster::on_sqlite() {
        return;
    }
    const CLUSTER: &str = "[cluster]\nlease-ms = 1500\n";
    let mut a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    deploy(&a, "reminder", "reminder").await;
    wake(&a, ORDERS, "r", "reminder").await;
    let x = order(
        &a,
        "orders.example/order-placed",
        json!({"orderId": "X", "remindAfterMs": 4000}),
    )
    .await;
    folded_through(&a, x["offset"].as_u64().unwrap()).await;
    let timer = effect(&a, "reminder:X").await;
    assert_eq!(timer["status"], "pending", "{timer}");
    // A dies with the timer pending; B takes the stream over (an order
    // placed through B brings it there at once) and runs the timer when due.
    a.kill();
    let place_y = json!({"events": [{"type": "orders.example/order-placed", "idempotencyKey": "Y",
        "payload": {"orderId": "Y", "remindAfterMs": 3_600_000}}]});
    let mut y = 0;
    wait_for(
        "B to take the orders stream over",
        Duration::from_secs(30),
        async || {
            let (status, out) = b.post(&format!("{ORDERS}:append"), place_y.clone()).await;
            y = out["events"][0]["offset"].as_u64().unwrap_or(0);
            status == 200
        },
    )
    .await;
    folded_through(&b, y).await;
    wait_for(
        "X's reminder to be folded on B",
        Duration::from_secs(30),
        async || {
            let (_, p) = b.get(&format!("{ORDERS}:processors/reminder")).await;
            p["state"]["reminded"] == json!(["X"])
        },
    )
    .await;
    let due = b.events_of_type(ORDERS, DUE).await;
    assert_eq!(due.len(), 1, "{due:?}");
    assert!(
        ms(&due[0]["createdAt"]) >= ms(&timer["notBefore"]),
        "{}",
        due[0]
    );
    assert_eq!(settled(&b, "reminder:X", "succeeded").await["attempts"], 1);
    assert_eq!(effect(&b, "reminder:Y").await["status"], "pending");
}
