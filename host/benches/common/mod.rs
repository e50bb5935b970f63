//! What several benchmarks share: options, the disk's raw fsync rate,
//! percentiles, the example guests and deploying them. (A directory, so cargo does not take it for a benchmark.)

#![allow(dead_code)]

/// The allocator the `streamhost` binary runs with (it counts allocations
/// for the JSONata budget): an in-process host is measured as served.
#[global_allocator]
static ALLOCATOR: streamhost::CountingAllocator = streamhost::CountingAllocator;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// The number after option `name` on the command line, or `default`.
pub fn arg(name: &str, default: f64) -> f64 {
    arg_text(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// 4 KiB writes + fdatasync per second in `dir`, measured for one second.
pub fn fsync_rate(dir: &Path) -> f64 {
    let mut f = std::fs::File::create(dir.join("fsync-probe")).unwrap();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(1) {
        f.write_all(&[1u8; 4096]).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// The `q` quantile (0..=1) of `v` (any unit), through an HDR histogram
/// (`hdrhistogram`, 3 significant digits); NaN for no samples.
pub fn percentile(v: Vec<f64>, q: f64) -> f64 {
    // Values are recorded in millionths of their unit: microseconds for
    // seconds, nanoseconds for milliseconds.
    const SCALE: f64 = 1e6;
    if v.is_empty() {
        return f64::NAN;
    }
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("a histogram");
    for x in v {
        h.record((x * SCALE).round().max(0.0) as u64)
            .expect("an auto-resizing histogram records any value");
    }
    h.value_at_quantile(q) as f64 / SCALE
}

/// The bytes of guest `file` (`counter`, `kinds`, `effector`) from
/// `examples/processors`, built for wasm32-wasip2.
pub fn guest_wasm(file: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../examples/processors/target/wasm32-wasip2/release/{file}.wasm"
    ));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the guests first: cargo build --release --target wasm32-wasip2 \
             --manifest-path examples/processors/Cargo.toml",
            path.display()
        )
    })
}

/// Deploys `bytes` as component `name` of project `bench`.
pub async fn deploy(host: &streamhost::Host, name: &str, bytes: Vec<u8>) {
    use streamhost::storage::{Deployment, WriteOp};
    host.streams()
        .storage()
        .submit(WriteOp::Deploy(Deployment {
            project: "bench".into(),
            name: name.into(),
            digest: streamhost::processor::runtime::digest(&bytes),
            exports: vec![],
            bytes,
            deployed_at: "2026-11-30T00:00:00.000Z".into(),
            mode: Default::default(),
            versions_kept: streamhost::storage::VERSIONS_KEPT_DEFAULT,
        }))
        .await
        .unwrap()
        .unwrap();
}

/// The text after option `name` on the command line.
pub fn arg_text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Whether the benchmark runs its clients in a separate process
/// (`--separate-clients`), so the server's cost is measured alone: the
/// parent runs the host, the child (this binary again, `--child ROLE`)
/// drives it over loopback and prints what it measured.
pub fn separate_clients() -> bool {
    std::env::args().any(|a| a == "--separate-clients")
}

/// The role of this process when it was started as a benchmark's client.
pub fn child_role() -> Option<String> {
    arg_text("--child")
}

/// Runs this benchmark binary again as a client process (`--child ROLE`
/// and `args`) and returns the last line it printed (its result, JSON).
/// Blocking: call it from `spawn_blocking` while the server runs.
pub fn run_child(role: &str, args: &[String]) -> String {
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let out = std::process::Command::new(exe)
        .arg("--child")
        .arg(role)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("starting the client process");
    assert!(
        out.status.success(),
        "the client process ({role}) failed: {}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// A fresh database `name` on the PostgreSQL server of `base` (dropped
/// first); answers its URL. Call it off any async runtime's threads (the
/// blocking client runs a runtime of its own).
pub fn fresh_postgres(base: &str, name: &str) -> String {
    let mut c = postgres::Client::connect(base, postgres::NoTls).expect("PostgreSQL");
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    format!("{server}/{name}")
}

/// Appends event number `i` to project `bench`'s `/p` and answers the wake
/// of processor `component` that folds it, as the server would run it.
pub async fn next_wake(
    host: &streamhost::Host,
    component: &str,
    i: usize,
) -> streamhost::processor::wake::WakeJob {
    use streamhost::stream::{AppendInput, Authority, Namespace, StreamAddress};
    let address = StreamAddress::new(Namespace::project("bench").unwrap(), "/p").unwrap();
    let input: AppendInput = serde_json::from_value(
        serde_json::json!({"events": [{"type": "x.y/n", "payload": {"n": i}}]}),
    )
    .unwrap();
    let out = host
        .streams()
        .append(&address, input, Authority::Public)
        .await
        .unwrap();
    let head = out.events[0].offset;
    let storage = host.streams().storage().clone();
    let row = storage.load_stream("bench", "/p").unwrap().unwrap();
    streamhost::processor::wake::WakeJob {
        storage,
        runtime: host.streams().wasm_runtime().clone(),
        row_id: row.row_id,
        project: "bench".into(),
        component: component.into(),
        stream: streamhost::processor::runtime::StreamInfo {
            project_id: Some("bench".into()),
            path: "/p".into(),
            stream_id: out.stream_id.clone(),
            stream_created_at: "2026-11-30T00:00:00.000Z".into(),
            max_offset: head,
        },
        head,
        limit: 1000,
        filter: Default::default(),
        timeout_ms: 20_000,
        now_ms: 0,
        pinned: false,
        fence: None,
        gate: Default::default(),
        seen: Default::default(),
    }
}

/// A fresh host on a temporary data dir, served on a loopback port until
/// [`Served::stop`].
pub struct Served {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// Opens a host with the default configuration and serves it (inside a
/// Tokio runtime).
pub async fn serve_fresh_host() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let host = streamhost::Host::open(streamhost::Config {
        data_dir: dir.path().to_path_buf(),
        ..streamhost::Config::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let _ = host
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    Served {
        base,
        stop,
        server,
        _dir: dir,
    }
}

impl Served {
    /// Stops serving (waiting at most 5 s for the server to end).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server).await;
    }
}
