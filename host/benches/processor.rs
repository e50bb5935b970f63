//! Processor benchmark: `cargo bench -p streamhost --bench processor`.
//!
//! Reports, in one run:
//! - wake latency: load the checkpoint and component, instantiate, fold one
//!   event, commit checkpoint + state (p50, p99), with `durability = normal`
//!   (no fsync) and `full`, and the disk's raw fsync rate measured alone;
//! - instantiate + one fold call alone (p50);
//! - the floor: a plain wasmtime program (no streamhost code) that
//!   instantiates the `minimal` guest (the WIT world implemented without the
//!   SDK, a naive fold) from an `InstancePre` with the same engine settings
//!   and calls `fold` with one event, no storage; the wake's p50 is printed
//!   as a ratio of it;
//! - fold throughput of the Wasm counter in batches of 1000 events against
//!   the same fold (the SDK's `fold` around the counter's, the very code the
//!   guest runs) compiled natively and handed the batch the guest receives,
//!   as a ratio.
//!
//! Needs the guests built: `cargo build --release --target wasm32-wasip2
//! --manifest-path examples/processors/Cargo.toml` (scripts/test does it).

mod common;
use common::{fsync_rate, percentile};

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};
use streamhost::config::Durability;
use streamhost::processor::runtime::{Batch, Determinism, Runtime, StreamInfo};
use streamhost::processor::wake::batch_events;
use streamhost::processor::wake::wake;
use streamhost::storage::WriteOp;
use streamhost::{Config, Host};

const ITERATIONS: usize = 400;

/// The floor: plain wasmtime, the `minimal` guest, its own bindings.
mod floor {
    use std::time::Instant;

    use wasmtime::component::{Component, Linker, ResourceTable};
    use wasmtime::{Engine, Store};
    use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

    // The minimal guest is built against 0.2.0 (the host runs both).
    wasmtime::component::bindgen!({
        path: "../wasm/wit/0.2.0",
        world: "stream-processor",
    });
    use exports::streamhost::processor::processor::{Batch, StreamInfo};

    struct Data {
        wasi: WasiCtx,
        table: ResourceTable,
    }

    impl WasiView for Data {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            WasiCtxView {
                ctx: &mut self.wasi,
                table: &mut self.table,
            }
        }
    }

    /// Microseconds per instantiate + `fold` of one event, `n` samples.
    pub fn samples(bytes: &[u8], n: usize) -> Vec<f64> {
        let engine = Engine::new(&streamhost::processor::runtime::engine_config()).unwrap();
        let component = Component::new(&engine, bytes).unwrap();
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).unwrap();
        let pre = StreamProcessorPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
        let batch = Batch {
            stream: StreamInfo {
                project_id: Some("bench".into()),
                path: "/p".into(),
                stream_id: "sid".into(),
                stream_created_at: "2026-11-30T00:00:00.000Z".into(),
                max_offset: 1,
            },
            events: r#"[{"offset":1,"type":"x.y/n","payload":{"n":1},"createdAt":"2026-11-30T00:00:00.000Z"}]"#.into(),
            scanned_through_offset: 1,
        };
        let state = "41".to_string();
        let mut out = Vec::with_capacity(n);
        for i in 0..n + 20 {
            let start = Instant::now();
            let mut store = Store::new(
                &engine,
                Data {
                    wasi: WasiCtx::builder().build(),
                    table: ResourceTable::new(),
                },
            );
            store.set_epoch_deadline(1_000);
            let instance = pre.instantiate(&mut store).unwrap();
            let folded = instance
                .streamhost_processor_processor()
                .call_fold(&mut store, &state, &batch)
                .unwrap()
                .unwrap();
            assert_eq!(folded.state, "42");
            if i >= 20 {
                out.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        out
    }
}

fn stream_info() -> StreamInfo {
    StreamInfo {
        project_id: Some("bench".into()),
        path: "/p".into(),
        stream_id: "sid".into(),
        stream_created_at: "2026-11-30T00:00:00.000Z".into(),
        max_offset: 0,
    }
}

/// Latencies (µs) of `ITERATIONS` single-event wakes: the whole, the wake
/// itself (reads, instantiate, fold) and the commit, both on this thread
/// as a blocking section, as the server runs them.
#[derive(Default)]
struct WakeSamples {
    total: Vec<f64>,
    wake: Vec<f64>,
    commit: Vec<f64>,
}

async fn wake_latency(durability: Durability) -> WakeSamples {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        durability,
        ..Config::default()
    })
    .unwrap();
    common::deploy(&host, "counter", common::guest_wasm("counter")).await;
    let storage = host.streams().storage().clone();
    let mut samples = WakeSamples::default();
    for i in 0..ITERATIONS + 20 {
        let job = common::next_wake(&host, "counter", i).await;
        let start = Instant::now();
        // As the server runs it: the wake and its commit on one blocking
        // section (`commit_blocking` commits right there when the writer
        // is idle).
        let folded = tokio::task::block_in_place(|| {
            let woken = wake(job).expect("wake");
            let folded = start.elapsed();
            storage
                .commit_blocking(WriteOp::Checkpoint(woken.checkpoint))
                .unwrap();
            folded
        });
        if i >= 20 {
            let total = start.elapsed();
            samples.total.push(total.as_secs_f64() * 1e6);
            samples.wake.push(folded.as_secs_f64() * 1e6);
            samples.commit.push((total - folded).as_secs_f64() * 1e6);
        }
    }
    samples
}

/// `n` committed events as the host holds them.
fn events(n: usize) -> Vec<streamhost::stream::Event> {
    (0..n)
        .map(|i| {
            serde_json::from_value(json!({
                "offset": i as u64 + 2,
                "type": "x.y/n",
                "payload": {"n": i, "region": "eu"},
                "createdAt": "2026-11-30T00:00:00.000Z",
            }))
            .unwrap()
        })
        .collect()
}

/// The batch as the SDK's own bindings type it (what the guest receives).
fn guest_batch(events: &[streamhost::stream::Event]) -> GuestBatch {
    use streamhost_guest::bindings::exports::streamhost::processor::processor as g;
    GuestBatch {
        stream: g::StreamInfo {
            project_id: Some("bench".into()),
            path: "/p".into(),
            stream_id: "sid".into(),
            stream_created_at: "2026-11-30T00:00:00.000Z".into(),
            max_offset: 0,
        },
        events: batch_events(events),
        scanned_through_offset: events.last().map_or(0, |e| e.offset),
    }
}

type GuestBatch = streamhost_guest::bindings::exports::streamhost::processor::processor::Batch;

/// The native fold: the very code the guest runs (the SDK's `fold` around
/// the counter's), compiled natively and given the batch it would receive.
fn native_fold(state: &str, batch: GuestBatch) -> String {
    match streamhost_guest::__fold::<counter::Counter>(state.to_string(), batch) {
        Ok(folded) => folded.state,
        Err(f) => panic!("the native fold failed: {}", f.message),
    }
}

fn main() {
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
    let floor = percentile(
        floor::samples(&common::guest_wasm("minimal"), ITERATIONS),
        0.5,
    );
    println!(
        "floor: plain wasmtime, minimal guest, instantiate + fold 1 event: p50 {floor:>7.1} µs"
    );
    for (label, durability) in [
        ("normal (no fsync)", Durability::Normal),
        ("full (fsync)", Durability::Full),
    ] {
        eprintln!("wake latency, {label} ...");
        let s = rt.block_on(wake_latency(durability));
        let p50 = percentile(s.total.clone(), 0.5);
        println!(
            "wake (load + instantiate + fold 1 event + commit), {label:<18}: p50 {p50:>7.1} µs, p99 {:>7.1} µs, p50 / floor {:>5.1}  (aim: ≤ 3 without fsync)",
            percentile(s.total, 0.99),
            p50 / floor
        );
        println!(
            "  of which: reads + instantiate + fold p50 {:>7.1} µs, commit p50 {:>7.1} µs",
            percentile(s.wake, 0.5),
            percentile(s.commit, 0.5)
        );
    }

    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(cache.path().to_path_buf()).unwrap();
    let bytes = common::guest_wasm("counter");
    let digest = streamhost::processor::runtime::digest(&bytes);
    let prepared = runtime.prepare(&digest, || Ok(bytes.clone())).unwrap();
    let initial = runtime.initial_state("counter", &prepared, 20_000).unwrap();
    let one = Batch {
        stream: stream_info(),
        events: batch_events(&events(1)),
        scanned_through_offset: 2,
    };
    let mut call = Vec::new();
    for _ in 0..ITERATIONS {
        let start = Instant::now();
        runtime
            .fold(
                "counter",
                &prepared,
                &initial,
                &one,
                Determinism::default(),
                20_000,
                streamhost::processor::keyed::Bucket::empty().session(),
                None,
            )
            .0
            .unwrap();
        call.push(start.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "instantiate + fold 1 event (no storage):                  p50 {:>7.1} µs",
        percentile(call, 0.5)
    );
    println!();

    let stored = events(1000);
    let batch = Batch {
        stream: stream_info(),
        events: batch_events(&stored),
        scanned_through_offset: 1001,
    };
    let mut wasm = Vec::new();
    let mut native = Vec::new();
    let mut wasm_state = String::new();
    let mut native_state = String::new();
    for _ in 0..30 {
        let start = Instant::now();
        wasm_state = runtime
            .fold(
                "counter",
                &prepared,
                &initial,
                &batch,
                Determinism::default(),
                20_000,
                streamhost::processor::keyed::Bucket::empty().session(),
                None,
            )
            .0
            .unwrap()
            .state;
        wasm.push(1000.0 / start.elapsed().as_secs_f64());
        let input = guest_batch(&stored);
        let start = Instant::now();
        native_state = native_fold(&initial, input);
        native.push(1000.0 / start.elapsed().as_secs_f64());
    }
    assert_eq!(
        serde_json::from_str::<Value>(&wasm_state).unwrap(),
        serde_json::from_str::<Value>(&native_state).unwrap(),
        "the Wasm and native folds agree"
    );
    // The same batch through a guest that does no per-event work (the
    // hostile guest counts events by type only): the cost of the call and of
    // copying 1000 events into the guest.
    let hostile_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/processors/target/wasm32-wasip2/release/hostile.wasm");
    let hostile_bytes = std::fs::read(hostile_path).unwrap();
    let hostile = runtime
        .prepare(
            &streamhost::processor::runtime::digest(&hostile_bytes),
            || Ok(hostile_bytes.clone()),
        )
        .unwrap();
    let mut transfer = Vec::new();
    for _ in 0..30 {
        let start = Instant::now();
        runtime
            .fold(
                "hostile",
                &hostile,
                "{\"events\":0}",
                &batch,
                Determinism::default(),
                20_000,
                streamhost::processor::keyed::Bucket::empty().session(),
                None,
            )
            .0
            .unwrap();
        transfer.push(1000.0 / start.elapsed().as_secs_f64());
    }
    let (w, n) = (percentile(wasm, 0.5), percentile(native, 0.5));
    println!("fold throughput, batches of 1000 events (median of 30):");
    println!(
        "  wasm counter  {w:>12.0} events/s  (includes instantiation and copying the batch in)"
    );
    println!("  native        {n:>12.0} events/s");
    println!("  wasm / native {:>12.2}  (aim: ≥ 0.50)", w / n);
    println!(
        "  call + copying 1000 events in, the guest reading only their types (hostile): {:>10.0} events/s",
        percentile(transfer, 0.5)
    );
}
