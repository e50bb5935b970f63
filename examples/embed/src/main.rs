//! Embedding streamhost: open a host on a data directory and use its streams
//! directly from Rust, without HTTP.
//!
//! Run with `cargo run -p streamhost-example-embed`.

use anyhow::Result;
use serde_json::json;
use streamhost::{Config, EventInput, Host, Subscription};

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

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    run(dir.path()).await?;
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
}
