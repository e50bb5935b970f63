//! Copy-to-stream benchmark: `cargo bench -p streamhost --bench copy`.
//!
//! Runs the host in-process on a temp SQLite database (`durability = full`)
//! and reports, in one run:
//! - append → committed-copy latency (p50, p99) at a steady append rate, as
//!   the source's actor measures it: from the commit of the source event to
//!   the receiver's acknowledgement of the committed copy;
//! - copy throughput (copies committed per second) for one subscription and
//!   for 100 subscriptions of one source, catching up on a pre-filled log;
//! - the disk's raw fsync rate, measured in the same run.
//!
//! Options (after `--`): `--rate N` appends/s (default 500), `--seconds S`
//! of steady appends (default 4), `--events N` per throughput run (20000).

mod common;
use common::{arg, fsync_rate};

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use streamhost::stream::{AppendInput, Authority, Namespace, StreamAddress};
use streamhost::{Config, Host};

fn input(v: Value) -> AppendInput {
    serde_json::from_value(v).expect("append input")
}

fn open(dir: &std::path::Path) -> (Host, Namespace) {
    let host = Host::open(Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    (host, Namespace::project("bench").unwrap())
}

async fn subscribe(host: &Host, source: &StreamAddress, key: &str, receiver: &str, start: &str) {
    host.streams()
        .append(
            source,
            input(
                json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": key, "filter": {"eventTypes": ["bench.example/e"]},
                    "receiver": {"action": "copy-to-stream", "receivingStreamPath": receiver,
                                 "delivery": {"start": start, "onFailingEvent": "halt"}}}}]}),
            ),
            Authority::Public,
        )
        .await
        .unwrap();
}

/// Waits until every subscription of `source` has acknowledged its head.
async fn caught_up(host: &Host, source: &StreamAddress, head: u64) {
    loop {
        let rt = host.streams().runtime(source).await.unwrap();
        if rt
            .subscriptions
            .values()
            .all(|s| s.acknowledged_offset == head)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn latency(rate: f64, seconds: f64) -> (usize, Value) {
    let dir = tempfile::tempdir().unwrap();
    let (host, ns) = open(dir.path());
    let src = StreamAddress::new(ns.clone(), "/latency/src").unwrap();
    subscribe(&host, &src, "k", "/latency/dst", "now").await;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let start = Instant::now();
    let mut n = 0;
    let mut head = 0;
    while start.elapsed().as_secs_f64() < seconds {
        tick.tick().await;
        let out = host
            .streams()
            .append(
                &src,
                input(json!({"events": [{"type": "bench.example/e", "payload": {"n": n}}]})),
                Authority::Public,
            )
            .await
            .unwrap();
        head = out.events[0].offset;
        n += 1;
    }
    caught_up(&host, &src, head).await;
    let rt = host.streams().runtime(&src).await.unwrap();
    let stats = &rt.subscriptions["k"].completion_latency_ms;
    (n, serde_json::to_value(stats).unwrap())
}

async fn throughput(subscriptions: usize, events: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (host, ns) = open(dir.path());
    let src = StreamAddress::new(ns.clone(), "/throughput/src").unwrap();
    let mut head = 0;
    for chunk in 0..events.div_ceil(500) {
        let batch: Vec<Value> = (0..500.min(events - chunk * 500))
            .map(|i| json!({"type": "bench.example/e", "payload": {"n": chunk * 500 + i, "pad": "0123456789abcdef"}}))
            .collect();
        let out = host
            .streams()
            .append(&src, input(json!({ "events": batch })), Authority::Public)
            .await
            .unwrap();
        head = out.events.last().unwrap().offset;
    }
    let start = Instant::now();
    for i in 0..subscriptions {
        subscribe(
            &host,
            &src,
            &format!("k{i}"),
            &format!("/throughput/dst{i}"),
            "beginning",
        )
        .await;
        head += 1;
    }
    caught_up(&host, &src, head).await;
    (subscriptions * events) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let rate = arg("--rate", 500.0);
    let seconds = arg("--seconds", 4.0);
    let events = arg("--events", 20000.0) as usize;
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

    eprintln!("steady appends at {rate}/s for {seconds} s ...");
    let (n, stats) = rt.block_on(latency(rate, seconds));
    println!(
        "append → committed copy, {n} events at {rate:.0}/s: p50 {} ms, p99 {} ms, max {} ms  (aim: p50 ≤ 2, p99 ≤ 20)",
        stats["p50"], stats["p99"], stats["max"]
    );
    println!();
    println!(
        "{:<36} {:>14} {:>12}",
        "copy throughput", "copies/s", "÷ fsync/s"
    );
    for (subs, n) in [(1, events), (100, events / 10)] {
        eprintln!("{subs} subscription(s) catching up on {n} events ...");
        let rate = rt.block_on(throughput(subs, n));
        println!(
            "{:<36} {:>14.0} {:>11.1}×",
            format!("{subs} subscription(s), {n} events each"),
            rate,
            rate / fsyncs
        );
    }
}
