//! Effects benchmark: `cargo bench -p streamhost --bench effects`.
//!
//! Runs the host in-process on a temp SQLite database (`durability = full`,
//! default `[effects]`) and reports, in one run, for append effects and,
//! beside them, for copy-to-stream (the same events, the same receiving
//! stream, measured the same way):
//! - latency (after one untimed warm-up event) from the source commit (the append's acknowledgement) to the
//!   target event committed (its arrival on a live connection to the
//!   receiving stream), p50 / p99 / max, at a steady append rate: for an
//!   effect that is fold → commit with the checkpoint → lease → append
//!   (its settlement in the same commit), for a copy the delivery job;
//! - throughput, targets committed per second, catching up on a pre-filled
//!   log of events that each ask for one append effect, and beside it the
//!   rate at which the effector stored those effects (its checkpoint
//!   reaching the source's head);
//! - the disk's raw fsync rate, measured in the same run;
//! - a plain outbox relay on the same database (SQLite, and PostgreSQL
//!   with `STREAMHOST_BENCH_POSTGRES`): the same append effects stored
//!   pending, leased in batches of 256 (one commit), their events appended
//!   and the effects settled (one commit) by a minimal loop on one
//!   connection, the bound the executor is measured against.
//!
//! Options (after `--`): `--rate N` appends/s (default 200), `--seconds S`
//! of steady appends (default 4), `--events N` per throughput run (5000),
//! `--concurrency N` effects at once (`[effects] concurrency`; default: the
//! configuration's, 256, of which one project takes all but a share's worth).
//! `STREAMHOST_BENCH_POSTGRES=postgres://…` also runs the throughput rows
//! and the plain relay on fresh PostgreSQL databases of that server.
//! Needs the guests built: `cargo build --release --target wasm32-wasip2
//! --manifest-path examples/processors/Cargo.toml` (scripts/test does it).

mod common;
use common::{arg, fsync_rate, percentile};

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use streamhost::connection::feed::FeedItem;
use streamhost::connection::ConnectParams;
use streamhost::stream::{AppendInput, Authority, Namespace, StreamAddress};
use streamhost::{Config, Host};
use tokio::sync::mpsc;

fn input(v: Value) -> AppendInput {
    serde_json::from_value(v).expect("append input")
}

/// How the source's events reach `/bench/out`.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Effect,
    Copy,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Effect => "append effect",
            Kind::Copy => "copy-to-stream",
        }
    }
}

const OUT: &str = "/bench/out";

/// A source event: a copy carries it whole, the effector turns it into one
/// append effect with the same `n`.
fn event(n: usize) -> Value {
    json!({"type": "events.example/effects-requested", "payload": {"n": n, "effects": [
        {"key": format!("e-{n}"), "append": {"streamPath": OUT, "type": "bench.example/done",
            "payload": {"n": n}}}]}})
}

async fn open(dir: &Path, postgres: Option<&str>) -> (Host, StreamAddress) {
    let mut config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    if let Some(base) = postgres {
        let base = base.to_string();
        config.storage = Some(
            std::thread::spawn(move || common::fresh_postgres(&base, "streamhost_bench_effects"))
                .join()
                .unwrap(),
        );
    }
    let default = config.effects.concurrency as f64;
    config.effects.concurrency = arg("--concurrency", default) as usize;
    let host = Host::open(config).unwrap();
    common::deploy(&host, "effector", common::guest_wasm("effector")).await;
    let src = StreamAddress::new(Namespace::project("bench").unwrap(), "/bench/src").unwrap();
    (host, src)
}

async fn subscribe(host: &Host, src: &StreamAddress, kind: Kind) -> u64 {
    let receiver = match kind {
        Kind::Effect => json!({"action": "processor-wake",
            "expression": ["components", ["get", "effector"], "wake"]}),
        Kind::Copy => json!({"action": "copy-to-stream", "receivingStreamPath": OUT,
            "delivery": {"start": "beginning", "onFailingEvent": "halt"}}),
    };
    host.streams()
        .append(
            src,
            input(
                json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "k",
                    "filter": {"eventTypes": ["events.example/effects-requested"]},
                    "receiver": receiver}}]}),
            ),
            Authority::Public,
        )
        .await
        .unwrap()
        .events[0]
        .offset
}

/// Arrivals on the receiving stream: (n, when its event reached a live
/// connection, right after its commit).
async fn watch(host: &Host) -> mpsc::UnboundedReceiver<(usize, Instant)> {
    let out = StreamAddress::new(Namespace::project("bench").unwrap(), OUT).unwrap();
    host.streams()
        .append(
            &out,
            input(json!({"events": [{"type": "bench.example/start"}]})),
            Authority::Public,
        )
        .await
        .unwrap();
    let mut feed = host
        .streams()
        .connect(
            &out,
            ConnectParams {
                state: false,
                max_delivery_events: 10_000,
                ..ConnectParams::default()
            },
        )
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(item) = feed.next().await {
            let FeedItem::Events { events, .. } = item else {
                return;
            };
            let now = Instant::now();
            for e in events.iter() {
                if let Some(n) = e.value["payload"]["n"].as_u64() {
                    let _ = tx.send((n as usize, now));
                }
            }
        }
    });
    rx
}

async fn latency(kind: Kind, rate: f64, seconds: f64) -> (usize, [f64; 3]) {
    let dir = tempfile::tempdir().unwrap();
    let (host, src) = open(dir.path(), None).await;
    subscribe(&host, &src, kind).await;
    let mut arrivals = watch(&host).await;
    // Warm up (compile the component, start the actors), untimed.
    const WARM: usize = 1_000_000;
    host.streams()
        .append(
            &src,
            input(json!({ "events": [event(WARM)] })),
            Authority::Public,
        )
        .await
        .unwrap();
    while arrivals.recv().await.expect("the connection closed").0 != WARM {}
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut sent: HashMap<usize, Instant> = HashMap::new();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed().as_secs_f64() < seconds {
        tick.tick().await;
        host.streams()
            .append(
                &src,
                input(json!({ "events": [event(n)] })),
                Authority::Public,
            )
            .await
            .unwrap();
        sent.insert(n, Instant::now());
        n += 1;
    }
    let mut samples = Vec::with_capacity(n);
    let mut arrived: HashMap<usize, Instant> = HashMap::new();
    while arrived.len() < n {
        let (i, at) = tokio::time::timeout(Duration::from_secs(60), arrivals.recv())
            .await
            .expect("targets stopped arriving")
            .expect("the connection closed");
        arrived.entry(i).or_insert(at);
    }
    for (i, at) in arrived {
        samples.push(at.saturating_duration_since(sent[&i]).as_secs_f64() * 1000.0);
    }
    (
        n,
        [
            percentile(samples.clone(), 0.5),
            percentile(samples.clone(), 0.99),
            percentile(samples, 1.0),
        ],
    )
}

/// A catch-up's targets/s and, for append effects, the effector's own
/// rate: its source events folded (and their effects stored) a second,
/// from the subscription to its checkpoint reaching the source's head.
async fn throughput(kind: Kind, events: usize, postgres: Option<&str>) -> (f64, Option<f64>) {
    let dir = tempfile::tempdir().unwrap();
    let (host, src) = open(dir.path(), postgres).await;
    for chunk in 0..events.div_ceil(500) {
        let batch: Vec<Value> = (chunk * 500..events.min(chunk * 500 + 500))
            .map(event)
            .collect();
        host.streams()
            .append(&src, input(json!({ "events": batch })), Authority::Public)
            .await
            .unwrap();
    }
    let mut arrivals = watch(&host).await;
    let start = Instant::now();
    let head = subscribe(&host, &src, kind).await;
    // When the effector's checkpoint covers the source's head, every
    // effect is stored.
    let folded = async {
        if kind != Kind::Effect {
            return None;
        }
        host.wait_for_processor(&src, "effector", head, Duration::from_secs(120))
            .await
            .expect("the effector reaches the source's head");
        Some(start.elapsed())
    };
    let arrived = async {
        let mut seen = std::collections::HashSet::new();
        while seen.len() < events {
            let (i, _) = tokio::time::timeout(Duration::from_secs(120), arrivals.recv())
                .await
                .expect("targets stopped arriving")
                .expect("the connection closed");
            seen.insert(i);
        }
        start.elapsed()
    };
    let (folded, arrived) = tokio::join!(folded, arrived);
    let rate = events as f64 / arrived.as_secs_f64();
    let fold_rate = folded.map(|f| events as f64 / f.as_secs_f64());
    // Off the runtime's threads: a PostgreSQL host's blocking clients end
    // with runtimes of their own.
    std::thread::spawn(move || drop((host, dir)))
        .join()
        .unwrap();
    (rate, fold_rate)
}

/// Effects leased at once by the plain relay, as many as the host's
/// default `[effects] concurrency`.
fn relay_batch() -> usize {
    Config::default().effects.concurrency
}

/// Has a host make its storage (in `dir`, or the PostgreSQL database
/// `storage`) with the relay's target stream, then closes it.
fn relay_target(rt: &tokio::runtime::Runtime, dir: &Path, storage: Option<String>) {
    rt.block_on(async {
        let host = Host::open(Config {
            data_dir: dir.to_path_buf(),
            storage,
            ..Config::default()
        })
        .unwrap();
        let out = host.stream("bench", OUT).unwrap();
        host.append(&out, [streamhost::EventInput::new("bench.example/start")])
            .await
            .unwrap();
        std::thread::spawn(move || drop(host)).join().unwrap();
    });
}

/// The event a relay appends for effect `id` (its key and stored target)
/// at `offset`: its idempotency key and its stored body, as the executor
/// stores them.
fn relayed_event(
    offset: i64,
    id: i64,
    key: &str,
    target: &str,
    stream_id: &str,
) -> (String, Value) {
    let target: Value = serde_json::from_str(target).unwrap();
    let idempotency_key = format!("effect:effector:/bench/src:{key}");
    let body = json!({"offset": offset, "type": target["append"]["type"],
        "payload": target["append"]["payload"], "idempotencyKey": idempotency_key,
        "createdAt": "2026-12-05T00:00:00.000Z", "streamId": stream_id,
        "source": {"effect": {"path": "/bench/src", "streamId": "s",
            "component": "effector", "key": key, "checkpointOffset": id}}});
    (idempotency_key, body)
}

/// The plain outbox relay on the same database (SQLite, the host's schema,
/// WAL, `synchronous = FULL`): `events` append effects to one stream stored
/// pending, then a minimal loop leases the oldest due batch (one commit),
/// appends their events to the target stream and settles them (one
/// commit), until none is due. Answers effects settled a second.
fn plain_relay(events: usize, rt: &tokio::runtime::Runtime) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    // The host makes the database and its schema, and the target stream.
    relay_target(rt, dir.path(), None);
    let mut db = rusqlite::Connection::open(dir.path().join("streamhost.db")).unwrap();
    db.pragma_update(None, "journal_mode", "WAL").unwrap();
    db.pragma_update(None, "synchronous", "FULL").unwrap();
    let (stream, stream_id): (i64, String) = db
        .query_row(
            "SELECT id, stream_id FROM streams WHERE project = 'bench' AND path = ?1",
            [OUT],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    {
        let tx = db.transaction().unwrap();
        for n in 0..events {
            let target = json!({"append": {"streamPath": OUT, "type": "bench.example/done",
                "payload": {"n": n}}});
            tx.execute(
                "INSERT INTO effects (project, path, stream_id, component, effect_key,
                     checkpoint_offset, target, status, due_at_ms, created_at)
                 VALUES ('bench', '/bench/src', 's', 'effector', ?1, ?2, ?3, 'pending', 0,
                     '2026-12-05T00:00:00.000Z')",
                rusqlite::params![format!("e-{n}"), n as i64, target.to_string()],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let start = Instant::now();
    let mut settled = 0;
    loop {
        // Lease the oldest due batch.
        let tx = db.transaction().unwrap();
        let batch: Vec<(i64, String, String)> = tx
            .prepare_cached(
                "UPDATE effects SET status = 'running', attempts = attempts + 1,
                     lease_id = lease_id + 1, due_at_ms = 30000
                 WHERE id IN (SELECT id FROM effects WHERE status = 'pending' AND due_at_ms <= 0
                              ORDER BY due_at_ms, id LIMIT ?1)
                 RETURNING id, effect_key, target",
            )
            .unwrap()
            .query_map([relay_batch() as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        tx.commit().unwrap();
        if batch.is_empty() {
            break;
        }
        // Append their events and settle them.
        let tx = db.transaction().unwrap();
        let head: i64 = tx
            .query_row(
                "SELECT head_offset FROM streams WHERE id = ?1",
                [stream],
                |r| r.get(0),
            )
            .unwrap();
        for (i, (id, key, target)) in batch.iter().enumerate() {
            let offset = head + 1 + i as i64;
            let (idempotency_key, body) = relayed_event(offset, *id, key, target, &stream_id);
            tx.prepare_cached(
                "INSERT INTO events (stream, offset, type, idempotency_key, body)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .unwrap()
            .execute(rusqlite::params![
                stream,
                offset,
                "bench.example/done",
                idempotency_key,
                body.to_string()
            ])
            .unwrap();
            tx.prepare_cached(
                "UPDATE effects SET status = 'succeeded', settled_at = '2026-12-05T00:00:01.000Z'
                 WHERE id = ?1",
            )
            .unwrap()
            .execute([id])
            .unwrap();
        }
        tx.execute(
            "UPDATE streams SET head_offset = ?1 WHERE id = ?2",
            [head + batch.len() as i64, stream],
        )
        .unwrap();
        tx.commit().unwrap();
        settled += batch.len();
    }
    assert_eq!(settled, events);
    events as f64 / start.elapsed().as_secs_f64()
}

/// The plain outbox relay on PostgreSQL: the same loop as [`plain_relay`]
/// on a fresh database of the server at `base` (the host's schema; the
/// lease takes the oldest due rows `FOR UPDATE SKIP LOCKED`; a batch's
/// events and settlements are one statement each, over arrays), over one
/// connection; each of its transactions commits as PostgreSQL commits
/// (`synchronous_commit` as the server has it, on by default).
fn plain_relay_postgres(events: usize, rt: &tokio::runtime::Runtime, base: &str) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let url = {
        let base = base.to_string();
        std::thread::spawn(move || common::fresh_postgres(&base, "streamhost_bench_relay"))
            .join()
            .unwrap()
    };
    // The host makes the schema and the target stream.
    relay_target(rt, dir.path(), Some(url.clone()));
    // A blocking client of its own thread (not on the runtime's).
    std::thread::spawn(move || {
        let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("PostgreSQL");
        let row = db
            .query_one(
                "SELECT id, stream_id FROM streams WHERE project = 'bench' AND path = $1",
                &[&OUT],
            )
            .unwrap();
        let (stream, stream_id): (i64, String) = (row.get(0), row.get(1));
        {
            let mut tx = db.transaction().unwrap();
            let insert = tx
                .prepare(
                    "INSERT INTO effects (project, path, stream_id, component, effect_key,
                         checkpoint_offset, target, status, due_at_ms, created_at)
                     VALUES ('bench', '/bench/src', 's', 'effector', $1, $2, $3, 'pending', 0,
                         '2026-12-05T00:00:00.000Z')",
                )
                .unwrap();
            for n in 0..events {
                let target = json!({"append": {"streamPath": OUT, "type": "bench.example/done",
                    "payload": {"n": n}}});
                tx.execute(
                    &insert,
                    &[&format!("e-{n}"), &(n as i64), &target.to_string()],
                )
                .unwrap();
            }
            tx.commit().unwrap();
        }
        let lease = db
            .prepare(
                "UPDATE effects SET status = 'running', attempts = attempts + 1,
                     lease_id = lease_id + 1, due_at_ms = 30000
                 WHERE id IN (SELECT id FROM effects WHERE status = 'pending' AND due_at_ms <= 0
                              ORDER BY due_at_ms, id LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING id, effect_key, target",
            )
            .unwrap();
        // A batch's events and settlements are one statement each (arrays),
        // not a round trip a row.
        let append = db
            .prepare(
                "INSERT INTO events (stream, \"offset\", type, idempotency_key, body)
                 SELECT $1, o, 'bench.example/done', k, b
                 FROM unnest($2::bigint[], $3::text[], $4::text[]) AS t(o, k, b)",
            )
            .unwrap();
        let settle = db
            .prepare(
                "UPDATE effects SET status = 'succeeded', settled_at = '2026-12-05T00:00:01.000Z'
                 WHERE id = ANY($1)",
            )
            .unwrap();
        let start = Instant::now();
        let mut settled = 0;
        loop {
            // Lease the oldest due batch.
            let mut tx = db.transaction().unwrap();
            let batch: Vec<(i64, String, String)> = tx
                .query(&lease, &[&(relay_batch() as i64)])
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            tx.commit().unwrap();
            if batch.is_empty() {
                break;
            }
            // Append their events and settle them.
            let mut tx = db.transaction().unwrap();
            let head: i64 = tx
                .query_one(
                    "SELECT head_offset FROM streams WHERE id = $1 FOR UPDATE",
                    &[&stream],
                )
                .unwrap()
                .get(0);
            let (mut offsets, mut keys, mut bodies, mut ids) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (i, (id, key, target)) in batch.iter().enumerate() {
                let offset = head + 1 + i as i64;
                let (idempotency_key, body) = relayed_event(offset, *id, key, target, &stream_id);
                offsets.push(offset);
                keys.push(idempotency_key);
                bodies.push(body.to_string());
                ids.push(*id);
            }
            tx.execute(&append, &[&stream, &offsets, &keys, &bodies])
                .unwrap();
            tx.execute(&settle, &[&ids]).unwrap();
            tx.execute(
                "UPDATE streams SET head_offset = $1 WHERE id = $2",
                &[&(head + batch.len() as i64), &stream],
            )
            .unwrap();
            tx.commit().unwrap();
            settled += batch.len();
        }
        assert_eq!(settled, events);
        events as f64 / start.elapsed().as_secs_f64()
    })
    .join()
    .unwrap()
}

fn main() {
    let rate = arg("--rate", 200.0);
    let seconds = arg("--seconds", 4.0);
    let events = arg("--events", 5000.0) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let probe = tempfile::tempdir().unwrap();
    let fsyncs = fsync_rate(probe.path());
    println!(
        "raw fsync rate (4 KiB write + fdatasync): {fsyncs:.0}/s ({:.3} ms each)",
        1000.0 / fsyncs
    );
    println!();
    println!(
        "{:<16} {:>28} {:>10} {:>10} {:>10}",
        "source commit →", "target committed", "p50 ms", "p99 ms", "max ms"
    );
    for kind in [Kind::Effect, Kind::Copy] {
        eprintln!(
            "{}: steady appends at {rate}/s for {seconds} s ...",
            kind.name()
        );
        let (n, [p50, p99, max]) = rt.block_on(latency(kind, rate, seconds));
        println!(
            "{:<16} {:>28} {p50:>10.2} {p99:>10.2} {max:>10.2}",
            kind.name(),
            format!("{n} events at {rate:.0}/s"),
        );
    }
    println!();
    println!(
        "{:<16} {:>28} {:>10} {:>10}",
        "throughput", "", "targets/s", "÷ fsync/s"
    );
    let postgres = std::env::var("STREAMHOST_BENCH_POSTGRES").ok();
    let mut engines = vec![("", None)];
    if let Some(url) = postgres.as_deref() {
        engines.push((", PostgreSQL", Some(url)));
    }
    for (engine, url) in engines {
        let mut rates = Vec::new();
        for kind in [Kind::Effect, Kind::Copy] {
            eprintln!(
                "{}{engine}: catching up on {events} events ...",
                kind.name()
            );
            let (r, folded) = rt.block_on(throughput(kind, events, url));
            rates.push(r);
            println!(
                "{:<28} {:>16} {r:>10.0} {:>9.1}×",
                format!("{}{engine}", kind.name()),
                format!("{events} events"),
                r / fsyncs
            );
            if let Some(folded) = folded {
                println!("  the effector stored their effects at {folded:.0}/s (its checkpoint at the head)");
            }
        }
        println!(
            "  append effects run at {:.2}× the copy rate{engine}",
            rates[0] / rates[1]
        );
        {
            eprintln!("plain outbox relay{engine}: {events} effects ...");
            let relay = match url {
                None => plain_relay(events, &rt),
                Some(base) => plain_relay_postgres(events, &rt, base),
            };
            println!(
                "{:<28} {:>16} {relay:>10.0} {:>9.1}×",
                format!("plain outbox relay{engine}"),
                format!("{events} effects"),
                relay / fsyncs
            );
            println!(
                "  append effects run at {:.2}× the plain relay's rate{engine} (batches of \
                 {}, two commits a batch)",
                rates[0] / relay,
                relay_batch()
            );
        }
    }
    // A PostgreSQL host's tasks may still hold blocking clients, which
    // cannot be dropped on the runtime's threads: end here.
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}
