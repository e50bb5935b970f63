//! Every public operation of `streamhost::Host`, used as an embedding
//! platform uses it: no HTTP server, real storage, real wasmtime running the
//! example processors (`examples/processors`, built for wasm32-wasip2).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use streamhost::{
    Backfill, Config, Deploy, EffectFilter, EffectStatus, EventInput, Host, KeysQuery,
    ProcessorStatus, StreamAddress, Subscription,
};

/// The bytes of an example processor, built once per test run.
fn guest(name: &str) -> Vec<u8> {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../processors");
    BUILT.get_or_init(|| {
        let out = Command::new(env!("CARGO"))
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .current_dir(&root)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("running cargo for the guests");
        assert!(
            out.status.success(),
            "building the guests failed (`rustup target add wasm32-wasip2`?):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let file = root.join(format!(
        "target/wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    ));
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

fn open(dir: &Path) -> Host {
    Host::open(Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    })
    .expect("opening the host")
}

/// Polls `check` until it answers `Some`, for at most ten seconds.
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn event(event_type: &str, payload: Value) -> EventInput {
    EventInput::new(event_type).payload(payload)
}

/// Waits until processor `component` on `stream` has folded through the
/// stream's head.
async fn caught_up(host: &Host, stream: &StreamAddress, component: &str) {
    let head = host.state(stream).await.unwrap().max_offset;
    host.wait_for_processor(stream, component, head, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{component} did not fold through {head}: {e:?}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn components_deploy_list_read_and_keep_their_versions() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path());
    let counter = guest("counter");

    let deployed = host
        .deploy(Deploy::new("acme", "counter", counter.clone()))
        .await
        .unwrap();
    assert_eq!(deployed.name, "counter");
    assert!(
        deployed.digest.starts_with("sha256:"),
        "{}",
        deployed.digest
    );
    assert!(!deployed.unchanged);
    let again = host
        .deploy(Deploy::new("acme", "counter", counter.clone()))
        .await
        .unwrap();
    assert!(again.unchanged, "the same bytes make no new version");
    let refolding = host
        .deploy(Deploy::new("acme", "counter", counter.clone()).refold())
        .await
        .unwrap();
    assert!(refolding.refolding);
    assert_eq!(
        refolding.refolding_streams,
        Some(Vec::new()),
        "no instances yet"
    );

    let listed = host.components("acme").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].digest, deployed.digest);
    assert_eq!(host.component("acme", "counter").await.unwrap(), listed[0]);
    assert_eq!(
        host.component_bytes("acme", "counter").await.unwrap(),
        counter
    );
    host.deploy(Deploy::new("acme", "counter", guest("minimal")))
        .await
        .unwrap();
    let versions = host.component_versions("acme", "counter").await.unwrap();
    assert_eq!(versions.versions.len(), 2);
    assert_eq!(versions.versions[1].digest, deployed.digest, "newest first");

    // Bad input: errors with a kind and a code, naming the value.
    let e = host
        .deploy(Deploy::new("acme", "Bad_Name", counter.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind, e.code),
        (streamhost::ErrorKind::Invalid, "invalid-request")
    );
    assert!(e.message.contains("Bad_Name"), "{}", e.message);
    let e = host
        .deploy(Deploy::new("acme", "junk", b"not wasm".to_vec()))
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-component");
    let e = host.component("acme", "ghost").await.unwrap_err();
    assert_eq!(e.code, "component-not-found");
    assert!(e.message.contains("ghost"), "{}", e.message);
    let e = host.component_versions("acme", "ghost").await.unwrap_err();
    assert_eq!(e.code, "component-not-found");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_processor_folds_its_keys_verify_and_backfill_without_http() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path());
    host.deploy(Deploy::new("acme", "ledger", guest("ledger")))
        .await
        .unwrap();
    let bank = host.stream("acme", "/bank").unwrap();
    host.subscribe(
        &bank,
        &Subscription::wake("ledger", "ledger").from_beginning(),
    )
    .await
    .unwrap();
    host.append(
        &bank,
        [
            event("deposited", json!({"account": "alice", "cents": 500})),
            event("deposited", json!({"account": "bob", "cents": 70})),
            event("withdrawn", json!({"account": "alice", "cents": 120})),
        ],
    )
    .await
    .unwrap();
    caught_up(&host, &bank, "ledger").await;

    let p = host.processor(&bank, "ledger").await.unwrap();
    assert_eq!(p.component, "ledger");
    assert!(p.digest.as_deref().unwrap().starts_with("sha256:"));
    assert_eq!(p.state.as_ref().unwrap()["events"], 3, "{:?}", p.state);
    assert!(
        matches!(p.status, ProcessorStatus::Active | ProcessorStatus::Idle),
        "{:?}",
        p.status
    );
    assert_eq!((p.last_error, p.last_failure), (None, None));

    let page = host
        .processor_keys(&bank, "ledger", KeysQuery::new().prefix("balance/"))
        .await
        .unwrap();
    let keys: Vec<(&str, &[u8])> = page
        .keys
        .iter()
        .map(|k| (k.key.as_str(), k.value.as_slice()))
        .collect();
    assert_eq!(
        keys,
        [("balance/alice", &b"380"[..]), ("balance/bob", &b"70"[..])]
    );
    let first = host
        .processor_keys(
            &bank,
            "ledger",
            KeysQuery::new().prefix("balance/").limit(1),
        )
        .await
        .unwrap();
    assert_eq!(first.next_after.as_deref(), Some("balance/alice"));
    let rest = host
        .processor_keys(
            &bank,
            "ledger",
            KeysQuery::new().prefix("balance/").after("balance/alice"),
        )
        .await
        .unwrap();
    assert_eq!(rest.keys[0].key, "balance/bob");
    assert_eq!(rest.next_after, None);
    let bob = host
        .processor_key(&bank, "ledger", "balance/bob")
        .await
        .unwrap();
    assert_eq!(bob.value, b"70");
    let e = host
        .processor_key(&bank, "ledger", "balance/carol")
        .await
        .unwrap_err();
    assert_eq!(e.code, "key-not-found");
    assert!(e.message.contains("balance/carol"), "{}", e.message);
    let e = host
        .processor_keys(&bank, "ledger", KeysQuery::new().limit(0))
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-request");
    let e = host.processor(&bank, "ghost").await.unwrap_err();
    assert_eq!(e.code, "processor-not-found");

    let verified = host.verify_processor(&bank, "ledger").await.unwrap();
    assert!(verified.matches, "{verified:?}");
    assert_eq!(verified.checkpoint_offset, p.checkpoint_offset);
    assert!(verified.keys_compared >= 2, "{verified:?}");
    assert_eq!(verified.first_differing_key, None);

    // A backfill folds again and keeps only effects: the ledger has none.
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let heard = reports.clone();
    let done = host
        .backfill_with_progress(&bank, Backfill::new("ledger").after(1), move |p| {
            heard.lock().unwrap().push(p)
        })
        .await
        .unwrap();
    assert_eq!(done.folded, 3, "{done:?}");
    assert_eq!(done.effects_created, 0);
    let reports = reports.lock().unwrap().clone();
    assert!(
        !reports.is_empty(),
        "a progress report after the first batch"
    );
    assert_eq!(reports[0].head_offset, p.checkpoint_offset);
    let narrowed = host
        .backfill(&bank, Backfill::new("ledger").event_types(["deposited"]))
        .await
        .unwrap();
    assert_eq!(narrowed.folded, 2, "{narrowed:?}");
    // A backfill starts from the initial state: withdrawals alone overdraw.
    let e = host
        .backfill(&bank, Backfill::new("ledger").event_types(["withdrawn"]))
        .await
        .unwrap_err();
    assert_eq!(e.code, "processor-failed");
    assert!(e.message.contains("alice"), "{}", e.message);
    let e = host
        .backfill(&bank, Backfill::new("ledger").after(99).through(5))
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-request");
    assert!(e.message.contains("99"), "{}", e.message);
    let e = host
        .backfill(&bank, Backfill::new("ledger").condition("$$$("))
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-jsonata");

    // The runtime view: the wake subscription's delivery, caught up (its
    // cursor moves just after the checkpoint commits).
    let runtime = eventually("the wake's cursor to reach the head", async || {
        let runtime = host.runtime(&bank).await.unwrap();
        (runtime.subscriptions["ledger"].lag == 0).then_some(runtime)
    })
    .await;
    let wake = &runtime.subscriptions["ledger"];
    assert_eq!(wake.processor.as_deref(), Some("ledger"));
    assert_eq!((wake.lag, wake.halted, wake.attempt), (0, false, 0));
    assert!(runtime.connections.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn itx_calls_and_the_effect_outbox_without_http() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path());
    host.deploy(Deploy::new("acme", "kinds", guest("kinds")))
        .await
        .unwrap();
    assert_eq!(
        host.call("acme", "kinds", "add", &[json!(2), json!(3)])
            .await
            .unwrap(),
        json!(5)
    );
    let expression = json!(["components", ["get", "kinds"], "divide"]);
    assert_eq!(
        host.call_expression("acme", &expression, &[json!(5.0), json!(2.0)])
            .await
            .unwrap(),
        json!(2.5)
    );
    let e = host
        .call("acme", "kinds", "divide", &[json!(1.0), json!(0.0)])
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind, e.code),
        (streamhost::ErrorKind::Unprocessable, "itx-failed")
    );
    let e = host
        .call("acme", "kinds", "add", &[json!("two"), json!(3)])
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-argument");
    let e = host
        .call("acme", "kinds", "nope", Vec::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, "function-not-found");
    assert!(e.message.contains("nope"), "{}", e.message);
    let e = host
        .call_expression("acme", &json!(["workers", "add"]), Vec::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-expression");

    // The effector returns the effects its events ask for: one append that
    // succeeds, one webhook to a closed port that keeps failing.
    host.deploy(Deploy::new("acme", "effector", guest("effector")))
        .await
        .unwrap();
    let jobs = host.stream("acme", "/jobs").unwrap();
    host.subscribe(
        &jobs,
        &Subscription::wake("effector", "effector").from_beginning(),
    )
    .await
    .unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    host.append(
        &jobs,
        [event(
            "events.example/effects-requested",
            json!({"effects": [
                {"key": "note", "append": {"streamPath": "/notes", "type": "noted", "payload": {"n": 1}}},
                {"key": "hook", "webhook": {"url": format!("http://{closed}/"), "body": {}}},
            ]}),
        )],
    )
    .await
    .unwrap();
    let notes = host.stream("acme", "/notes").unwrap();
    let appended = eventually("the append effect", async || {
        let page = host
            .effects("acme", EffectFilter::new().status(EffectStatus::Succeeded))
            .await
            .ok()?;
        page.effects.into_iter().next()
    })
    .await;
    assert_eq!(appended.key, "note");
    assert_eq!(appended.stream, "/jobs");
    assert_eq!(appended.component, "effector");
    let copied = host.events(&notes, 0, 10).await.unwrap();
    assert!(copied.iter().any(|e| e.event_type == "noted"), "{copied:?}");

    let all = host
        .effects("acme", EffectFilter::new().stream("/jobs"))
        .await
        .unwrap();
    assert_eq!(all.effects.len(), 2);
    let hook = all
        .effects
        .iter()
        .find(|e| e.key == "hook")
        .unwrap()
        .clone();
    assert_eq!(host.effect("acme", hook.id).await.unwrap().key, "hook");
    let page = host
        .effects("acme", EffectFilter::new().limit(1))
        .await
        .unwrap();
    assert_eq!(page.next_after_id, Some(page.effects[0].id));
    let next = host
        .effects("acme", EffectFilter::new().after_id(page.effects[0].id))
        .await
        .unwrap();
    assert_eq!(next.effects.len(), 1);

    // The failing webhook: cancelled, then retried.
    let e = host.retry_effect("acme", appended.id).await.unwrap_err();
    assert_eq!(e.code, "effect-not-retryable");
    assert!(e.message.contains("succeeded"), "{}", e.message);
    let cancelled = eventually("the webhook to fail and be cancelled", async || {
        host.cancel_effect("acme", hook.id).await.ok()
    })
    .await;
    assert_eq!(cancelled.status, EffectStatus::Cancelled);
    let e = host.cancel_effect("acme", hook.id).await.unwrap_err();
    assert_eq!(e.code, "effect-not-cancellable");
    let retried = host.retry_effect("acme", hook.id).await.unwrap();
    assert!(
        matches!(
            retried.status,
            EffectStatus::Pending | EffectStatus::Running
        ),
        "{:?}",
        retried.status
    );
    let e = host.effect("acme", 9999).await.unwrap_err();
    assert_eq!(e.code, "effect-not-found");
    let e = host
        .effects("acme", EffectFilter::new().limit(501))
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-request");

    // One host on SQLite: the cluster view names it alone.
    let cluster = host.cluster().await.unwrap();
    assert_eq!(cluster.hosts.len(), 1);
    assert!(cluster.hosts[0].streams >= 2, "{cluster:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn copies_cursors_resumes_lists_and_resets_without_http() {
    use streamhost::{CopyFrom, Resumed, StreamsQuery, Unsubscribed};

    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path());
    let src = host.stream("acme", "/orders/eu").unwrap();
    let big = host.stream("acme", "/orders/big").unwrap();
    host.append(
        &src,
        [
            event("events.example/order", json!({"total": 120})),
            event("events.example/order", json!({"total": 80})),
        ],
    )
    .await
    .unwrap();
    let subscribed = host
        .subscribe_to_events_from(
            &big,
            CopyFrom::new("/orders/eu", "big")
                .condition("payload.total > 100")
                .from_beginning(),
        )
        .await
        .unwrap();
    assert_eq!(subscribed.subscription_key, "big");
    assert_eq!(
        subscribed.subscription_configured_event.event_type,
        "events.iterate.com/stream/subscription-configured"
    );
    let copies = |host: Host, big: StreamAddress| async move {
        match host.events(&big, 0, 100).await {
            Ok(events) => events
                .into_iter()
                .filter(|e| e.event_type == "events.example/order")
                .count(),
            Err(_) => 0,
        }
    };
    eventually("the copy", async || {
        (copies(host.clone(), big.clone()).await == 1).then_some(())
    })
    .await;

    // A new run from the start copies the big order again.
    let set = host.set_subscription_cursor(&src, "big", 0).await.unwrap();
    assert_eq!(
        set.event_type,
        "events.iterate.com/stream/subscription-cursor-set"
    );
    eventually("the copy again", async || {
        (copies(host.clone(), big.clone()).await == 2).then_some(())
    })
    .await;

    // Bad input names the value.
    let e = host
        .subscribe_to_events_from(&big, CopyFrom::new("/orders/big", "self"))
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid-request");
    assert!(e.message.contains("itself"), "{}", e.message);
    let mut keyless = CopyFrom::new("/orders/eu", "x");
    keyless.subscription_key = None;
    let e = host
        .subscribe_to_events_from(&big, keyless)
        .await
        .unwrap_err();
    assert!(e.message.contains("idempotencyKey"), "{}", e.message);

    // A transform that throws halts the copy at once; resuming appends the
    // resume (and it halts again on the same event).
    let broken = host.stream("acme", "/orders/broken").unwrap();
    host.subscribe_to_events_from(
        &broken,
        CopyFrom::new("/orders/eu", "broken")
            .transform("$error('no copy')")
            .from_beginning(),
    )
    .await
    .unwrap();
    eventually("the halt", async || {
        let rt = host.runtime(&src).await.ok()?;
        rt.subscriptions.get("broken").filter(|d| d.halted).cloned()
    })
    .await;
    match host.resume_subscription(&src, "broken").await.unwrap() {
        Resumed::Resumed(e) => assert_eq!(
            e.event_type,
            "events.iterate.com/stream/subscription-delivery-resumed"
        ),
        Resumed::Retrying => panic!("a halted subscription is resumed, not retried"),
    }
    let both = host
        .set_subscription_cursor_and_resume(&src, "broken", 2)
        .await
        .unwrap();
    assert_eq!(both.resumed.offset, both.cursor_set.offset + 1);

    match host
        .unsubscribe_from_events(&broken, "/orders/eu", "broken")
        .await
        .unwrap()
    {
        Unsubscribed::Removed {
            subscription_removed_event,
        } => assert_eq!(
            subscription_removed_event.event_type,
            "events.iterate.com/stream/subscription-removed"
        ),
        Unsubscribed::AlreadyAbsent => panic!("it was there"),
    }
    assert_eq!(
        host.unsubscribe_from_events(&broken, "/orders/eu", "broken")
            .await
            .unwrap(),
        Unsubscribed::AlreadyAbsent
    );
    let e = host
        .unsubscribe_from_events(&broken, "/orders/eu", "big")
        .await
        .unwrap_err();
    assert!(e.message.contains("is not a copy to"), "{}", e.message);

    // The list, in path order and pages.
    let ns = src.namespace.clone();
    let page = host
        .list_streams(&ns, StreamsQuery::new().prefix("/orders"))
        .await
        .unwrap();
    let paths: Vec<&str> = page.streams.iter().map(|s| s.path.as_str()).collect();
    // /orders/broken never received a copy: a receiver exists once one
    // arrives.
    assert_eq!(paths, ["/orders/big", "/orders/eu"]);
    assert_eq!(page.streams[1].subscriptions, 1);
    let first = host
        .list_streams(&ns, StreamsQuery::new().limit(1))
        .await
        .unwrap();
    assert_eq!(first.next_after_path.as_deref(), Some("/orders/big"));
    let e = host
        .list_streams(&ns, StreamsQuery::new().prefix("orders"))
        .await
        .unwrap_err();
    assert!(e.message.contains("\"orders\""), "{}", e.message);

    // Reset: the next touch starts a new lifetime.
    let before = host.state(&big).await.unwrap().stream_id;
    host.reset(&big).await.unwrap();
    host.append(&big, [event("events.example/after", json!({}))])
        .await
        .unwrap();
    assert_ne!(host.state(&big).await.unwrap().stream_id, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn live_connections_waits_and_ingest_without_http() {
    use streamhost::{Connect, Live, WaitFor};

    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path());
    let feed = host.stream("acme", "/feed").unwrap();
    host.append(&feed, [event("events.example/a", json!({"n": 1}))])
        .await
        .unwrap();

    // Replay, then live, filtered per connection.
    let mut live = host
        .connect(
            &feed,
            Connect::new()
                .after(0)
                .event_types(["events.example/a", "events.example/b"])
                .condition("payload.n > 1"),
        )
        .await
        .unwrap();
    let Some(Live::Batch(first)) = live.next().await else {
        panic!("a first batch")
    };
    assert!(
        first.parsed_events().unwrap().is_empty(),
        "n = 1 is filtered out"
    );
    assert!(first.parsed_state().unwrap().unwrap().max_offset >= 2);
    host.append(
        &feed,
        [
            event("events.example/b", json!({"n": 2})),
            event("events.example/c", json!({"n": 3})),
        ],
    )
    .await
    .unwrap();
    // The connection is a `futures::Stream` too.
    let batch = loop {
        match futures_util::StreamExt::next(&mut live).await {
            Some(Live::Batch(b)) if !b.events.is_empty() => break b,
            Some(Live::Batch(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    let types: Vec<String> = batch
        .parsed_events()
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(types, ["events.example/b"]);
    assert_eq!(host.runtime(&feed).await.unwrap().connections.len(), 1);
    drop(live);
    eventually("the dropped connection to close", async || {
        host.runtime(&feed)
            .await
            .ok()?
            .connections
            .is_empty()
            .then_some(())
    })
    .await;
    let e = host
        .connect(&feed, Connect::new().events_only().state_only())
        .await
        .err()
        .unwrap();
    assert!(e.message.contains("would send nothing"), "{}", e.message);
    let e = host
        .connect(&feed, Connect::new().condition("$$$("))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code, "invalid-jsonata");

    // A wait finds an event in the history, or times out naming what it saw.
    let found = host
        .wait_for_event(
            &feed,
            WaitFor::new(5000)
                .after(0)
                .event_types(["events.example/c"]),
        )
        .await
        .unwrap();
    assert_eq!(found.payload["n"], 3);
    let e = host
        .wait_for_event(&feed, WaitFor::new(200).event_types(["events.example/z"]))
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind, e.code),
        (streamhost::ErrorKind::Timeout, "timeout")
    );
    let e = host
        .wait_for_event(&feed, WaitFor::new(0))
        .await
        .unwrap_err();
    assert!(e.message.contains("timeoutMs 0"), "{}", e.message);
    let waiting = {
        let host = host.clone();
        let feed = feed.clone();
        tokio::spawn(async move {
            host.wait_for_event(&feed, WaitFor::new(10_000).condition("payload.n = 9"))
                .await
        })
    };
    eventually("the wait to listen", async || {
        let rt = host.runtime(&feed).await.ok()?;
        (!rt.connections.is_empty()).then_some(())
    })
    .await;
    host.append(&feed, [event("events.example/d", json!({"n": 9}))])
        .await
        .unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap().event_type,
        "events.example/d"
    );

    // Ingest: accepted durably now, appended in order shortly after.
    let inbox = host.stream("acme", "/inbox").unwrap();
    let accepted = host
        .ingest(
            &inbox,
            vec![
                EventInput::new("events.example/in").idempotency_key("in-1"),
                EventInput::new("events.example/in").idempotency_key("in-2"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(accepted, 2);
    eventually("the ingested events", async || {
        let events = host.events(&inbox, 0, 10).await.ok()?;
        let keys: Vec<String> = events
            .into_iter()
            .filter_map(|e| e.idempotency_key)
            .collect();
        (keys == ["in-1", "in-2"]).then_some(())
    })
    .await;
    let e = host
        .ingest(&inbox, vec![EventInput::new("events.example/in")])
        .await
        .unwrap_err();
    assert_eq!(e.kind, streamhost::ErrorKind::Invalid);
    // The pending rows go in a write of their own after the append.
    let status = eventually(
        "the appended events to leave the pending table",
        async || {
            let status = host.ingest_status().await.ok()?;
            (status.http.pending == 0).then_some(status)
        },
    )
    .await;
    assert!(status.http.capacity.events > 0);
    assert_eq!(status.nats, None);
    let e = host.register_ingest().await.unwrap_err();
    assert_eq!(e.code, "nats-not-configured");
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_requests_are_applied_as_the_adapters_apply_them() {
    use streamhost::{AppendInput, Connect, Live, StreamAnswer, StreamRequest};

    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path());
    let stream = host.stream("acme", "/typed").unwrap();
    let appended = host
        .apply(
            &stream,
            StreamRequest::Append(AppendInput::new([event(
                "events.example/t",
                json!({"n": 1}),
            )])),
        )
        .await
        .unwrap();
    let StreamAnswer::Appended { output, warnings } = appended else {
        panic!("an append answers Appended")
    };
    assert_eq!(output.events[0].offset, 2);
    assert!(warnings.is_empty());
    // A wake of a component that is not deployed is accepted with a warning.
    let wake = Subscription::wake("ghost", "ghost").to_event();
    let StreamAnswer::Appended { warnings, .. } = host
        .apply(&stream, StreamRequest::Append(AppendInput::new([wake])))
        .await
        .unwrap()
    else {
        panic!("an append answers Appended")
    };
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("\"ghost\""), "{warnings:?}");

    let StreamAnswer::State(state) = host.apply(&stream, StreamRequest::State).await.unwrap()
    else {
        panic!("State")
    };
    assert_eq!(state.max_offset, 3);
    let StreamAnswer::Live(mut live) = host
        .apply(&stream, StreamRequest::Connect(Connect::new().after(0)))
        .await
        .unwrap()
    else {
        panic!("Live")
    };
    let Some(Live::Batch(batch)) = live.next().await else {
        panic!("a batch")
    };
    assert!(batch
        .parsed_events()
        .unwrap()
        .iter()
        .any(|e| e.event_type == "events.example/t"));
    drop(live);

    assert!(StreamRequest::Reset.admin_only());
    assert!(!StreamRequest::State.admin_only());
    let e = host
        .apply(
            &stream,
            StreamRequest::ProcessorKey {
                component: "ghost".into(),
                key: "k".into(),
            },
        )
        .await
        .err()
        .unwrap();
    assert_eq!(
        e.code, "key-not-found",
        "a wake names ghost, so it has an instance: {e}"
    );
    assert!(matches!(
        host.apply(&stream, StreamRequest::Reset).await.unwrap(),
        StreamAnswer::Reset
    ));
}

/// Two hosts in one process each keep the limits of their own
/// configuration (none is a process-wide setting that the host opened last
/// would decide): the tight one is opened first.
#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_in_one_process_keep_their_own_limits() {
    let (tight_dir, loose_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut tight = Config {
        data_dir: tight_dir.path().to_path_buf(),
        max_body_bytes: 10_000,
        ..Config::default()
    };
    tight.limits.jsonata_max_bytes = 100_000;
    tight.limits.max_read_bytes = 1;
    let tight = Host::open(tight).expect("opening the tight host");
    let loose = open(loose_dir.path());

    for host in [&tight, &loose] {
        let orders = host.stream("acme", "/orders").unwrap();
        host.subscribe(
            &orders,
            &Subscription::copy_to("padded", "/padded")
                .event_types(["events.example/order-created"])
                .transform(r#"{"payload": {"pad": $pad("", 20000)}}"#)
                .from_beginning(),
        )
        .await
        .unwrap();
        host.append(
            &orders,
            [
                event("events.example/order-created", json!({"n": 1})),
                event("events.example/order-created", json!({"n": 2})),
            ],
        )
        .await
        .unwrap();
    }
    let orders = tight.stream("acme", "/orders").unwrap();

    // [limits] max-read-bytes: a page holds at least one event, and no more
    // once it reached the bound.
    let types = |events: Vec<streamhost::Event>| -> Vec<String> {
        events
            .into_iter()
            .map(|e| format!("{} {}", e.offset, e.event_type))
            .collect()
    };
    let page = types(tight.events(&orders, 0, 100).await.unwrap());
    assert_eq!(page.len(), 1, "the tight host's page: {page:?}");
    let page = types(loose.events(&orders, 0, 100).await.unwrap());
    assert_eq!(page.len(), 4, "the loose host's page: {page:?}");

    // [limits] jsonata-max-bytes: a condition building 200,000 bytes.
    // (Conditions run on `SCHED_IDLE` threads: with every core busy, as
    // beside other tests, their turns can come seconds apart. What is
    // asserted is the answer, not how soon it comes.)
    let building = streamhost::WaitFor::new(30_000)
        .after(0)
        .condition(r#"$length($pad("", 200000)) > 0"#);
    let refused = tight
        .wait_for_event(&orders, building.clone())
        .await
        .unwrap_err();
    assert_eq!(
        refused.code, "jsonata-limit-exceeded",
        "{}",
        refused.message
    );
    assert!(refused.message.contains("100000"), "{}", refused.message);
    assert_eq!(
        loose
            .wait_for_event(&orders, building)
            .await
            .unwrap()
            .offset,
        1
    );

    // max-body-bytes holds for the events a copy's transform makes too: a
    // 20,000-byte copy halts the tight host's subscription, the loose host
    // copies it.
    let halted = eventually("the tight host's copy to halt", async || {
        let rt = tight.runtime(&orders).await.ok()?;
        rt.subscriptions.get("padded").filter(|d| d.halted).cloned()
    })
    .await;
    let error = halted.last_error.unwrap_or_default();
    assert!(error.contains("10000-byte append limit"), "{error}");
    let padded = loose.stream("acme", "/padded").unwrap();
    let copy = loose
        .wait_for_event(
            &padded,
            streamhost::WaitFor::new(10_000)
                .after(0)
                .event_types(["events.example/order-created"]),
        )
        .await
        .unwrap();
    assert_eq!(copy.payload["pad"].as_str().map(str::len), Some(20_000));
}

/// A wait for a processor answers once it folded through the offset, with
/// `processor-halted` (naming its error) as soon as it halts short of it,
/// and with `timeout` naming how far it got.
#[tokio::test(flavor = "multi_thread")]
async fn a_wait_for_a_processor_answers_its_fold_its_halt_or_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    config.delivery.max_attempts = 1;
    let host = Host::open(config).expect("opening the host");
    host.deploy(Deploy::new("acme", "hostile", guest("hostile")))
        .await
        .unwrap();
    let work = host.stream("acme", "/work").unwrap();
    host.subscribe(
        &work,
        &Subscription::wake("hostile", "hostile").from_beginning(),
    )
    .await
    .unwrap();
    let ok = host
        .append(&work, [event("events.example/counted", json!({}))])
        .await
        .unwrap()
        .events[0]
        .offset;
    let folded = host
        .wait_for_processor(&work, "hostile", ok, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(folded.checkpoint_offset >= ok);

    let short = host
        .wait_for_processor(&work, "hostile", ok + 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(short.code, "timeout", "{}", short.message);
    assert!(
        short
            .message
            .contains(&format!("through offset {ok}, not {}", ok + 1)),
        "{}",
        short.message
    );

    let failing = host
        .append(&work, [event("hostile/trap", json!({}))])
        .await
        .unwrap()
        .events[0]
        .offset;
    let halted = host
        .wait_for_processor(&work, "hostile", failing, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(halted.code, "processor-halted", "{}", halted.message);
    assert!(
        halted.message.contains("traps on purpose"),
        "{}",
        halted.message
    );
}
