//! ITX benchmark: `cargo bench -p streamhost --bench itx`.
//!
//! Reports, in one run:
//! - the overhead of a direct ITX call over HTTP (`POST /itx` → guest →
//!   answer) for a trivial function, p50 and p99;
//! - the dynamic JSON ↔ WIT call (the path ITX takes) against a typed
//!   `bindgen!` call of the same function, `echo-everything`, which takes and
//!   returns a record of every WIT type kind; both instantiate a fresh store
//!   per call, as the host does. The ratio is typed time / dynamic time.
//!
//! Needs the guests built (see `scripts/test`).

mod common;
use common::percentile;

use std::time::Instant;

use serde_json::{json, Value};
use streamhost::processor::runtime::Runtime;
use streamhost::{Config, Host};

mod typed {
    wasmtime::component::bindgen!({
        path: "../examples/processors/kinds/wit",
        world: "kinds-world",
    });
}

use typed::exports::example::kinds::kinds::{Color, Everything, Perms, Point, Shape};

const CALLS: usize = 2000;

fn everything_json() -> Value {
    json!({
        "flag": true, "tiny": -8, "small": 8, "short": -16, "ushort": 16, "int": -32, "uint": 32,
        "big": 64, "neg": -64, "ratio": 1.5, "precise": 2.25, "letter": "x", "name": "streamhost",
        "items": [1, 2, 3, 4, 5, 6, 7, 8], "pair": ["p", 7],
        "point": {"x": 1, "y": 2, "labelText": "origin"}, "color": "green", "shape": {"circle": 2.5},
        "maybe": "some", "outcome": {"ok": 3}, "perms": ["read", "exec"]
    })
}

fn everything_typed() -> Everything {
    Everything {
        flag: true,
        tiny: -8,
        small: 8,
        short: -16,
        ushort: 16,
        int: -32,
        uint: 32,
        big: 64,
        neg: -64,
        ratio: 1.5,
        precise: 2.25,
        letter: 'x',
        name: "streamhost".into(),
        items: vec![1, 2, 3, 4, 5, 6, 7, 8],
        pair: ("p".into(), 7),
        point: Point {
            x: 1,
            y: 2,
            label_text: "origin".into(),
        },
        color: Color::Green,
        shape: Shape::Circle(2.5),
        maybe: Some("some".into()),
        outcome: Ok(3),
        perms: Perms::READ | Perms::EXEC,
    }
}

/// What the HTTP client measured (µs): ITX calls, and the floors of the
/// same client and server with no work behind the request.
#[derive(serde::Serialize, serde::Deserialize)]
struct HttpSamples {
    itx: Vec<f64>,
    healthz: Vec<f64>,
    not_found: Vec<f64>,
    /// `POST /itx` with an expression that is refused at once: the request
    /// read and parsed as an ITX call's is, no component involved.
    refused: Vec<f64>,
}

/// Calls `add(1, 2)` over HTTP `CALLS` times, then the floors.
async fn http_client(base: String) -> HttpSamples {
    let url = format!("{base}/v1/projects/bench/itx");
    let client = reqwest::Client::new();
    let body = json!({"expression": ["components", ["get", "kinds"], "add"], "args": [1, 2]});
    let mut itx = Vec::new();
    for i in 0..CALLS + 50 {
        let start = Instant::now();
        let r: Value = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["result"], 3);
        if i >= 50 {
            itx.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    let mut healthz = Vec::new();
    let mut not_found = Vec::new();
    let mut refused = Vec::new();
    let bad = json!({"expression": ["nothing"], "args": [1, 2]});
    for i in 0..CALLS + 50 {
        let start = Instant::now();
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let g = start.elapsed().as_secs_f64() * 1e6;
        let start = Instant::now();
        let r = client
            .post(format!("{base}/nowhere"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        r.bytes().await.unwrap();
        let p = start.elapsed().as_secs_f64() * 1e6;
        let start = Instant::now();
        let r = client.post(&url).json(&bad).send().await.unwrap();
        assert_eq!(r.status(), 400);
        r.bytes().await.unwrap();
        let b = start.elapsed().as_secs_f64() * 1e6;
        if i >= 50 {
            healthz.push(g);
            not_found.push(p);
            refused.push(b);
        }
    }
    HttpSamples {
        itx,
        healthz,
        not_found,
        refused,
    }
}

/// Serves a host with `kinds` deployed and measures it with the HTTP client
/// (in this process, or in a separate one with `--separate-clients`); also
/// the component lookup the ITX path does per call.
async fn http_overhead() -> (HttpSamples, f64) {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    common::deploy(&host, "kinds", common::guest_wasm("kinds")).await;
    let host_storage = host.streams().storage().clone();
    let host_runtime = host.streams().wasm_runtime().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(host.serve(listener, async {
        let _ = stopped.await;
    }));
    let samples = if common::separate_clients() {
        let args = vec!["--url".to_string(), base];
        let line = tokio::task::spawn_blocking(move || common::run_child("http", &args))
            .await
            .unwrap();
        serde_json::from_str(&line).expect("the client's samples")
    } else {
        http_client(base).await
    };
    let mut lookups = Vec::new();
    for _ in 0..500 {
        let start = Instant::now();
        let found = tokio::task::block_in_place(|| {
            streamhost::processor::deployed(&host_storage, &host_runtime, "bench", "kinds")
        });
        assert!(found.unwrap().is_some());
        lookups.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let lookup = percentile(lookups, 0.5);
    println!("component lookup (cached row + prepared cache): p50 {lookup:.1} µs");
    println!(
        "HTTP floors, same client: GET /healthz p50 {:.1} µs, POST of the same JSON to a 404 route p50 {:.1} µs",
        percentile(samples.healthz.clone(), 0.5),
        percentile(samples.not_found.clone(), 0.5)
    );
    println!(
        "POST /itx refused at once (body read and parsed, 400, no component): p50 {:.1} µs",
        percentile(samples.refused.clone(), 0.5)
    );
    let _ = stop.send(());
    (samples, lookup)
}

/// The client process of `--separate-clients`: prints its samples as JSON.
fn child() {
    let base = common::arg_text("--url").expect("--url");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let samples = rt.block_on(async move { tokio::spawn(http_client(base)).await.unwrap() });
    println!("{}", serde_json::to_string(&samples).unwrap());
}

fn main() {
    if common::child_role().is_some() {
        return child();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    eprintln!("ITX over HTTP ...");
    if common::separate_clients() {
        println!("HTTP client: in a separate process (the server's cost alone)");
    }
    // The client runs as a task on the runtime's workers, like the server:
    // a client on the blocking `block_on` thread pays a cross-thread wake-up
    // per request that the server does not cause.
    let (http, lookup) = rt.block_on(async { tokio::spawn(http_overhead()).await.unwrap() });
    let itx_p50 = percentile(http.itx.clone(), 0.5);
    println!(
        "ITX call over HTTP (POST /itx add(1, 2), fresh instance per call): p50 {itx_p50:.1} µs, p99 {:.1} µs",
        percentile(http.itx, 0.99)
    );

    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(cache.path().to_path_buf()).unwrap();
    let bytes = common::guest_wasm("kinds");
    let prepared = runtime
        .prepare(&streamhost::processor::runtime::digest(&bytes), || {
            Ok(bytes.clone())
        })
        .unwrap();
    let mut direct = Vec::new();
    for i in 0..CALLS + 50 {
        let start = Instant::now();
        let out = runtime
            .call_function(
                "kinds",
                &prepared,
                "add",
                &[json!(1), json!(2)],
                20_000,
                Default::default(),
            )
            .unwrap();
        assert_eq!(out, 3);
        if i >= 50 {
            direct.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    let direct_p50 = percentile(direct, 0.5);
    println!(
        "the same add(1, 2) called directly (fresh instance, no HTTP):      p50 {direct_p50:.1} µs"
    );
    let parts = percentile(http.not_found, 0.5) + lookup + direct_p50;
    println!(
        "ITX over HTTP / its parts (404 POST floor + lookup + direct call, {parts:.1} µs): {:.2}  (aim: ≤ 2)",
        itx_p50 / parts
    );
    let read_parts = percentile(http.refused, 0.5) + lookup + direct_p50;
    println!(
        "ITX over HTTP / its parts with the body read (refused POST + lookup + direct call, {read_parts:.1} µs): {:.2}",
        itx_p50 / read_parts
    );
    let args = [everything_json()];
    let expected = everything_typed();
    let mut dynamic = Vec::new();
    let mut typed_calls = Vec::new();
    for i in 0..CALLS + 50 {
        let start = Instant::now();
        let out = runtime
            .call_function(
                "kinds",
                &prepared,
                "echo-everything",
                &args,
                20_000,
                Default::default(),
            )
            .unwrap();
        let d = start.elapsed().as_secs_f64() * 1e6;
        assert_eq!(out, args[0]);
        let start = Instant::now();
        let back = runtime
            .with_instance("kinds", &prepared, 20_000, |store, instance| {
                let world = typed::KindsWorld::new(&mut *store, instance)?;
                world
                    .example_kinds_kinds()
                    .call_echo_everything(&mut *store, &expected)
            })
            .unwrap();
        let t = start.elapsed().as_secs_f64() * 1e6;
        assert_eq!(back.name, expected.name);
        if i >= 50 {
            dynamic.push(d);
            typed_calls.push(t);
        }
    }
    let (d, t) = (percentile(dynamic, 0.5), percentile(typed_calls, 0.5));
    println!("echo-everything, dynamic JSON <-> WIT (the ITX path): p50 {d:.1} µs");
    println!("echo-everything, typed bindgen! call:                p50 {t:.1} µs");
    println!(
        "typed / dynamic: {:.2} (1.0 = the dynamic path costs nothing extra)",
        t / d
    );
}
