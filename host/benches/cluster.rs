//! Durable append throughput on PostgreSQL with 1, 2 and 3 hosts, beside
//! the same binary on SQLite, in one run: real server processes (the
//! release binary) on loopback, 64 clients each appending to its own
//! stream, spread over the hosts, in three loads: single events, single
//! events each with an idempotency key, and batches of 100 events; with
//! several hosts, also single events sent through a host that does not own
//! the stream (forwarded). Also where the CPU went: the hosts' and
//! PostgreSQL's CPU seconds per 1,000 events (from /proc).
//!
//! Needs a PostgreSQL to create databases on:
//!
//! ```sh
//! scripts/postgres start /tmp/bench-pg 55432
//! STREAMHOST_BENCH_POSTGRES=postgres://postgres@127.0.0.1:55432/postgres \
//!   cargo bench -p streamhost --bench cluster
//! ```
//!
//! Each row is the median of `--runs` measurements, taken in turns with the
//! other single-event rows of the same hosts (single, keyed, forwarded,
//! single, …), since a row measured later meets a larger database; the
//! batches run after them (a batch row leaves work, such as a WAL
//! checkpoint or a vacuum, to whatever runs next).
//!
//! Options: `--seconds S` per measurement (3), `--runs N` (3), `--clients N`
//! (64).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

struct Host {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(postgres: Option<&str>) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_streamhost"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(url) = postgres {
        cmd.arg("--postgres").arg(url);
    }
    let mut child = cmd.spawn().expect("starting streamhost");
    let stdout = child.stdout.take().unwrap();
    let mut url = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(u) = line.strip_prefix("streamhost listening on ") {
            url = u.to_string();
            break;
        }
    }
    assert!(!url.is_empty(), "the server did not start");
    Host {
        child,
        url,
        _dir: dir,
    }
}

/// The sum of fields `fields` (0 = the field after the command name) of
/// `/proc/<pid>/stat`, clock ticks as seconds.
fn stat_seconds(pid: u32, fields: [usize; 2]) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let values: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields
        .iter()
        .filter_map(|i| values.get(*i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// CPU seconds (user + system) of process `pid` and its threads so far.
fn cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, [11, 12])
}

/// CPU seconds of every process named `postgres` so far, with those of
/// the backends that ended (their parent's reaped children's time: a
/// backend that exits mid-measurement must not take its CPU with it).
fn postgres_cpu_seconds() -> f64 {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(|pid| cpu_seconds(pid) + reaped_cpu_seconds(pid))
        .sum()
}

/// CPU seconds of the children process `pid` waited for.
fn reaped_cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, [13, 14])
}

fn admin(base: &str, sql: &str) {
    let mut c = postgres::Client::connect(base, postgres::NoTls).expect("PostgreSQL");
    c.batch_execute(sql).expect(sql);
}

#[derive(Clone, Copy)]
struct Measured {
    rate: f64,
    host_cpu_per_k: f64,
    pg_cpu_per_k: f64,
}

/// What each client sends.
#[derive(Clone, Copy, PartialEq)]
enum Load {
    Single,
    Keyed,
    Batch,
}

impl Load {
    const ALL: [Load; 3] = [Load::Single, Load::Keyed, Load::Batch];

    fn name(self) -> &'static str {
        match self {
            Load::Single => "single events",
            Load::Keyed => "single events with keys",
            Load::Batch => "batches of 100",
        }
    }

    /// The body of client `client`'s `n`th call.
    fn body(self, client: usize, n: u64) -> serde_json::Value {
        match self {
            Load::Single => {
                serde_json::json!({"events": [{"type": "bench.x/e", "payload": {"n": client}}]})
            }
            Load::Keyed => {
                serde_json::json!({"events": [{"type": "bench.x/e", "payload": {"n": client},
                "idempotencyKey": format!("c{client}-{n}")}]})
            }
            Load::Batch => serde_json::json!({"events": (0..100)
                .map(|_| serde_json::json!({"type": "bench.x/e", "payload": {"n": client}}))
                .collect::<Vec<_>>()}),
        }
    }

    fn events(self) -> u64 {
        match self {
            Load::Batch => 100,
            _ => 1,
        }
    }
}

/// `clients` appenders for `seconds`: client i appends to its stream
/// `/s{i}` (created through host `i % hosts`, its owner) through host
/// `(i + through) % hosts` (`through` 0: the owner; 1: the next host, which
/// forwards).
fn measure(
    rt: &tokio::runtime::Runtime,
    hosts: &[Host],
    clients: usize,
    seconds: f64,
    through: usize,
    load: Load,
) -> Measured {
    let client = reqwest::Client::new();
    let urls: Vec<String> = hosts.iter().map(|h| h.url.clone()).collect();
    // Create every stream through its host first (untimed).
    rt.block_on(async {
        for i in 0..clients {
            let url = format!(
                "{}/v1/projects/bench/streams/s{i}:append",
                urls[i % urls.len()]
            );
            let r = client
                .post(&url)
                .json(&serde_json::json!({"events": [{"type": "bench.x/e", "payload": {}}]}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
    });
    let pids: Vec<u32> = hosts.iter().map(|h| h.child.id()).collect();
    let host_cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    let (h0, p0) = (host_cpu(&pids), postgres_cpu_seconds());
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    rt.block_on(async {
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let client = client.clone();
                let url = format!(
                    "{}/v1/projects/bench/streams/s{i}:append",
                    urls[(i + through) % urls.len()]
                );
                let done = done.clone();
                tokio::spawn(async move {
                    let mut n = 0;
                    while Instant::now() < until {
                        let body = serde_json::to_vec(&load.body(i, n)).unwrap();
                        n += 1;
                        let r = client
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body)
                            .send()
                            .await
                            .unwrap();
                        assert!(r.status().is_success(), "{}", r.status());
                        done.fetch_add(load.events(), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let events = done.load(Ordering::Relaxed) as f64;
    let k = events / 1000.0;
    Measured {
        rate: events / elapsed,
        host_cpu_per_k: (host_cpu(&pids) - h0) / k,
        pg_cpu_per_k: (postgres_cpu_seconds() - p0) / k,
    }
}

/// Every load of `loads` measured `runs` times in turns; the median run of
/// each (by rate).
fn medians(
    rt: &tokio::runtime::Runtime,
    hosts: &[Host],
    clients: usize,
    seconds: f64,
    runs: usize,
    loads: &[(Load, usize)],
) -> Vec<Measured> {
    let mut all: Vec<Vec<Measured>> = loads.iter().map(|_| Vec::new()).collect();
    for _ in 0..runs.max(1) {
        for (i, (load, through)) in loads.iter().enumerate() {
            all[i].push(measure(rt, hosts, clients, seconds, *through, *load));
        }
    }
    all.into_iter()
        .map(|mut runs| {
            runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
            runs[runs.len() / 2]
        })
        .collect()
}

fn row(name: &str, m: &Measured, pg: bool, against: Option<f64>) {
    let pg_cpu = if pg {
        format!("{:.3}", m.pg_cpu_per_k)
    } else {
        "-".to_string()
    };
    let ratio = against.map_or(String::new(), |base| {
        format!("   (÷ SQLite {:.2})", m.rate / base)
    });
    println!(
        "{name:<44} {:>10.0} {:>16.3} {:>18}{ratio}",
        m.rate, m.host_cpu_per_k, pg_cpu
    );
}

fn main() {
    let seconds = common::arg("--seconds", 3.0);
    let runs = common::arg("--runs", 3.0) as usize;
    let clients = common::arg("--clients", 64.0) as usize;
    let Ok(base) = std::env::var("STREAMHOST_BENCH_POSTGRES") else {
        println!("cluster: set STREAMHOST_BENCH_POSTGRES to a PostgreSQL URL (see the file's header); skipped");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "durable appends: {clients} clients, a stream each; medians of {runs} runs of {seconds} s, in turns"
    );
    println!(
        "{:<44} {:>10} {:>16} {:>18}",
        "storage, load", "events/s", "host CPU s/1k", "postgres CPU s/1k"
    );
    let all: Vec<(Load, usize)> = Load::ALL.iter().map(|l| (*l, 0)).collect();
    let sqlite: Vec<Measured> = {
        let host = start(None);
        let one = std::slice::from_ref(&host);
        let mut m = medians(&rt, one, clients, seconds, runs, &all[..2]);
        m.extend(medians(&rt, one, clients, seconds, runs, &all[2..]));
        for (load, m) in Load::ALL.iter().zip(&m) {
            row(&format!("SQLite, 1 host, {}", load.name()), m, false, None);
        }
        m
    };
    println!("  keys ÷ no keys: {:.2}", sqlite[1].rate / sqlite[0].rate);
    let (prefix, _) = base.rsplit_once('/').expect("a database in the URL");
    for n in 1..=3 {
        let name = format!("streamhost_bench_{}_{n}", std::process::id());
        admin(&base, &format!("DROP DATABASE IF EXISTS {name}"));
        admin(&base, &format!("CREATE DATABASE {name}"));
        let url = format!("{prefix}/{name}");
        let hosts: Vec<Host> = (0..n).map(|_| start(Some(&url))).collect();
        let mut singles = all[..2].to_vec();
        if n > 1 {
            singles.push((Load::Single, 1));
        }
        let mut m = medians(&rt, &hosts, clients, seconds, runs, &singles);
        let forwarded = m.get(2).copied();
        m.truncate(2);
        m.extend(medians(&rt, &hosts, clients, seconds, runs, &all[2..]));
        for ((load, _), (m, base_rate)) in all.iter().zip(m.iter().zip(&sqlite)) {
            row(
                &format!("PostgreSQL, {n} host(s), {}", load.name()),
                m,
                true,
                Some(base_rate.rate),
            );
        }
        println!("  keys ÷ no keys: {:.2}", m[1].rate / m[0].rate);
        if let Some(f) = forwarded {
            row(
                "  through a non-owner (forwarded), single",
                &f,
                true,
                Some(sqlite[0].rate),
            );
            println!("  forwarded ÷ direct: {:.2}", f.rate / m[0].rate);
        }
        drop(hosts);
        admin(
            &base,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        );
    }
}
