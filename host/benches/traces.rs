//! Traces benchmark: `cargo bench -p streamhost --bench traces`.
//!
//! Runs the host in-process on a loopback port (real HTTP, real SQLite in a
//! temp dir, `durability = full`) and reports, in one run, appends/s for
//! single-event appends (1 client) and batched appends (100 events per
//! call, 16 clients) in three modes, each request carrying a `traceparent`
//! except the first: no trace context, trace context without export, and
//! export on to a real OTLP/HTTP receiver on loopback (this process,
//! decoding each protobuf request and counting its spans). The modes run in
//! turns (`--runs N`, default 5, of `--seconds S`, default 2); each figure
//! is the median, and the ratio is export-on ÷ export-off measured in the
//! same run (aim: within 5 % for batched appends).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::json;
use streamhost::config::{Config, TelemetryConfig};
use streamhost::Host;

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    clients: usize,
    events_per_call: usize,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "single event, 1 client",
        clients: 1,
        events_per_call: 1,
    },
    Scenario {
        name: "batched (100/call), 16 clients",
        clients: 16,
        events_per_call: 100,
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Untraced,
    Carried,
    Exported,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Untraced => "no trace context",
            Mode::Carried => "traceparent, export off",
            Mode::Exported => "traceparent, export on",
        }
    }
}

/// A loopback OTLP/HTTP receiver counting the spans it decodes.
async fn receiver(spans: Arc<AtomicU64>) -> String {
    async fn traces(State(spans): State<Arc<AtomicU64>>, body: Bytes) -> StatusCode {
        let Ok(request) = ExportTraceServiceRequest::decode(body) else {
            return StatusCode::BAD_REQUEST;
        };
        let n: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        spans.fetch_add(n as u64, Ordering::Relaxed);
        StatusCode::OK
    }
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(spans);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// One run: appends/s, and the host's span counts by outcome.
async fn run_once(scenario: Scenario, mode: Mode, endpoint: &str, seconds: f64) -> (f64, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        telemetry: TelemetryConfig {
            otlp_endpoint: (mode == Mode::Exported).then(|| endpoint.to_string()),
            ..TelemetryConfig::default()
        },
        ..Config::default()
    };
    let host = Host::open(config).expect("open host");
    let metrics = host.metrics().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(host.serve(listener, async {
        let _ = stop_rx.await;
    }));
    let rate = drive(&url, scenario, mode, seconds).await;
    let text = metrics.render();
    let counts: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("streamhost_trace_spans_total{"))
        .map(|l| {
            l.trim_start_matches("streamhost_trace_spans_total")
                .to_string()
        })
        .collect();
    let _ = stop_tx.send(());
    let _ = server.await;
    (rate, counts.join(" "))
}

async fn drive(url: &str, scenario: Scenario, mode: Mode, seconds: f64) -> f64 {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let events = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..scenario.clients {
        let (client, url, events, measuring, stop) = (
            client.clone(),
            url.to_string(),
            events.clone(),
            measuring.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let batch: Vec<_> = (0..scenario.events_per_call)
                .map(|i| json!({"type": "bench.example/appended", "payload": {"client": c, "i": i, "pad": "0123456789abcdef"}}))
                .collect();
            let body = serde_json::to_vec(&json!({ "events": batch })).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let mut request = client
                    .post(format!("{url}/v1/projects/bench/streams/s{c}:append"))
                    .header("content-type", "application/json")
                    .body(body.clone());
                if mode != Mode::Untraced {
                    request = request.header(
                        "traceparent",
                        format!("00-{:016x}{:016x}-{:016x}-01", c + 1, n, n),
                    );
                }
                let r = request.send().await.expect("request");
                assert_eq!(r.status(), 200, "request failed");
                let _ = r.bytes().await;
                if measuring.load(Ordering::Relaxed) {
                    events.fetch_add(scenario.events_per_call as u64, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // warm-up
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    events.load(Ordering::Relaxed) as f64 / elapsed
}

fn main() {
    let seconds = common::arg("--seconds", 2.0);
    let runs = common::arg("--runs", 5.0) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let endpoint = rt.block_on(receiver(received.clone()));
    println!("appends with trace export off and on (durability full, {runs} runs of {seconds} s in turns, medians)");
    println!();
    println!(
        "{:<32} {:<26} {:>12} {:>10}",
        "scenario", "mode", "events/s", "÷ off"
    );
    let modes = [Mode::Untraced, Mode::Carried, Mode::Exported];
    for s in SCENARIOS {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut counts = String::new();
        for run in 0..runs {
            for (i, mode) in modes.iter().enumerate() {
                eprintln!(
                    "running {} / {} ({}/{runs}) ...",
                    s.name,
                    mode.label(),
                    run + 1
                );
                let (rate, c) = rt.block_on(run_once(*s, *mode, &endpoint, seconds));
                rates[i].push(rate);
                if *mode == Mode::Exported {
                    counts = c;
                }
            }
        }
        let medians: Vec<f64> = rates.into_iter().map(median).collect();
        for (i, mode) in modes.iter().enumerate() {
            println!(
                "{:<32} {:<26} {:>12.0} {:>10.3}",
                s.name,
                mode.label(),
                medians[i],
                medians[i] / medians[1]
            );
        }
        println!("{:<32} spans in the last run with export on: {counts}", "");
    }
    println!();
    println!(
        "the receiver decoded {} spans in all",
        received.load(Ordering::Relaxed)
    );
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}
