//! Copies keep flowing, exactly once and in order, while the server is
//! SIGKILLed and restarted.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{json, Value};

use crate::subscriptions::{data, subscribe, FAST, P};
use crate::support::{wait_for, Server};

const EVENTS: usize = 600;
const KILLS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_matching_event_is_copied_exactly_once_in_order_across_sigkills() {
    let mut server = Server::start_with(Some(FAST), &[]);
    subscribe(
        &server,
        "/dst",
        json!({"sourceStreamPath": "/src", "subscriptionKey": "k", "start": "beginning",
               "filter": {"eventTypes": ["x.y/keep"]}}),
    )
    .await;
    let url = Arc::new(RwLock::new(server.url.clone()));
    let acked = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let writer = {
        let (url, acked, client) = (url.clone(), acked.clone(), client.clone());
        tokio::spawn(async move {
            for i in 0..EVENTS {
                let t = if i % 3 == 0 { "x.y/skip" } else { "x.y/keep" };
                let body = json!({"events": [{"type": t, "payload": {"i": i}, "idempotencyKey": format!("e{i}")}]});
                // Through kills and restarts: the same idempotency key until
                // acknowledged (with a deadline).
                crate::support::post_until_ok(&client, &url, &format!("{P}/src:append"), &body)
                    .await;
                acked.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    for kill in 0..KILLS {
        let target = (kill + 1) * EVENTS / (KILLS + 1);
        let count = acked.clone();
        wait_for(
            &format!("{target} appends"),
            Duration::from_secs(60),
            async || count.load(Ordering::SeqCst) >= target,
        )
        .await;
        server.restart();
        *url.write().unwrap() = server.url.clone();
    }
    writer.await.unwrap();

    let source = server.all_events(&format!("{P}/src")).await;
    let expected: Vec<u64> = source
        .iter()
        .filter(|e| e["type"] == "x.y/keep")
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(expected.len(), EVENTS - EVENTS.div_ceil(3));
    wait_for(
        "every matching event on the receiver",
        Duration::from_secs(60),
        async || data(&server, "/dst").await.len() >= expected.len(),
    )
    .await;
    let copies = data(&server, "/dst").await;
    let copied: Vec<u64> = copies
        .iter()
        .map(|c| c["source"]["copiedFrom"][0]["offset"].as_u64().unwrap())
        .collect();
    let unique: HashSet<u64> = copied.iter().copied().collect();
    assert_eq!(unique.len(), copied.len(), "no event is copied twice");
    assert_eq!(
        copied, expected,
        "every matching event, exactly once, in source order"
    );
    let payloads: Vec<&Value> = copies.iter().map(|c| &c["payload"]["i"]).collect();
    assert!(payloads.windows(2).all(|w| w[0].as_u64() < w[1].as_u64()));
}
