//! Embedding streamhost: open a host on a data directory and use its streams
//! and processors directly from Rust, without HTTP.
//!
//! Run with `cargo run -p streamhost-example-embed`. The processor part
//! needs the example guests built first:
//! `cargo build --release --target wasm32-wasip2 --manifest-path examples/processors/Cargo.toml`.

mod mount;

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use streamhost::{Config, Deploy, EffectFilter, EventInput, Host, Subscription};

/// Appends two orders to `/orders/eu` of project `acme`, copies the big ones
/// to `/orders/big`, and returns the stream's event count, the types read
/// back and the first big order's total.
async fn run(data_dir: &std::path::Path) -> Result<(u64, Vec<String>, i64)> {
    let host = Host::open(Config {
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    })?;
    let orders = host.stream("acme", "/orders/eu")?;
    let big = host.stream("acme", "/orders/big")?;

    // Subscriptions are events on their source: this one copies orders over
    // 100 to /orders/big, from the beginning of the log.
    host.subscribe(
        &orders,
        &Subscription::copy_to("big-orders", "/orders/big")
            .event_types(["events.example/order-created"])
            .condition("payload.total > 100")
            .from_beginning(),
    )
    .await?;

    let appended = host
        .append(
            &orders,
            [
                EventInput::new("events.example/order-created")
                    .payload(json!({"total": 120}))
                    .idempotency_key("order-1"),
                EventInput::new("events.example/order-created")
                    .payload(json!({"total": 80}))
                    .idempotency_key("order-2"),
            ],
        )
        .await?;
    println!(
        "appended at offsets {:?}",
        appended.events.iter().map(|e| e.offset).collect::<Vec<_>>()
    );

    let types = host
        .events(&orders, 0, 100)
        .await?
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    let state = host.state(&orders).await?;
    println!("state: {}", serde_json::to_string_pretty(&state)?);

    // The copy arrives shortly after the commit (delivery never runs inside
    // an append): wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let total = loop {
        let copies = match host.events(&big, 1, 10).await {
            Ok(events) => events,
            Err(e) if e.code == "stream-not-found" => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        if let Some(copy) = copies.first() {
            break copy.payload["total"].as_i64().unwrap_or_default();
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the copy did not arrive"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    println!("copied to /orders/big: an order of {total}");
    Ok((state.event_count, types, total))
}

/// Deploys the counter, kinds and effector processors from `guests` (their
/// built `.wasm` files), folds a stream with the counter, calls an ITX
/// function and runs an effect; returns the counter's state, the ITX
/// result and the effect's status.
async fn run_processors(
    data_dir: &Path,
    guests: &Path,
) -> Result<(serde_json::Value, serde_json::Value, String)> {
    let host = Host::open(Config {
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    })?;
    for name in ["counter", "kinds", "effector"] {
        let bytes = std::fs::read(guests.join(format!("{name}.wasm")))?;
        let deployed = host.deploy(Deploy::new("acme", name, bytes)).await?;
        println!("deployed {name} at {}", deployed.digest);
    }

    // A processor folds its stream once a wake subscription names it.
    let clicks = host.stream("acme", "/clicks")?;
    host.subscribe(
        &clicks,
        &Subscription::wake("counter", "counter").from_beginning(),
    )
    .await?;
    host.append(
        &clicks,
        [
            EventInput::new("events.example/clicked").payload(json!({"n": 1})),
            EventInput::new("events.example/clicked").payload(json!({"n": 2})),
        ],
    )
    .await?;
    let head = host.state(&clicks).await?.max_offset;
    let counter = host
        .wait_for_processor(&clicks, "counter", head, std::time::Duration::from_secs(10))
        .await?;
    let state = counter.state.context("the counter has folded a state")?;
    println!("counter state: {state}");

    // Any exported function of a deployed component can be called.
    let sum = host
        .call("acme", "kinds", "add", &[json!(2), json!(3)])
        .await?;
    println!("kinds.add(2, 3) = {sum}");

    // A processor's effects are committed with its checkpoint, then run.
    let jobs = host.stream("acme", "/jobs")?;
    host.subscribe(
        &jobs,
        &Subscription::wake("effector", "effector").from_beginning(),
    )
    .await?;
    host.append(
        &jobs,
        [
            EventInput::new("events.example/effects-requested").payload(json!({"effects": [
                {"key": "hello", "append": {"streamPath": "/greetings", "type": "greeted", "payload": {}}}
            ]})),
        ],
    )
    .await?;
    let status = wait("the effect to run", async || {
        let page = host
            .effects("acme", EffectFilter::new().stream("/jobs"))
            .await
            .ok()?;
        let effect = page.effects.into_iter().next()?;
        (effect.status == streamhost::EffectStatus::Succeeded).then_some(effect.status)
    })
    .await?;
    println!("effect \"hello\": {}", status.as_str());
    Ok((state, sum, status.as_str().to_string()))
}

/// Polls `check` until it answers, for at most ten seconds.
async fn wait<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> Result<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Where `cargo build --release --target wasm32-wasip2` puts the example
/// guests (`$STREAMHOST_EXAMPLE_GUESTS` names another directory).
fn guests_dir() -> std::path::PathBuf {
    match std::env::var_os("STREAMHOST_EXAMPLE_GUESTS") {
        Some(dir) => dir.into(),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../processors/target/wasm32-wasip2/release")
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("mount") {
        let host = Host::open(Config {
            data_dir: "streamhost-data".into(),
            ..Config::default()
        })?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
        println!("serving on http://127.0.0.1:8080 (streamhost under /streamhost)");
        return mount::serve(host, listener).await;
    }
    let dir = tempfile::tempdir()?;
    run(dir.path()).await?;
    if guests_dir().join("counter.wasm").exists() {
        let dir = tempfile::tempdir()?;
        run_processors(dir.path(), &guests_dir()).await?;
    } else {
        println!(
            "build the example guests to run the processor part: cargo build --release \
             --target wasm32-wasip2 --manifest-path examples/processors/Cargo.toml"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn the_example_appends_subscribes_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let (count, types, total) = super::run(dir.path()).await.unwrap();
        assert_eq!(count, 4);
        assert_eq!(
            types,
            [
                "events.iterate.com/stream/created",
                "events.iterate.com/stream/subscription-configured",
                "events.example/order-created",
                "events.example/order-created"
            ]
        );
        assert_eq!(total, 120, "only the order over 100 is copied");
    }

    /// The API mounted under a prefix answers there, beside the
    /// application's own routes; the console's assets load under it.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_api_mounted_under_a_prefix_serves_there() {
        let dir = tempfile::tempdir().unwrap();
        let host = streamhost::Host::open(streamhost::Config {
            data_dir: dir.path().to_path_buf(),
            ..streamhost::Config::default()
        })
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(super::mount::serve(host.clone(), listener));
        let client = reqwest::Client::new();
        let own = client.get(format!("{url}/")).send().await.unwrap();
        assert!(own.text().await.unwrap().starts_with("my application"));
        let stream = format!("{url}/streamhost/v1/projects/acme/streams/orders");
        let appended = client
            .post(format!("{stream}:append"))
            .header("content-type", "application/json")
            .body(r#"{"events": [{"type": "events.example/order-created"}]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(appended.status(), 200, "{}", appended.text().await.unwrap());
        // Written through HTTP, read through the library: one host.
        let orders = host.stream("acme", "/orders").unwrap();
        assert_eq!(host.state(&orders).await.unwrap().max_offset, 2);
        let state: serde_json::Value = client
            .get(format!("{stream}:state"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(state["maxOffset"], 2, "{state}");
        // The console's page names its assets under the prefix.
        let page = client
            .get(format!("{url}/streamhost/console"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            page.contains(r#"src="/streamhost/console/console.js""#),
            "{page}"
        );
        let script = client
            .get(format!("{url}/streamhost/console/console.js"))
            .send()
            .await
            .unwrap();
        assert_eq!(script.status(), 200);
        let missing = client
            .get(format!("{url}/streamhost/v1/nothing"))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), 404);
    }

    /// The guests are built by the test command before the tests run.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_example_deploys_folds_calls_and_runs_an_effect() {
        let dir = tempfile::tempdir().unwrap();
        let (state, sum, status) = super::run_processors(dir.path(), &super::guests_dir())
            .await
            .unwrap();
        assert_eq!(state["sum"], 3, "{state}");
        // The counter counts the platform's events too: the stream's
        // creation and the subscription.
        assert_eq!(state["events"], 4, "{state}");
        assert_eq!(sum, serde_json::json!(5));
        assert_eq!(status, "succeeded");
    }
}
