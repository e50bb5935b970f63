//! Embedding streamhost: open a host on a data directory and use its streams
//! directly from Rust, without HTTP.
//!
//! Run with `cargo run -p streamhost-example-embed`.

use anyhow::Result;
use serde_json::json;
use streamhost::stream::{AppendInput, Authority, Namespace, ReadQuery, StreamAddress};
use streamhost::{Config, Host};

/// Appends two orders to `/orders/eu` of project `acme` and returns the
/// stream's event count and the types read back.
async fn run(data_dir: &std::path::Path) -> Result<(u64, Vec<String>)> {
    let host = Host::open(Config {
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    })?;
    let orders = StreamAddress::new(Namespace::project("acme")?, "/orders/eu")?;
    let input: AppendInput = serde_json::from_value(json!({"events": [
        {"type": "events.example/order-created", "payload": {"total": 120}, "idempotencyKey": "order-1"},
        {"type": "events.example/order-created", "payload": {"total": 80}, "idempotencyKey": "order-2"},
    ]}))?;
    let appended = host
        .streams
        .append(&orders, input, Authority::Public)
        .await?;
    println!(
        "appended at offsets {:?}",
        appended.events.iter().map(|e| e.offset).collect::<Vec<_>>()
    );

    let page = host
        .streams
        .read(
            &orders,
            ReadQuery {
                after_offset: 0,
                limit: 100,
                include_ephemeral: false,
            },
        )
        .await?;
    let types = page
        .events
        .iter()
        .map(|raw| -> Result<String> {
            let v: serde_json::Value = serde_json::from_str(raw.get())?;
            Ok(v["type"].as_str().unwrap_or_default().to_string())
        })
        .collect::<Result<Vec<_>>>()?;
    let state = host.streams.state(&orders).await?;
    println!("state: {}", serde_json::to_string_pretty(&state)?);
    Ok((state.event_count, types))
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    run(dir.path()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn the_example_appends_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let (count, types) = super::run(dir.path()).await.unwrap();
        assert_eq!(count, 3);
        assert_eq!(
            types,
            [
                "events.iterate.com/stream/created",
                "events.example/order-created",
                "events.example/order-created"
            ]
        );
    }
}
