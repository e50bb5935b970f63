//! Storage failures, injected into the server's real database (SQLite, or
//! PostgreSQL when the suite runs on it): a trigger (installed by the test
//! through its own connection) aborts chosen writes while a row sits in a
//! `fail_switch` table. The server sees a real failed commit; no mock is
//! involved.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::subscriptions::{ev, subscribe, wait_count, P};
use crate::support::{assert_error, skipped_on_postgres, wait_for, Server, SseClient, TestDb};

const CONFIG: &str =
    "[delivery]\nmax-attempts = 2\nbackoff-base-ms = 10\nbackoff-max-ms = 20\ntimeout-ms = 2000\n";

fn db(s: &Server) -> TestDb {
    let c = s.db();
    c.execute("CREATE TABLE IF NOT EXISTS fail_switch (on_ INTEGER)");
    c
}

/// Aborts the statements `when` (a trigger timing and event, e.g. `BEFORE
/// UPDATE ON subscription_cursors`) while the switch is on, and
/// `condition` (`AND NEW.type = ...`, or empty) holds.
fn inject(c: &TestDb, name: &str, when: &str, condition: &str) {
    if c.is_postgres() {
        c.execute(&format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF (SELECT count(*) FROM fail_switch) > 0 {condition} THEN
                     RAISE EXCEPTION 'injected storage failure';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER {name} {when} FOR EACH ROW EXECUTE FUNCTION {name}();"
        ));
    } else {
        c.execute(&format!(
            "CREATE TRIGGER {name} {when} WHEN (SELECT count(*) FROM fail_switch) > 0 {condition}
             BEGIN SELECT RAISE(ABORT, 'injected storage failure'); END;"
        ));
    }
}

fn switch(c: &TestDb, on: bool) {
    if on {
        c.execute("INSERT INTO fail_switch VALUES (1)");
    } else {
        c.execute("DELETE FROM fail_switch");
    }
}

fn cursor_row(c: &TestDb, key: &str) -> Option<u64> {
    c.query_i64(&format!(
        "SELECT acknowledged_offset FROM subscription_cursors WHERE subscription_key = '{key}'"
    ))
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
    // A webhook to a refusing port fails every attempt: after two, it halts.
    let (_refusing, port) = crate::support::refusing_port();
    let url = format!("http://127.0.0.1:{port}/hook");
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

/// A server whose storage injects `faults` (`STREAMHOST_FAULTS`).
fn with_faults(faults: &str) -> Server {
    let mut s = Server::unstarted(None, Some(CONFIG), &[]);
    s.env.push(("STREAMHOST_FAULTS".into(), faults.into()));
    s.launch();
    s
}

/// Appends event `i` (idempotency key `k{i}`) once: its offset, or the
/// error answer.
async fn append_once(s: &Server, stream: &str, i: usize) -> Result<u64, (u16, Value)> {
    let (status, out) = s
        .post(
            &format!("{P}{stream}:append"),
            json!({"events": [{"type": "x.y/a", "payload": {"i": i}, "idempotencyKey": format!("k{i}")}]}),
        )
        .await;
    match status {
        200 => Ok(out["events"][0]["offset"].as_u64().unwrap()),
        _ => Err((status, out)),
    }
}

/// Asserts that `stream`'s log is dense from 1 and holds exactly the events
/// `acked` (event number → offset) among its `x.y/a` events.
async fn assert_log_is(s: &Server, stream: &str, acked: &HashMap<usize, u64>) {
    let log = s.all_events(&format!("{P}{stream}")).await;
    for (k, e) in log.iter().enumerate() {
        assert_eq!(e["offset"], k as u64 + 1, "dense offsets: {log:?}");
    }
    let stored: HashMap<usize, u64> = log
        .iter()
        .filter(|e| e["type"] == "x.y/a")
        .map(|e| {
            (
                e["payload"]["i"].as_u64().unwrap() as usize,
                e["offset"].as_u64().unwrap(),
            )
        })
        .collect();
    let count = log.iter().filter(|e| e["type"] == "x.y/a").count();
    assert_eq!(count, stored.len(), "an event stored twice: {log:?}");
    assert_eq!(
        &stored, acked,
        "exactly the acknowledged events, at their offsets"
    );
}

fn assert_injected(answer: &(u16, Value)) {
    let (status, body) = answer;
    assert_eq!(*status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("disk I/O error (injected"), "{message}");
}

#[tokio::test]
async fn a_commit_reported_failed_after_reaching_the_disk_is_kept_once_and_live_readers_get_it() {
    let s = with_faults("after-commit=1/4");
    let first = append_once(&s, "/src", 0)
        .await
        .expect("the first commit is not a fault");
    let mut live = SseClient::open(
        &s,
        &format!("{P}/src:connect?replayAfterOffset=0&state=false"),
    )
    .await
    .expect("connect");
    let mut acked = HashMap::from([(0, first)]);
    let mut failures = 0;
    for i in 1..24 {
        // Until answered: the same idempotency key, so a retry of a commit
        // that did reach the disk answers the stored event.
        for attempt in 0.. {
            assert!(attempt < 100, "append {i} was refused 100 times in a row");
            match append_once(&s, "/src", i).await {
                Ok(offset) => {
                    acked.insert(i, offset);
                    break;
                }
                Err(answer) => {
                    assert_injected(&answer);
                    failures += 1;
                }
            }
        }
    }
    assert!(failures >= 4, "only {failures} injected failures");
    assert_log_is(&s, "/src", &acked).await;
    let head = *acked.values().max().unwrap();
    let mut seen = Vec::new();
    while seen.last() != Some(&head) {
        let offsets = tokio::time::timeout(Duration::from_secs(10), live.batch_offsets())
            .await
            .unwrap_or_else(|_| panic!("the live connection stopped at {seen:?}"));
        seen.extend(offsets);
    }
    assert_eq!(
        seen,
        (1..=head).collect::<Vec<_>>(),
        "the live connection got every stored event once, in order"
    );
}

#[tokio::test]
async fn a_commit_that_fails_before_reaching_the_disk_is_never_acknowledged_and_never_stored() {
    let s = with_faults("before-commit=1/3");
    let mut acked = HashMap::new();
    let mut refused = Vec::new();
    for i in 0..24 {
        match append_once(&s, "/src", i).await {
            Ok(offset) => {
                acked.insert(i, offset);
            }
            Err(answer) => {
                assert_injected(&answer);
                refused.push(i);
            }
        }
    }
    assert!(refused.len() >= 4, "refused only {refused:?}");
    assert_log_is(&s, "/src", &acked).await;
    // Another stream is served all along, and a refused append can be sent
    // again.
    let (status, page) = s.get(&format!("{P}/src:events")).await;
    assert_eq!(status, 200, "{page}");
    let retry = refused[0];
    let mut attempts = 0;
    let offset = loop {
        attempts += 1;
        assert!(attempts <= 100, "the retry was refused 100 times in a row");
        if let Ok(offset) = append_once(&s, "/src", retry).await {
            break offset;
        }
    };
    acked.insert(retry, offset);
    assert_log_is(&s, "/src", &acked).await;
}

#[tokio::test]
async fn a_full_disk_refuses_appends_keeps_serving_reads_and_recovers_a_consistent_prefix() {
    if skipped_on_postgres(
        "the full disk is the server process's file size limit, and PostgreSQL's own processes do the writing",
    ) {
        return;
    }
    let mut s = Server::start_with(Some(CONFIG), &[]);
    for i in 0..3 {
        append_once(&s, "/other", i)
            .await
            .expect("room on the disk");
    }
    let other = s.all_events(&format!("{P}/other")).await;
    s.stop();
    let size = |name: &str| std::fs::metadata(s.data_dir().join(name)).map_or(0, |m| m.len());
    let largest = size("streamhost.db").max(size("streamhost.db-wal"));
    // Files may grow 256 KiB more, then every write past that fails (EFBIG).
    s.file_size_limit = Some(largest + 256 * 1024);
    s.launch();
    let big = "x".repeat(8 * 1024);
    let mut acked = HashMap::new();
    let mut refusal = None;
    for i in 0..400 {
        let (status, out) = s
            .post(
                &format!("{P}/big:append"),
                json!({"events": [{"type": "x.y/a", "payload": {"i": i, "pad": big}, "idempotencyKey": format!("k{i}")}]}),
            )
            .await;
        if status == 200 {
            acked.insert(i, out["events"][0]["offset"].as_u64().unwrap());
        } else {
            refusal = Some((status, out));
            break;
        }
    }
    let (status, body) = refusal.expect("the disk never filled up");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "storage-full", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("commit failed") && message.contains("file size limit"),
        "{message}"
    );
    assert!(
        !acked.is_empty(),
        "some appends fit before the disk filled up"
    );
    // Full, the server says it cannot write, and still answers reads, of
    // this stream and others.
    crate::support::assert_error(
        &s.get("/healthz").await,
        503,
        "storage-unavailable",
        "the disk is full",
    );
    assert_eq!(s.all_events(&format!("{P}/other")).await, other);
    let (status, _) = s
        .get(&format!("{P}/big:events?afterOffset=0&limit=5"))
        .await;
    assert_eq!(status, 200);
    // Room again (a new start without the limit): a consistent prefix with
    // every acknowledged event, and appends go on after it.
    s.file_size_limit = None;
    s.restart();
    assert_log_is(&s, "/big", &acked).await;
    assert_eq!(s.all_events(&format!("{P}/other")).await, other);
    let next = append_once(&s, "/big", 1000).await.expect("room again");
    assert_eq!(next, *acked.values().max().unwrap() + 1);
}

#[tokio::test]
async fn a_host_whose_commits_fail_answers_healthz_503_and_acknowledges_no_write() {
    let mut s = with_faults("before-commit=1/1");
    for i in 0..3 {
        let answer = append_once(&s, "/src", i)
            .await
            .expect_err("no commit can succeed");
        assert_injected(&answer);
    }
    let health = s.get("/healthz").await;
    assert_error(
        &health,
        503,
        "storage-unavailable",
        "disk I/O error (injected before commit)",
    );
    let message = health.1["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("this host cannot write"), "{message}");
    // Without the fault, the host writes again and says so.
    s.env.clear();
    s.restart();
    assert_eq!(s.get("/healthz").await, (200, json!({"status": "ok"})));
    let offset = append_once(&s, "/src", 0).await.expect("room again");
    assert_log_is(&s, "/src", &HashMap::from([(0, offset)])).await;
}

#[tokio::test]
async fn a_writer_panic_stops_the_process_naming_it_and_a_restart_keeps_every_acknowledged_event() {
    let mut s = with_faults("writer-panic=1/8");
    let client = reqwest::Client::new();
    let mut acked = HashMap::new();
    let mut unanswered = None;
    for i in 0..40 {
        let sent = client
            .post(format!("{}{P}/src:append", s.url))
            .json(&json!({"events": [{"type": "x.y/a", "payload": {"i": i}, "idempotencyKey": format!("k{i}")}]}))
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == 200 => {
                let out: Value = r.json().await.expect("an append's answer");
                acked.insert(i, out["events"][0]["offset"].as_u64().unwrap());
            }
            Ok(r) => {
                unanswered = Some(format!(
                    "{i}: {} {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                ));
                break;
            }
            Err(e) => {
                unanswered = Some(format!("{i}: {e}"));
                break;
            }
        }
    }
    let unanswered = unanswered.expect("the eighth commit panics the writer");
    let status = s.exited_within(Duration::from_secs(20)).unwrap_or_else(|| {
        panic!("the process still runs after the writer panicked ({unanswered})")
    });
    assert!(!status.success(), "{status}");
    let log = s.log();
    assert!(
        log.contains("broken invariant: invariant writer-test: a writer panic injected on purpose"),
        "the process says which invariant broke:\n{log}"
    );
    assert!(!acked.is_empty() && acked.len() < 8, "{acked:?}");
    // Restart is the recovery: every acknowledged event, nothing else.
    s.env.clear();
    s.launch();
    assert_log_is(&s, "/src", &acked).await;
    let next = append_once(&s, "/src", 100).await.expect("writes go on");
    assert_eq!(next, *acked.values().max().unwrap() + 1);
}
