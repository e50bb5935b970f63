//! Reactor benchmark: `cargo bench -p streamhost --bench reactor`.
//!
//! What a reactor adds to an append. The host runs in-process on a temp
//! SQLite database; three streams take single-event appends one after the
//! other: one with no reactor, then one and three reactors (the `welcome`
//! example) whose calls return no effect, then one and three whose calls
//! each return one webhook effect (which the outbox then runs: its leases,
//! settlements and POSTs share the machine with the appends). The streams take turns
//! in short rounds, so the three rows share the machine's moods. Reported,
//! in one run, for `durability` normal (the commit without its fsync, where
//! the reactor's share shows) and full (what a client waits for): append
//! latency p50 / p99 per stream, and the p50 each adds over `/r0`. Then the
//! reactor call alone (`Runtime::react`: a fresh instance, the call, the
//! effects back), p50 / p99. The effects run against a loopback receiver
//! that answers `200`.
//!
//! Options (after `--`): `--appends N` per stream and mode (default 2000),
//! `--rounds N` turns per stream (default 20).
//! Needs the guests built: `cargo build --release --target wasm32-wasip2
//! --manifest-path examples/processors/Cargo.toml` (scripts/test does it).

mod common;
use common::{arg, percentile};

use std::time::Instant;

use serde_json::{json, Value};
use streamhost::config::{Config, Durability};
use streamhost::stream::{AppendInput, Authority, Namespace, StreamAddress};
use streamhost::Host;

fn input(v: Value) -> AppendInput {
    serde_json::from_value(v).expect("append input")
}

/// A loopback receiver answering every POST with `200`; its base URL.
async fn sink() -> String {
    use axum::routing::post;
    let app = axum::Router::new().route("/{*rest}", post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

fn stream(path: &str) -> StreamAddress {
    StreamAddress::new(Namespace::project("bench").unwrap(), path).unwrap()
}

async fn configure(host: &Host, at: &StreamAddress, reactors: usize, filter: &Value) {
    // Every stream exists before timing starts.
    host.streams()
        .append(
            at,
            input(json!({"events": [{"type": "bench.example/start"}]})),
            Authority::Public,
        )
        .await
        .unwrap();
    for i in 0..reactors {
        host.streams()
            .append(
                at,
                input(
                    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                    "payload": {"subscriptionKey": format!("welcome.v{i}"),
                        "filter": filter,
                        "receiver": {"action": "reactor",
                            "expression": ["components", ["get", "welcome"], "react"]}}}]}),
                ),
                Authority::Public,
            )
            .await
            .unwrap();
    }
}

/// The streams measured: (name, path, reactors, event type). The welcome
/// reactor answers one webhook effect for a `user-signed-up` event and
/// none for a `user-visited` one (the call without the outbox's share).
const STREAMS: &[(&str, &str, usize, &str)] = &[
    ("no reactor", "/r0", 0, "user-signed-up"),
    ("1 reactor, no effect", "/r1n", 1, "user-visited"),
    ("3 reactors, no effect", "/r3n", 3, "user-visited"),
    ("1 reactor, 1 effect", "/r1e", 1, "user-signed-up"),
    ("3 reactors, 3 effects", "/r3e", 3, "user-signed-up"),
];

/// Per stream of [`STREAMS`]: append latencies in microseconds.
async fn measure(
    durability: Durability,
    appends: usize,
    rounds: usize,
    base: &str,
) -> Vec<Vec<f64>> {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        durability,
        ..Config::default()
    })
    .unwrap();
    common::deploy(&host, "welcome", common::guest_wasm("welcome")).await;
    let streams: Vec<StreamAddress> = STREAMS.iter().map(|(_, p, _, _)| stream(p)).collect();
    for (at, (_, _, n, event_type)) in streams.iter().zip(STREAMS) {
        configure(&host, at, *n, &json!({"eventTypes": [event_type]})).await;
    }
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); STREAMS.len()];
    let per_round = appends.div_ceil(rounds).max(1);
    let mut n = 0;
    // One untimed warm-up append each (the component compiles here).
    for round in 0..=rounds {
        for (i, at) in streams.iter().enumerate() {
            let count = if round == 0 { 1 } else { per_round };
            for _ in 0..count {
                n += 1;
                let event = json!({"events": [{"type": STREAMS[i].3, "payload": {
                    "userId": format!("u{n}"), "email": "someone@example.com",
                    "welcomeUrl": format!("{base}/welcome/{n}")}}]});
                let started = Instant::now();
                host.streams()
                    .append(at, input(event), Authority::Public)
                    .await
                    .unwrap();
                if round > 0 {
                    latencies[i].push(started.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
    }
    latencies
}

/// `Runtime::react` alone: microseconds per call.
fn react_alone(calls: usize) -> Vec<f64> {
    use streamhost::processor::runtime::{Determinism, Runtime};
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(cache.path().to_path_buf()).unwrap();
    let bytes = common::guest_wasm("welcome");
    let digest = streamhost::processor::runtime::digest(&bytes);
    let prepared = runtime.prepare(&digest, || Ok(bytes)).unwrap();
    let event = json!({"offset": 7, "type": "user-signed-up", "createdAt": "2026-12-01T00:00:00.000Z",
        "payload": {"userId": "ada", "email": "ada@example.com", "welcomeUrl": "http://127.0.0.1:9/w"}})
    .to_string();
    let mut out = Vec::with_capacity(calls);
    for i in 0..calls + 50 {
        let started = Instant::now();
        let effects = runtime
            .react(
                "welcome",
                &prepared,
                &event,
                Determinism::for_event("s", 7, 0),
                1000,
            )
            .unwrap();
        assert_eq!(effects.len(), 1);
        if i >= 50 {
            out.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    out
}

#[tokio::main]
async fn main() {
    let appends = arg("--appends", 2000.0) as usize;
    let rounds = arg("--rounds", 20.0) as usize;
    let base = sink().await;
    println!("Reactors: single-event appends, {appends} per stream and mode, in {rounds} turns");
    println!(
        "{:<40} {:>10} {:>10} {:>16}",
        "stream", "p50 µs", "p99 µs", "p50 added µs"
    );
    for (mode, durability) in [("normal", Durability::Normal), ("full", Durability::Full)] {
        let latencies = measure(durability, appends, rounds, &base).await;
        let p50s: Vec<f64> = latencies
            .iter()
            .map(|l| percentile(l.clone(), 0.5))
            .collect();
        for (i, ((name, ..), l)) in STREAMS.iter().zip(&latencies).enumerate() {
            println!(
                "{:<40} {:>10.0} {:>10.0} {:>16}",
                format!("durability={mode}, {name}"),
                p50s[i],
                percentile(l.clone(), 0.99),
                if i == 0 {
                    "-".to_string()
                } else {
                    format!("{:+.0}", p50s[i] - p50s[0])
                }
            );
        }
    }
    let mut handoff = Vec::with_capacity(appends);
    for _ in 0..appends {
        let started = Instant::now();
        tokio::task::spawn_blocking(|| ()).await.unwrap();
        handoff.push(started.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "a blocking thread's round trip (spawn_blocking of nothing): p50 {:.0} µs, p99 {:.0} µs",
        percentile(handoff.clone(), 0.5),
        percentile(handoff, 0.99)
    );
    let alone = react_alone(appends);
    println!(
        "Runtime::react alone (fresh instance + call): p50 {:.0} µs, p99 {:.0} µs",
        percentile(alone.clone(), 0.5),
        percentile(alone, 0.99)
    );
}
