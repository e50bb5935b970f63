//! The Durable Streams protocol's cost: `cargo bench -p streamhost --bench
//! durable_streams`.
//!
//! In one run, against three servers on loopback: streamhost's `/ds/`
//! endpoint, streamhost's native API (the same appends and live reads as
//! its own requests), and the protocol's Node reference server
//! (`@durable-streams/server` from `tests/durable-streams`, in memory: it
//! writes nothing to disk; `npm ci --prefix tests/durable-streams` first,
//! else its rows are left out):
//! - single appends: 16 clients each appending one small JSON message at a
//!   time to one stream, for `--seconds` (default 3): appends/s, p50/p99;
//! - batched appends: 16 clients each appending 100 messages at a time:
//!   messages/s;
//! - SSE tail latency at `--clients` (default 1,000) live readers of one
//!   stream, appends at `--rate` (default 50/s): append → receive p50/p99
//!   and the share of messages every reader received.
//!
//! Ratios are of the same run: the protocol ÷ streamhost's native API (what
//! speaking it costs), streamhost ÷ the reference server.

mod common;
use common::{arg, percentile};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Which server and which API a scenario drives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    /// streamhost's `/ds/bench/...`.
    Durable,
    /// streamhost's `/v1/projects/bench/streams/...`.
    Native,
    /// The reference server (the protocol at its root).
    Reference,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Durable => "streamhost, Durable Streams",
            Api::Native => "streamhost, native API",
            Api::Reference => "reference server (Node, memory)",
        }
    }
}

/// A stream to drive: where it is and how to talk to it.
struct Target {
    api: Api,
    url: String,
}

impl Target {
    async fn create(&self, http: &reqwest::Client) {
        if self.api != Api::Native {
            let r = http
                .put(&self.url)
                .header("content-type", "application/json")
                .body("[]")
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "create: {}", r.status());
        }
    }

    /// One append of `messages` (each `{"t": micros, "pad": ...}`).
    fn append(&self, http: &reqwest::Client, messages: &[Value]) -> reqwest::RequestBuilder {
        match self.api {
            Api::Native => {
                let events: Vec<Value> = messages
                    .iter()
                    .map(|m| json!({"type": "bench.example/e", "payload": m}))
                    .collect();
                http.post(format!("{}:append", self.url))
                    .json(&json!({ "events": events }))
            }
            _ => http
                .post(&self.url)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(messages).unwrap()),
        }
    }

    fn live_url(&self) -> String {
        match self.api {
            Api::Native => format!(
                "{}:connect?eventTypes=bench.example/e&state=false",
                self.url
            ),
            _ => format!("{}?offset=now&live=sse", self.url),
        }
    }
}

async fn appends(target: &Target, clients: usize, batch: usize, seconds: f64) -> (f64, f64, f64) {
    let http = reqwest::Client::new();
    target.create(&http).await;
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let http = http.clone();
        let request = move |t: &Target| {
            let messages: Vec<Value> = (0..batch)
                .map(|i| json!({"t": i, "pad": "xxxxxxxxxxxxxxxx"}))
                .collect();
            t.append(&http, &messages)
        };
        let target = Target {
            api: target.api,
            url: target.url.clone(),
        };
        tasks.push(tokio::spawn(async move {
            let mut ms = Vec::new();
            while Instant::now() < stop {
                let before = Instant::now();
                let r = request(&target).send().await.unwrap();
                assert!(r.status().is_success(), "append: {}", r.status());
                let _ = r.bytes().await;
                ms.push(before.elapsed().as_secs_f64() * 1000.0);
            }
            ms
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let per_s = all.len() as f64 * batch as f64 / seconds;
    (per_s, percentile(all.clone(), 0.5), percentile(all, 0.99))
}

/// One live reader: counts itself ready at its first message from the
/// server, then records append → receive latency of each message.
async fn reader(
    api: Api,
    url: String,
    epoch: Instant,
    ready: Arc<AtomicUsize>,
    latencies: Arc<Mutex<Vec<f64>>>,
    received: Arc<AtomicU64>,
) {
    let client = reqwest::Client::new();
    let Ok(mut response) = client.get(&url).send().await else {
        return;
    };
    let mut buffer = String::new();
    let mut counted = false;
    let mut local = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        if !counted {
            counted = true;
            ready.fetch_add(1, Ordering::Relaxed);
        }
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let message: String = buffer.drain(..end + 2).collect();
            let data: String = message
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .collect::<Vec<_>>()
                .join("\n");
            let Ok(v) = serde_json::from_str::<Value>(data.trim_start()) else {
                continue;
            };
            let now_us = epoch.elapsed().as_micros() as f64;
            let items: Vec<&Value> = match api {
                Api::Native => v["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| &e["payload"])
                    .collect(),
                _ => v.as_array().into_iter().flatten().collect(),
            };
            for m in items {
                if let Some(t) = m["t"].as_f64() {
                    local.push((now_us - t) / 1000.0);
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // (Kept as it comes: the reader is aborted at the end.)
        if !local.is_empty() {
            latencies.lock().unwrap().append(&mut local);
        }
    }
}

/// SSE tail latency: `clients` readers, appends at `rate` for `seconds`.
async fn tail(target: &Target, clients: usize, rate: f64, seconds: f64) -> (f64, f64, f64) {
    let http = reqwest::Client::new();
    target.create(&http).await;
    let epoch = Instant::now();
    let ready = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let received = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..clients {
        readers.push(tokio::spawn(reader(
            target.api,
            target.live_url(),
            epoch,
            ready.clone(),
            latencies.clone(),
            received.clone(),
        )));
    }
    // The native API's connections send nothing until an event: a first
    // one tells each reader it is connected.
    let warm = Instant::now() + Duration::from_secs(60);
    while ready.load(Ordering::Relaxed) < clients && Instant::now() < warm {
        if target.api == Api::Native {
            let _ = target.append(&http, &[json!({"warm": true})]).send().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        tick.tick().await;
        let t = epoch.elapsed().as_micros() as u64;
        let r = target
            .append(&http, &[json!({"t": t})])
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "append: {}", r.status());
        sent += 1;
    }
    let want = sent * clients as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for r in readers {
        r.abort();
    }
    let l = latencies.lock().unwrap().clone();
    (
        received.load(Ordering::Relaxed) as f64 / want.max(1) as f64,
        percentile(l.clone(), 0.5),
        percentile(l, 0.99),
    )
}

/// The reference server, if its package is installed: its child and URL.
fn reference() -> Option<(std::process::Child, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/durable-streams");
    if !dir.join("node_modules/@durable-streams/server").exists() {
        eprintln!("(the reference server is not installed: npm ci --prefix tests/durable-streams)");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new("node")
        .current_dir(&dir)
        .args(["reference-server.mjs", &port.to_string(), "20000"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((child, url))
}

#[tokio::main]
async fn main() {
    let seconds = arg("--seconds", 3.0);
    let clients = arg("--clients", 1000.0) as usize;
    let rate = arg("--rate", 50.0);
    let served = common::serve_fresh_host().await;
    let base = served.base.clone();
    let mut reference = reference();
    let mut apis = vec![Api::Durable, Api::Native];
    if reference.is_some() {
        apis.push(Api::Reference);
    }
    let target = |api: Api, name: &str| Target {
        api,
        url: match api {
            Api::Durable => format!("{base}/ds/bench/{name}"),
            Api::Native => format!("{base}/v1/projects/bench/streams/{name}"),
            Api::Reference => format!("{}/{name}", reference.as_ref().unwrap().1),
        },
    };

    println!("streamhost durability full (fsync before every answer); the reference server keeps memory only");
    println!();
    println!(
        "{:<34} {:>12} {:>9} {:>9}",
        "single appends, 16 clients", "appends/s", "p50 ms", "p99 ms"
    );
    let mut single = Vec::new();
    for &api in &apis {
        let (per_s, p50, p99) = appends(&target(api, "single"), 16, 1, seconds).await;
        println!("{:<34} {per_s:>12.0} {p50:>9.2} {p99:>9.2}", api.name());
        single.push((api, per_s));
    }
    println!();
    println!(
        "{:<34} {:>12} {:>9} {:>9}",
        "batches of 100, 16 clients", "messages/s", "p50 ms", "p99 ms"
    );
    let mut batched = Vec::new();
    for &api in &apis {
        let (per_s, p50, p99) = appends(&target(api, "batched"), 16, 100, seconds).await;
        println!("{:<34} {per_s:>12.0} {p50:>9.2} {p99:>9.2}", api.name());
        batched.push((api, per_s));
    }
    println!();
    let title = format!("SSE tail, {clients} readers, {rate}/s");
    println!(
        "{title:<34} {:>12} {:>9} {:>9}",
        "received", "p50 ms", "p99 ms"
    );
    let mut tails = Vec::new();
    for &api in &apis {
        let (share, p50, p99) = tail(&target(api, "tail"), clients, rate, seconds).await;
        println!(
            "{:<34} {:>11.1}% {p50:>9.2} {p99:>9.2}",
            api.name(),
            share * 100.0
        );
        tails.push((api, p50));
    }
    let ratio = |rows: &[(Api, f64)], a: Api, b: Api| {
        let get = |x| rows.iter().find(|(api, _)| *api == x).map(|(_, v)| *v);
        match (get(a), get(b)) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
            _ => "-".into(),
        }
    };
    println!();
    println!(
        "Durable Streams ÷ native: single {} batched {} tail p50 {}",
        ratio(&single, Api::Durable, Api::Native),
        ratio(&batched, Api::Durable, Api::Native),
        ratio(&tails, Api::Durable, Api::Native)
    );
    println!(
        "streamhost ÷ reference:   single {} batched {} tail p50 {}",
        ratio(&single, Api::Durable, Api::Reference),
        ratio(&batched, Api::Durable, Api::Reference),
        ratio(&tails, Api::Durable, Api::Reference)
    );
    if let Some((child, _)) = &mut reference {
        let _ = child.kill();
        let _ = child.wait();
    }
    served.stop().await;
}
