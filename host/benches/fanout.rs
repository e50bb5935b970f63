//! Live-connection fan-out benchmark: `cargo bench -p streamhost --bench fanout`.
//!
//! Runs the host in-process on a loopback port and reports, in one run:
//! - for 1, 100 and 1000 concurrent SSE clients of one stream, appends at a
//!   steady rate: events/s delivered (summed over clients) and append →
//!   receive latency (p50, p99), plus the append latency itself;
//! - a stalled client (connects, never reads) beside 20 healthy ones with
//!   16 KiB events, against the same 20 healthy clients alone: the healthy
//!   clients' latency and the appends' latency stay the same (ratios), and
//!   the stalled client is closed.
//!
//! Options (after `--`): `--rate N` appends/s (default 200), `--seconds S` (3),
//! `--separate-clients`: the SSE clients and the appender run in a separate
//! process (this binary again), so the server's cost is measured alone.

mod common;
use common::{arg, percentile};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[derive(serde::Serialize, serde::Deserialize)]
struct Outcome {
    appends_per_s: f64,
    received_fraction: f64,
    delivered_per_s: f64,
    receive_p50_ms: f64,
    receive_p99_ms: f64,
    append_p50_ms: f64,
    append_p99_ms: f64,
    stalled_closed: bool,
}

/// One client reading batches; records append → receive latency per event.
async fn reader(
    url: String,
    epoch: Instant,
    latencies: Arc<Mutex<Vec<f64>>>,
    received: Arc<AtomicU64>,
) {
    let client = reqwest::Client::new();
    let Ok(mut response) = client.get(&url).send().await else {
        return;
    };
    let mut buffer = String::new();
    let mut local = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let message: String = buffer.drain(..end + 2).collect();
            for line in message.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<Value>(data.trim_start()) else {
                    continue;
                };
                let now_us = epoch.elapsed().as_micros() as f64;
                for e in v["events"].as_array().into_iter().flatten() {
                    if let Some(t) = e["payload"]["t"].as_f64() {
                        local.push((now_us - t) / 1000.0);
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if local.len() >= 64 {
            latencies.lock().unwrap().append(&mut local);
        }
    }
    latencies.lock().unwrap().append(&mut local);
}

/// One scenario: a fresh host served on loopback, driven by [`drive`] here
/// or, with `--separate-clients`, in a client process.
async fn run(clients: usize, stalled: bool, pad_bytes: usize, rate: f64, seconds: f64) -> Outcome {
    let served = common::serve_fresh_host().await;
    let base = served.base.clone();
    let outcome = if common::separate_clients() {
        let args: Vec<String> = [
            ("--url", base),
            ("--clients", clients.to_string()),
            ("--stalled", u8::from(stalled).to_string()),
            ("--pad", pad_bytes.to_string()),
            ("--rate", rate.to_string()),
            ("--seconds", seconds.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect();
        let line = tokio::task::spawn_blocking(move || common::run_child("fanout", &args))
            .await
            .unwrap();
        serde_json::from_str(&line).expect("the client's outcome")
    } else {
        drive(&base, clients, stalled, pad_bytes, rate, seconds).await
    };
    served.stop().await;
    outcome
}

/// The clients of one scenario against the server at `base`: `clients`
/// SSE readers (and a stalled one), appends at `rate` for `seconds`.
async fn drive(
    base: &str,
    clients: usize,
    stalled: bool,
    pad_bytes: usize,
    rate: f64,
    seconds: f64,
) -> Outcome {
    let stream = format!("{base}/v1/projects/bench/streams/fanout");
    let http = reqwest::Client::new();
    http.post(format!("{stream}:append"))
        .json(&json!({"events": [{"type": "bench.example/start"}]}))
        .send()
        .await
        .unwrap();

    let epoch = Instant::now();
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let received = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..clients {
        let url = format!("{stream}:connect?eventTypes=bench.example/e&state=false");
        readers.push(tokio::spawn(reader(
            url,
            epoch,
            latencies.clone(),
            received.clone(),
        )));
    }
    // A stalled client: opens the stream and never reads from it.
    let stalled_response = if stalled {
        Some(
            http.get(format!(
                "{stream}:connect?connectionKey=stalled&state=false"
            ))
            .send()
            .await
            .unwrap(),
        )
    } else {
        None
    };
    // Wait until every client is registered.
    let expected = clients + usize::from(stalled);
    loop {
        let rt: Value = http
            .get(format!("{stream}:runtime"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if rt["connections"].as_object().map_or(0, |c| c.len()) >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let pad = "p".repeat(pad_bytes);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut append_ms = Vec::new();
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        tick.tick().await;
        let t = epoch.elapsed().as_micros() as u64;
        let body =
            json!({"events": [{"type": "bench.example/e", "payload": {"t": t, "pad": pad}}]});
        let before = Instant::now();
        let r = http
            .post(format!("{stream}:append"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
        append_ms.push(before.elapsed().as_secs_f64() * 1000.0);
        sent += 1;
    }
    let want = sent * clients as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.load(Ordering::Relaxed) < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let stalled_closed = if stalled {
        let mut closed = false;
        let mut after = 0;
        loop {
            let page: Value = http
                .get(format!("{stream}:events?afterOffset={after}&limit=500"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let events = page["events"].as_array().unwrap();
            if events.is_empty() {
                break;
            }
            after = events.last().unwrap()["offset"].as_u64().unwrap();
            closed |= events.iter().any(|e| {
                e["type"] == "events.iterate.com/stream/connection-closed"
                    && e["payload"]["connectionKey"] == "stalled"
            });
        }
        closed
    } else {
        false
    };
    drop(stalled_response);
    for r in readers {
        r.abort();
    }
    let l = latencies.lock().unwrap().clone();
    Outcome {
        appends_per_s: sent as f64 / seconds,
        received_fraction: received.load(Ordering::Relaxed) as f64 / want.max(1) as f64,
        delivered_per_s: received.load(Ordering::Relaxed) as f64 / elapsed,
        receive_p50_ms: percentile(l.clone(), 0.5),
        receive_p99_ms: percentile(l.clone(), 0.99),
        append_p50_ms: percentile(append_ms.clone(), 0.5),
        append_p99_ms: percentile(append_ms.clone(), 0.99),
        stalled_closed,
    }
}

/// The client process of `--separate-clients`: prints the outcome as JSON.
fn child() {
    let base = common::arg_text("--url").expect("--url");
    let clients = arg("--clients", 1.0) as usize;
    let stalled = arg("--stalled", 0.0) != 0.0;
    let pad = arg("--pad", 0.0) as usize;
    let (rate, seconds) = (arg("--rate", 200.0), arg("--seconds", 3.0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(async move {
        tokio::spawn(async move { drive(&base, clients, stalled, pad, rate, seconds).await })
            .await
            .unwrap()
    });
    println!("{}", serde_json::to_string(&outcome).unwrap());
}

fn main() {
    if common::child_role().is_some() {
        return child();
    }
    let rate = arg("--rate", 200.0);
    let seconds = arg("--seconds", 3.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("appends at {rate:.0}/s for {seconds} s, one event each; latency = append sent → event received");
    if common::separate_clients() {
        println!("clients: in a separate process (the server's cost alone)");
    }
    println!();
    println!(
        "{:<32} {:>9} {:>9} {:>12} {:>10} {:>10} {:>11} {:>11}",
        "scenario",
        "appends/s",
        "received",
        "delivered/s",
        "recv p50",
        "recv p99",
        "append p50",
        "append p99"
    );
    let row = |name: &str, o: &Outcome| {
        println!(
            "{:<32} {:>9.0} {:>8.1}% {:>12.0} {:>8.2}ms {:>8.2}ms {:>9.2}ms {:>9.2}ms",
            name,
            o.appends_per_s,
            o.received_fraction * 100.0,
            o.delivered_per_s,
            o.receive_p50_ms,
            o.receive_p99_ms,
            o.append_p50_ms,
            o.append_p99_ms
        );
    };
    for clients in [1, 100, 1000] {
        eprintln!("{clients} client(s) ...");
        let o = rt.block_on(run(clients, false, 0, rate, seconds));
        row(&format!("{clients} client(s), small events"), &o);
    }
    eprintln!("stall comparison ...");
    let alone = rt.block_on(run(20, false, 16 * 1024, rate, seconds));
    let with_stall = rt.block_on(run(20, true, 16 * 1024, rate, seconds));
    row("20 clients, 16 KiB events", &alone);
    row("20 clients + 1 stalled, 16 KiB", &with_stall);
    println!();
    println!(
        "stalled/alone ratios: recv p50 {:.2}, recv p99 {:.2}, append p50 {:.2}, delivered/s {:.2}; stalled client closed: {}",
        with_stall.receive_p50_ms / alone.receive_p50_ms,
        with_stall.receive_p99_ms / alone.receive_p99_ms,
        with_stall.append_p50_ms / alone.append_p50_ms,
        with_stall.delivered_per_s / alone.delivered_per_s,
        with_stall.stalled_closed
    );
}
