//! Retention (`:configureRetention`): events beyond a count or older than an
//! age go from the front of the log (gone from the database, not only the
//! API), never past a durable subscription's cursor; a processor whose
//! folded events went keeps a base (state and keys) and still verifies,
//! and a read before the first offset is `410 offset-gone`. And what it
//! refuses.

use std::time::Duration;

use serde_json::{json, Value};

use crate::processors::{caught_up, PROC};
use crate::support::{assert_error, guest, wait_for, Server};

const LOG: &str = "/v1/projects/acme/streams/log";
const HELD: &str = "/v1/projects/acme/streams/held";
const BANK: &str = "/v1/projects/acme/streams/bank";

async fn append(s: &Server, stream: &str, events: Value) -> Vec<Value> {
    let (status, out) = s
        .post(&format!("{stream}:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
    out["events"].as_array().unwrap().clone()
}

async fn append_n(s: &Server, stream: &str, n: usize) {
    let events: Vec<Value> = (0..n)
        .map(|i| json!({"type": "events.example/noted", "payload": {"n": i}}))
        .collect();
    append(s, stream, json!(events)).await;
}

async fn configure(s: &Server, stream: &str, body: Value) -> (u16, Value) {
    s.post(&format!("{stream}:configureRetention"), body).await
}

async fn state(s: &Server, stream: &str) -> Value {
    let (status, state) = s.get(&format!("{stream}:state")).await;
    assert_eq!(status, 200, "{state}");
    state
}

/// Returns once the background steps made a whole round over every stream
/// with retention: another stream is trimmed twice (the first trim's
/// round may have stepped the others before it; the second's started
/// after it ended).
async fn a_whole_round_passes(s: &Server) {
    let other = "/v1/projects/acme/streams/other";
    append_n(s, other, 20).await;
    let (status, out) = configure(s, other, json!({"maxEvents": 10})).await;
    assert_eq!(status, 200, "{out}");
    for round in 0..2 {
        let head = state(s, other).await["maxOffset"].as_u64().unwrap();
        wait_for(
            "the other stream trimmed",
            Duration::from_secs(20),
            async || state(s, other).await["firstOffset"].as_u64() > Some(head - 10),
        )
        .await;
        if round == 0 {
            append_n(s, other, 20).await;
        }
    }
}

/// Verifies `component` on `stream`: it matches (its refold from its base
/// or its start is the stored state, every key too); the answer.
async fn verifies(s: &Server, stream: &str, component: &str) -> Value {
    let (status, verified) = s
        .post(
            &format!("{stream}:verifyProcessor"),
            json!({ "component": component }),
        )
        .await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["matches"], true, "{verified}");
    verified
}

/// Events stored for the stream's row, counted in the database.
fn rows(s: &Server, path: &str) -> i64 {
    s.db()
        .query_i64(&format!(
            "SELECT COUNT(*) FROM events e JOIN streams t ON t.id = e.stream
             WHERE t.project = 'acme' AND t.path = '{path}'"
        ))
        .unwrap_or(0)
}

#[tokio::test]
async fn events_beyond_the_count_leave_the_database_and_reads_before_the_first_offset_are_gone() {
    let s = Server::start();
    append_n(&s, LOG, 40).await;
    assert_eq!(state(&s, LOG).await["firstOffset"], 1);
    let (status, out) = configure(&s, LOG, json!({"maxEvents": 10})).await;
    assert_eq!(status, 200, "{out}");
    let configured = &out["retentionConfiguredEvent"];
    assert_eq!(
        configured["type"],
        "events.iterate.com/stream/retention-configured"
    );
    assert_eq!(configured["payload"]["maxEvents"], 10);

    wait_for(
        "the log trimmed to its bound",
        Duration::from_secs(20),
        async || state(&s, LOG).await["firstOffset"].as_u64() > Some(20),
    )
    .await;
    let st = state(&s, LOG).await;
    let first = st["firstOffset"].as_u64().unwrap();
    let head = st["maxOffset"].as_u64().unwrap();
    assert_eq!(st["retention"], json!({"maxEvents": 10}), "{st}");
    // Ten of the stream's events stay (the audit lines count too), and the
    // database holds exactly the events from the first offset on.
    let stored = rows(&s, "/log");
    assert!((10..=11).contains(&stored), "{stored} rows: {st}");
    assert_eq!(stored as u64, head - first + 1, "{st}");
    // The stream's stored bytes (the project's storage bound) gave back
    // what went.
    let counted = s
        .db()
        .query_i64("SELECT bytes FROM streams WHERE project = 'acme' AND path = '/log'");
    let left = s.db().query_i64(
        "SELECT SUM(length(e.type) + COALESCE(length(e.idempotency_key), 0) + length(e.body))
         FROM events e JOIN streams t ON t.id = e.stream
         WHERE t.project = 'acme' AND t.path = '/log'",
    );
    assert_eq!(counted, left);

    // What the front holds now is the first offset's event.
    let (status, page) = s.get(&format!("{LOG}:events?limit=5")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"][0]["offset"].as_u64(), Some(first), "{page}");
    // A read that starts inside the removed range is gone, naming the
    // first offset; one from just before the first offset is not.
    let gone = s.get(&format!("{LOG}:events?afterOffset=5")).await;
    assert_error(&gone, 410, "offset-gone", &format!("before offset {first}"));
    let (status, page) = s
        .get(&format!("{LOG}:events?afterOffset={}&limit=1", first - 1))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"][0]["offset"].as_u64(), Some(first));

    // Each removal is on the log: an events-removed line with its range,
    // count and a digest chained over what it removed.
    let (_, page) = s.get(&format!("{LOG}:events?limit=100")).await;
    let removed: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/events-removed")
        .collect();
    let last = removed.last().expect("an events-removed line is kept");
    assert_eq!(last["payload"]["throughOffset"].as_u64(), Some(first - 1));
    assert_eq!(last["payload"]["digest"].as_str().map(str::len), Some(64));

    // A log at its bound stays still: no removal a second to record the
    // last one. (Two trims of another stream: a whole round of the
    // background steps passed over this one in between.)
    a_whole_round_passes(&s).await;
    assert_eq!(
        state(&s, LOG).await["maxOffset"].as_u64(),
        Some(head),
        "the log churned"
    );

    // The bound removed: what is stored stays.
    let (status, out) = configure(&s, LOG, json!({"maxEvents": null})).await;
    assert_eq!(status, 200, "{out}");
    append_n(&s, LOG, 30).await;
    let st = state(&s, LOG).await;
    assert!(st.get("retention").is_none(), "{st}");
    assert_eq!(st["firstOffset"].as_u64(), Some(first));
}

#[tokio::test]
async fn events_older_than_the_age_go_and_a_subscriptions_cursor_holds_the_front() {
    let s = Server::start();
    append_n(&s, LOG, 5).await;
    append_n(&s, HELD, 5).await;
    // A webhook subscription to a port nobody listens on: it never
    // delivers, so its cursor holds every event from the beginning.
    let hook = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "hook",
            "receiver": {"action": "webhook-post", "url": "http://127.0.0.1:9/hook",
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}});
    append(&s, HELD, json!([hook])).await;
    for stream in [LOG, HELD] {
        let (status, out) = configure(&s, stream, json!({"maxAgeMs": 300})).await;
        assert_eq!(status, 200, "{out}");
    }
    wait_for("old events removed", Duration::from_secs(20), async || {
        state(&s, LOG).await["firstOffset"].as_u64() > Some(6)
    })
    .await;
    // The same bound, the same age, the same sweeps: the held stream kept
    // everything its subscription has not delivered.
    let held = state(&s, HELD).await;
    assert_eq!(held["firstOffset"], 1, "{held}");
    assert_eq!(
        rows(&s, "/held") as u64,
        held["maxOffset"].as_u64().unwrap()
    );
    // Removing the subscription lets the front go.
    let removed = json!({"type": "events.iterate.com/stream/subscription-removed",
        "payload": {"subscriptionKey": "hook", "reason": "requested"}});
    append(&s, HELD, json!([removed])).await;
    wait_for(
        "the held events removed",
        Duration::from_secs(20),
        async || state(&s, HELD).await["firstOffset"].as_u64() > Some(6),
    )
    .await;
}

#[tokio::test]
async fn a_processor_whose_folded_events_went_verifies_from_its_base_keys_and_all() {
    let mut s = Server::start_with(Some(PROC), &[]);
    let (status, out) = s.deploy("acme", "ledger", guest("ledger")).await;
    assert_eq!(status, 200, "{out}");
    let wake = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "ledger",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "ledger"], "wake"]}}});
    append(&s, BANK, json!([wake])).await;
    let deposits = |from: usize, n: usize| -> Value {
        json!((from..from + n)
            .map(|i| json!({"type": "deposited",
                "payload": {"account": format!("a{}", i % 7), "cents": i + 1}}))
            .collect::<Vec<_>>())
    };
    append(&s, BANK, deposits(0, 30)).await;
    let before = caught_up(&s, BANK, "ledger").await;
    let (status, out) = configure(&s, BANK, json!({"maxEvents": 5})).await;
    assert_eq!(status, 200, "{out}");
    wait_for(
        "the ledger's events removed",
        Duration::from_secs(20),
        async || state(&s, BANK).await["firstOffset"].as_u64() > Some(20),
    )
    .await;
    // Verified from its base: the same state and every key.
    let verified = verifies(&s, BANK, "ledger").await;
    assert_eq!(verified["storedState"], before["state"], "{verified}");
    assert!(verified["keysCompared"].as_u64() >= Some(7), "{verified}");
    // After a kill, the base and the front are where they were.
    s.kill();
    s.restart();
    verifies(&s, BANK, "ledger").await;
    // It folds on from there, and verifies again once more events went.
    append(&s, BANK, deposits(30, 20)).await;
    let now = caught_up(&s, BANK, "ledger").await;
    // Its state at an offset after the base folds from the base.
    let at = now["checkpointOffset"].as_u64().unwrap();
    let (status, folded) = s.get(&format!("{BANK}:processors/ledger/at/{at}")).await;
    assert_eq!(status, 200, "{folded}");
    assert_eq!(folded["state"], now["state"], "{folded}");
    let first = state(&s, BANK).await["firstOffset"].as_u64().unwrap();
    wait_for("more events removed", Duration::from_secs(20), async || {
        state(&s, BANK).await["firstOffset"].as_u64() > Some(first)
    })
    .await;
    verifies(&s, BANK, "ledger").await;
    // Its state before the base cannot be folded any more.
    let gone = s.get(&format!("{BANK}:processors/ledger/at/3")).await;
    assert_error(&gone, 410, "offset-gone", "ledger");
}

#[tokio::test]
async fn retention_refuses_bounds_that_are_not_whole_numbers_of_at_least_one() {
    let s = Server::start();
    append_n(&s, LOG, 2).await;
    for (body, named) in [
        (json!({"maxEvents": 0}), "maxEvents is 0"),
        (json!({"maxAgeMs": -5}), "maxAgeMs is -5"),
        (json!({"maxEvents": 2.5}), "maxEvents is 2.5"),
        (json!({"maxEvents": "10"}), "maxEvents is \"10\""),
        (json!({"maxRows": 3}), "maxRows"),
    ] {
        let answer = configure(&s, LOG, body).await;
        assert_error(&answer, 400, "invalid-request", named);
    }
    let missing = configure(
        &s,
        "/v1/projects/acme/streams/nope",
        json!({"maxEvents": 3}),
    )
    .await;
    assert_eq!(missing.0, 404, "{}", missing.1);
    // Nothing was configured by the refusals.
    assert!(state(&s, LOG).await.get("retention").is_none());
    // And no caller appends the platform's lines itself.
    let (status, out) = s
        .post(
            &format!("{LOG}:append"),
            json!({"events": [{"type": "events.iterate.com/stream/events-removed",
                "payload": {"fromOffset": 1, "throughOffset": 2, "count": 2, "digest": ""}}]}),
        )
        .await;
    assert_eq!(status, 403, "{out}");
}

#[tokio::test]
async fn a_copy_and_a_processor_subscribed_after_a_removal_start_at_the_first_offset_kept() {
    let s = Server::start_with(Some(PROC), &[]);
    let (status, out) = s.deploy("acme", "counter", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    append_n(&s, LOG, 30).await;
    let (status, out) = configure(&s, LOG, json!({"maxEvents": 10})).await;
    assert_eq!(status, 200, "{out}");
    wait_for("the log trimmed", Duration::from_secs(20), async || {
        state(&s, LOG).await["firstOffset"].as_u64() > Some(20)
    })
    .await;
    let copy = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "copy", "filter": {"eventTypes": ["events.example/noted"]},
            "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/log-copy",
                "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}});
    let wake = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "counter",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "counter"], "wake"]}}});
    append(&s, LOG, json!([copy, wake])).await;
    // What is kept of the stream's own events: the copy and the count
    // hold exactly those.
    let (_, page) = s.get(&format!("{LOG}:events?limit=100")).await;
    let kept: Vec<u64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "events.example/noted")
        .map(|e| e["payload"]["n"].as_u64().unwrap())
        .collect();
    assert!(!kept.is_empty() && kept.len() < 30, "{page}");
    let counted = caught_up(&s, LOG, "counter").await;
    // (The counter folds every event it is given, the platform's lines
    // too: all that is kept up to its checkpoint.)
    let through = counted["checkpointOffset"].as_u64().unwrap();
    let (_, page) = s.get(&format!("{LOG}:events?limit=100")).await;
    let folded = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["offset"].as_u64() <= Some(through))
        .count();
    assert_eq!(counted["state"]["events"], folded, "{counted} {page}");
    assert_eq!(
        counted["state"]["sum"],
        kept.iter().sum::<u64>(),
        "{counted}"
    );
    wait_for(
        "every kept event copied",
        Duration::from_secs(20),
        async || {
            let (_, page) = s
                .get("/v1/projects/acme/streams/log-copy:events?limit=100")
                .await;
            let copied: Vec<u64> = page["events"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|e| e["type"] == "events.example/noted")
                        .filter_map(|e| e["payload"]["n"].as_u64())
                        .collect()
                })
                .unwrap_or_default();
            copied == kept
        },
    )
    .await;
}

#[tokio::test]
async fn the_cli_sets_and_removes_retention_and_refuses_a_zero_bound() {
    let s = Server::start();
    append_n(&s, LOG, 3).await;
    let (ok, out, err) = crate::support::cli_with(&s, &["retention", "/log", "--max-events", "2"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("retention-configured"), "{out}");
    assert_eq!(state(&s, LOG).await["retention"], json!({"maxEvents": 2}));
    let (ok, out, err) = crate::support::cli_with(&s, &["retention", "/log", "--max-age-ms", "0"]);
    assert!(!ok, "{out}");
    assert!(err.contains("--max-age-ms") && err.contains('0'), "{err}");
    let (ok, out, err) = crate::support::cli_with(&s, &["retention", "/log"]);
    assert!(ok, "{out}{err}");
    assert!(state(&s, LOG).await.get("retention").is_none());
}

/// The counter as `proc` on the log, 30 events folded, then `maxEvents` 5
/// applied: the counter's state once caught up (it counts events the log
/// no longer holds) and the events kept.
async fn counter_after_a_removal(s: &Server) -> (Value, u64) {
    let (status, out) = s.deploy("acme", "proc", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    let wake = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "proc",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "proc"], "wake"]}}});
    append(s, LOG, json!([wake])).await;
    append_n(s, LOG, 30).await;
    caught_up(s, LOG, "proc").await;
    let (status, out) = configure(s, LOG, json!({"maxEvents": 5})).await;
    assert_eq!(status, 200, "{out}");
    wait_for("the log trimmed", Duration::from_secs(20), async || {
        state(s, LOG).await["firstOffset"].as_u64() > Some(25)
    })
    .await;
    let before = caught_up(s, LOG, "proc").await;
    let kept = rows(s, "/log") as u64;
    assert!(
        before["state"]["events"].as_u64() > Some(kept + 20),
        "{before}"
    );
    (before, kept)
}

#[tokio::test]
async fn a_shadow_after_a_removal_folds_from_the_base() {
    let s = Server::start_with(Some(PROC), &[]);
    let (before, kept) = counter_after_a_removal(&s).await;
    let (status, v2) = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{v2}");
    let shadow = crate::support::shadow_ready(&s, LOG, "proc").await;
    // Its diff against the live state: the payloads' sum is the same, and
    // its count holds the removed events (only the platform's lines, which
    // the effector does not fold, differ); from offset 0 over what is kept
    // it would count a handful.
    let diff = shadow["stateDiff"].as_array().unwrap();
    assert!(diff.iter().all(|d| d["path"] != "/sum"), "{shadow}");
    let events = diff
        .iter()
        .find(|d| d["path"] == "/events")
        .map_or(before["state"]["events"].as_u64(), |d| d["value"].as_u64());
    assert!(events > Some(kept + 20), "{shadow}");
}

#[tokio::test]
async fn a_refold_after_a_removal_starts_from_the_base_and_reaches_the_state_before_it() {
    let s = Server::start_with(Some(PROC), &[]);
    let (before, kept) = counter_after_a_removal(&s).await;
    // Version 2 (the effector counts events as the counter does), refolded:
    // from the base it reaches the same count; from offset 0 over what is
    // kept it would count a handful.
    let (status, v2) = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=true")
        .await;
    assert_eq!(status, 200, "{v2}");
    wait_for(
        "the refold to switch",
        Duration::from_secs(30),
        async || {
            let (_, p) = s.get(&format!("{LOG}:processors/proc")).await;
            p["digest"] == v2["digest"]
        },
    )
    .await;
    let after = caught_up(&s, LOG, "proc").await;
    assert_eq!(
        after["checkpointOffset"], before["checkpointOffset"],
        "{after}"
    );
    // The payloads' sum is the same (the effector keeps the counter's
    // fields it does not fold), and the count holds the removed events:
    // only the platform's lines, which the effector does not fold, differ.
    assert_eq!(after["state"]["sum"], before["state"]["sum"], "{after}");
    assert!(
        after["state"]["events"].as_u64() > Some(kept + 20),
        "{after}"
    );
    let (status, verified) = s
        .post(
            &format!("{LOG}:verifyProcessor"),
            json!({"component": "proc"}),
        )
        .await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["matches"], true, "{verified}");
}

#[tokio::test]
async fn a_shadow_folding_from_the_start_holds_the_front_until_it_is_discarded() {
    let s = Server::start_with(Some(PROC), &[]);
    let (status, out) = s.deploy("acme", "proc", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    let wake = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "proc",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "proc"], "wake"]}}});
    append(&s, LOG, json!([wake])).await;
    append_n(&s, LOG, 30).await;
    caught_up(&s, LOG, "proc").await;
    let (status, v2) = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{v2}");
    crate::support::shadow_ready(&s, LOG, "proc").await;
    let (status, out) = configure(&s, LOG, json!({"maxEvents": 5})).await;
    assert_eq!(status, 200, "{out}");
    // The shadow reads the log from its start (a restart folds it again):
    // nothing goes while it exists.
    a_whole_round_passes(&s).await;
    assert_eq!(state(&s, LOG).await["firstOffset"], 1);
    let (status, out) = s
        .post(
            &format!("{LOG}:discardShadow"),
            json!({"component": "proc"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    wait_for("the front to go", Duration::from_secs(20), async || {
        state(&s, LOG).await["firstOffset"].as_u64() > Some(25)
    })
    .await;
    verifies(&s, LOG, "proc").await;
}
