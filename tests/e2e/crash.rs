//! Crash safety: clients append with idempotency keys to two streams (so a
//! group commit holds both streams' rounds) while the server is SIGKILLed
//! and restarted; every acknowledged event survives exactly once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{post_until_ok, wait_for, Server};

const STREAMS: [&str; 2] = [
    "/v1/projects/acme/streams/crash/log",
    "/v1/projects/acme/streams/crash/other",
];
const CLIENTS: usize = 8;
const KEYS_PER_CLIENT: usize = 120;
const KILLS: usize = 4;

/// Appends `key` until the server acknowledges it; returns the offset.
async fn append_until_acked(
    client: &reqwest::Client,
    url: &RwLock<String>,
    stream: &str,
    key: &str,
    payload: &Value,
) -> u64 {
    let body =
        json!({"events": [{"type": "x.y/crash", "payload": payload, "idempotencyKey": key}]});
    let answer = post_until_ok(client, url, &format!("{stream}:append"), &body).await;
    answer["events"][0]["offset"].as_u64().expect("offset")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_events_survive_sigkill_exactly_once() {
    let mut server = Server::start();
    let url = Arc::new(RwLock::new(server.url.clone()));
    // Key → (stream, offset).
    let acked: Arc<Mutex<HashMap<String, (usize, u64)>>> = Arc::default();
    let acked_count = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (url, acked, acked_count, client) = (
            url.clone(),
            acked.clone(),
            acked_count.clone(),
            client.clone(),
        );
        clients.push(tokio::spawn(async move {
            let stream = c % STREAMS.len();
            for i in 0..KEYS_PER_CLIENT {
                let key = format!("c{c}-{i}");
                let payload = json!({"client": c, "i": i});
                let offset =
                    append_until_acked(&client, &url, STREAMS[stream], &key, &payload).await;
                if i % 5 == 0 {
                    // An immediate retry of an acknowledged key maps to the original.
                    let again =
                        append_until_acked(&client, &url, STREAMS[stream], &key, &payload).await;
                    assert_eq!(again, offset, "retry of {key} moved");
                }
                acked.lock().unwrap().insert(key, (stream, offset));
                acked_count.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }

    let total = CLIENTS * KEYS_PER_CLIENT;
    for kill in 0..KILLS {
        let target = (kill + 1) * total / (KILLS + 2);
        let count = acked_count.clone();
        wait_for(
            &format!("{target} acknowledged appends"),
            Duration::from_secs(120),
            async || count.load(Ordering::SeqCst) >= target,
        )
        .await;
        server.restart();
        *url.write().unwrap() = server.url.clone();
    }
    for c in clients {
        c.await.unwrap();
    }

    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), total);
    let mut seen: HashMap<String, (usize, u64)> = HashMap::new();
    let mut stored = 0;
    for (s, stream) in STREAMS.iter().enumerate() {
        let events = server.all_events(stream).await;
        // Dense offsets from 1.
        for (i, e) in events.iter().enumerate() {
            assert_eq!(
                e["offset"].as_u64(),
                Some(i as u64 + 1),
                "offsets of {stream} are dense"
            );
        }
        // Every acknowledged key exactly once, at its acknowledged offset.
        for e in &events[1..] {
            let key = e["idempotencyKey"]
                .as_str()
                .expect("every appended event has a key")
                .to_string();
            assert!(
                seen.insert(key.clone(), (s, e["offset"].as_u64().unwrap()))
                    .is_none(),
                "{key} appears twice"
            );
        }
        stored += events.len() - 1;
    }
    assert_eq!(seen, acked, "the log holds exactly the acknowledged events");
    assert_eq!(stored, total);

    // After all the crashes, a retry of every key still maps to its original.
    let url = RwLock::new(server.url.clone());
    for (key, (stream, offset)) in acked.iter().take(50) {
        let (c, i) = key[1..].split_once('-').unwrap();
        let payload = json!({"client": c.parse::<u64>().unwrap(), "i": i.parse::<u64>().unwrap()});
        assert_eq!(
            append_until_acked(&client, &url, STREAMS[*stream], key, &payload).await,
            *offset
        );
    }
}
