//! Ingest with several hosts on one PostgreSQL database (runs when the
//! suite runs on PostgreSQL): every event answered `202` reaches its stream
//! once whichever host accepted or drains it, capacity is one bound for
//! all hosts, and one host at a time runs the JetStream bridge.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cluster::{cluster_rows, on_sqlite};
use crate::ingest::{
    control_events, halted_subscription, ingest_status, messages_in, numbered_orders, order,
    publish_orders, publish_resume, set_paused, wait_halts, wait_jetstream_empty, wait_orders,
    BRIDGED, INGEST, STREAM,
};
use crate::support::{wait_for, NatsServer, Server};

/// Short leases, so a killed host's work moves quickly.
const CLUSTER: &str = "[cluster]\nlease-ms = 1500\n";

#[tokio::test]
async fn ingest_through_several_hosts_appends_every_accepted_event_once_in_producer_order() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let c = Server::joining(&a, Some(CLUSTER));
    let hosts = [&a, &b, &c];
    // 6 producers, each 30 requests of 5 events, spread over the 3 hosts
    // (every host also drains every stream): 900 events.
    let producers = (0..6u64).map(|p| {
        let hosts = hosts.map(|h| h.url.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            for r in 0..30u64 {
                let events: Vec<Value> = (0..5u64)
                    .map(|i| {
                        let n = p * 1000 + r * 5 + i;
                        order(&format!("p{p}-{n}"), n)
                    })
                    .collect();
                let host = &hosts[((p + r) % 3) as usize];
                let answer = client
                    .post(format!("{host}{INGEST}"))
                    .json(&json!({"events": events}))
                    .send()
                    .await
                    .expect("an answer");
                assert_eq!(answer.status(), 202, "{:?}", answer.text().await);
            }
        })
    });
    for p in producers.collect::<Vec<_>>() {
        p.await.expect("a producer");
    }
    let got = wait_orders(&b, STREAM, 900).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (key, _) in &got {
        *seen.entry(key.clone()).or_default() += 1;
    }
    assert_eq!(seen.len(), 900, "every accepted event arrived");
    assert!(seen.values().all(|n| *n == 1), "none twice");
    // Each producer's events in the order it sent them.
    for p in 0..6u64 {
        let mine: Vec<u64> = got
            .iter()
            .map(|(_, n)| *n)
            .filter(|n| n / 1000 == p)
            .collect();
        let mut sorted = mine.clone();
        sorted.sort_unstable();
        assert_eq!(mine, sorted, "producer {p} in order");
    }
    for host in hosts {
        wait_for("nothing pending", Duration::from_secs(20), async || {
            ingest_status(host).await["http"]["pending"] == 0
        })
        .await;
    }
}

#[tokio::test]
async fn several_hosts_share_one_ingest_capacity() {
    if on_sqlite() {
        return;
    }
    let config =
        format!("{CLUSTER}[ingest]\nmax-pending-events = 6\nmax-pending-events-per-project = 6\n");
    let a = Server::start_with(Some(&config), &[]);
    let b = Server::joining(&a, Some(&config));
    // Held by a pause: what is accepted stays pending.
    set_paused(&a, STREAM, true).await;
    let batch = |from: u64, to: u64| json!({"events": (from..=to).map(|n| order(&format!("o-{n}"), n)).collect::<Vec<_>>()});
    assert_eq!(a.post(INGEST, batch(1, 4)).await.0, 202);
    // B has accepted nothing itself, but the bound is the cluster's.
    let (status, out) = b.post(INGEST, batch(5, 8)).await;
    assert_eq!(status, 503, "{out}");
    assert_eq!(out["error"]["code"], "capacity-exhausted", "{out}");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4 of 6 events pending"),
        "{out}"
    );
    assert_eq!(b.post(INGEST, batch(5, 6)).await.0, 202);
    for host in [&a, &b] {
        let status = ingest_status(host).await;
        assert_eq!(status["http"]["pending"], 6, "{status}");
    }
    assert_eq!(a.post(INGEST, batch(7, 7)).await.0, 503);
    // Resumed: all six arrive in order, and the room comes back on both.
    set_paused(&b, STREAM, false).await;
    assert_eq!(wait_orders(&a, STREAM, 6).await, numbered_orders(1, 6));
    for host in [&a, &b] {
        wait_for("nothing pending", Duration::from_secs(20), async || {
            ingest_status(host).await["http"]["pending"] == 0
        })
        .await;
    }
    assert_eq!(b.post(INGEST, batch(7, 12)).await.0, 202);
    assert_eq!(wait_orders(&a, STREAM, 12).await, numbered_orders(1, 12));
}

/// Which of `hosts` consume the JetStream stream now.
async fn consuming(hosts: &[&Server]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        if ingest_status(h).await["nats"]["consuming"] == true {
            out.push(i);
        }
    }
    out
}

#[tokio::test]
async fn one_host_at_a_time_runs_the_bridge_and_another_takes_over_when_it_dies() {
    if on_sqlite() {
        return;
    }
    let nats = NatsServer::start();
    let mut a = Server::start_with(Some(CLUSTER), &["--nats", &nats.url]);
    let mut b = Server::joining_with(&a, Some(CLUSTER), &["--nats", &nats.url]);
    wait_for("one host consuming", Duration::from_secs(20), async || {
        consuming(&[&a, &b]).await.len() == 1
    })
    .await;
    let js = nats.jetstream().await;
    publish_orders(&js, 1, 100).await;
    assert_eq!(wait_orders(&a, BRIDGED, 100).await, numbered_orders(1, 100));
    wait_jetstream_empty(&js).await;
    // Still exactly one, and the other says who runs it.
    let running = consuming(&[&a, &b]).await;
    assert_eq!(running.len(), 1, "{running:?}");
    let (runner, other) = if running[0] == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let idle = ingest_status(other).await;
    assert!(
        idle["nats"]["lastError"]
            .as_str()
            .unwrap_or_default()
            .contains("runs the bridge"),
        "{idle}"
    );
    // Messages published while the runner is dead wait in JetStream; the
    // other host takes the bridge's lease over and appends them once.
    runner.kill();
    publish_orders(&js, 101, 200).await;
    wait_for(
        "the other host consuming",
        Duration::from_secs(30),
        async || ingest_status(other).await["nats"]["consuming"] == true,
    )
    .await;
    assert_eq!(
        wait_orders(other, BRIDGED, 200).await,
        numbered_orders(1, 200)
    );
    wait_jetstream_empty(&js).await;
    assert_eq!(messages_in(&js).await, 0);
}

#[tokio::test]
async fn a_resume_message_resumes_a_subscription_of_a_stream_the_other_host_owns() {
    if on_sqlite() {
        return;
    }
    let nats = NatsServer::start();
    let a = Server::start_with(Some(CLUSTER), &["--nats", &nats.url]);
    let b = Server::joining_with(&a, Some(CLUSTER), &["--nats", &nats.url]);
    wait_for("one host consuming", Duration::from_secs(20), async || {
        consuming(&[&a, &b]).await.len() == 1
    })
    .await;
    let (runner, other) = if consuming(&[&a, &b]).await == [0] {
        (&a, &b)
    } else {
        (&b, &a)
    };
    // The host that does not run the bridge creates the stream: it owns it.
    halted_subscription(other).await;
    let (cluster, [runner_row, other_row]) = cluster_rows(runner, [&runner.url, &other.url]).await;
    assert_eq!(runner_row["streams"], 0, "{cluster}");
    assert!(other_row["streams"].as_u64() >= Some(1), "{cluster}");

    let js = nats.jetstream().await;
    publish_resume(&js, "resume-1").await;
    // The bridge's host resumed it through its owner, once.
    wait_halts(other, 2).await;
    let resumed = control_events(runner, "resumed").await;
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["idempotencyKey"], "resume-1");
    wait_jetstream_empty(&js).await;
    assert_eq!(
        ingest_status(runner).await["nats"]["diagnostics"],
        serde_json::json!([])
    );
}
