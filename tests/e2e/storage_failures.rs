//! Storage failures, injected into the server's real SQLite database: a
//! trigger (installed by the test through its own connection) aborts chosen
//! writes while a row sits in a `fail_switch` table. The server sees a real
//! failed commit; no mock is involved.

use std::time::{Duration, Instant};

use rusqlite::Connection;
use serde_json::json;

use crate::subscriptions::{ev, subscribe, wait_count, P};
use crate::support::{wait_for, Server};

const CONFIG: &str =
    "[delivery]\nmax-attempts = 2\nbackoff-base-ms = 10\nbackoff-max-ms = 20\ntimeout-ms = 2000\n";

fn db(s: &Server) -> Connection {
    let c = Connection::open(s.data_dir().join("streamhost.db")).expect("opening the db");
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.execute_batch("CREATE TABLE IF NOT EXISTS fail_switch (on_ INTEGER)")
        .unwrap();
    c
}

/// Aborts the statements `when` (a trigger timing and event, e.g. `BEFORE
/// UPDATE ON subscription_cursors`) while the switch is on.
fn inject(c: &Connection, name: &str, when: &str, condition: &str) {
    c.execute_batch(&format!(
        "CREATE TRIGGER {name} {when} WHEN (SELECT count(*) FROM fail_switch) > 0 {condition}
         BEGIN SELECT RAISE(ABORT, 'injected storage failure'); END;"
    ))
    .unwrap();
}

fn switch(c: &Connection, on: bool) {
    if on {
        c.execute("INSERT INTO fail_switch VALUES (1)", []).unwrap();
    } else {
        c.execute("DELETE FROM fail_switch", []).unwrap();
    }
}

fn cursor_row(c: &Connection, key: &str) -> Option<u64> {
    c.query_row(
        "SELECT acknowledged_offset FROM subscription_cursors WHERE subscription_key = ?1",
        [key],
        |r| r.get::<_, i64>(0),
    )
    .ok()
    .map(|o| o as u64)
}

#[tokio::test]
async fn a_failed_cursor_write_reloads_with_backoff_and_resumes_without_a_request() {
    let s = Server::start_with(Some(CONFIG), &[]);
    subscribe(
        &s,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k"}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    wait_count(&s, "/dst", 1).await;
    let (_, st) = s.get(&format!("{P}/src:state")).await;
    let head = st["maxOffset"].as_u64().unwrap();
    let c = db(&s);
    wait_for(
        "the cursor row at the head",
        Duration::from_secs(10),
        async || cursor_row(&c, "k") == Some(head),
    )
    .await;
    inject(
        &c,
        "fail_cursors",
        "BEFORE UPDATE ON subscription_cursors",
        "",
    );
    switch(&c, true);

    // The append commits (it carries no cursor); its delivery succeeds; the
    // cursor write that follows fails, again and again.
    let (status, out) = s
        .post(&format!("{P}/src:append"), ev("x.y/a", json!({"n": 2})))
        .await;
    assert_eq!(status, 200, "{out}");
    let loads = "streamhost_stream_loads_total{outcome=\"ok\"}";
    let before = s.metric(loads).await;
    let started = Instant::now();
    wait_for(
        "five reloads after failed cursor writes",
        Duration::from_secs(20),
        async || s.metric(loads).await >= before + 5,
    )
    .await;
    // No spin: the reloads back off (0, 50, 100, 200, 400 ms ...).
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "five reloads took only {:?}",
        started.elapsed()
    );
    assert_eq!(
        cursor_row(&c, "k"),
        Some(head),
        "no cursor write got through"
    );

    // Storage recovers: with no request to /src, the cursor is written.
    switch(&c, false);
    wait_for(
        "the cursor row past the new event",
        Duration::from_secs(15),
        async || cursor_row(&c, "k") == Some(head + 1),
    )
    .await;
    let copies = wait_count(&s, "/dst", 2).await;
    assert_eq!(
        copies[1]["payload"],
        json!({"n": 2}),
        "copied once, in order"
    );
}

#[tokio::test]
async fn a_halt_fact_that_fails_to_commit_is_decided_again_and_lands() {
    let s = Server::start_with(Some(CONFIG), &[]);
    let c = db(&s);
    inject(
        &c,
        "fail_halts",
        "BEFORE INSERT ON events",
        "AND NEW.type = 'events.iterate.com/stream/subscription-delivery-halted'",
    );
    switch(&c, true);
    // A webhook to a closed port fails every attempt: after two, it halts.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", closed.local_addr().unwrap());
    drop(closed);
    s.post(
        &format!("{P}/src:append"),
        json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": "hook", "receiver": {"action": "webhook-post", "url": url,
                "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]}),
    )
    .await;
    s.post(&format!("{P}/src:append"), ev("x.y/a", json!({})))
        .await;
    let rejected = "streamhost_append_requests_total{outcome=\"internal\"}";
    wait_for(
        "two rejected halt facts",
        Duration::from_secs(20),
        async || s.metric(rejected).await >= 2,
    )
    .await;
    let (_, st) = s.get(&format!("{P}/src:state")).await;
    assert!(
        st["subscriptions"]["outbound"]["byKey"]["hook"]
            .get("deliveryHalted")
            .is_none(),
        "{st}"
    );
    switch(&c, false);
    s.wait_halted(&format!("{P}/src"), "hook", Duration::from_secs(20))
        .await;
    let events = s.all_events(&format!("{P}/src")).await;
    let halts = events
        .iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/subscription-delivery-halted")
        .count();
    assert_eq!(halts, 1, "exactly one halt fact");
}
