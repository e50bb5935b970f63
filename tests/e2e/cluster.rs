//! Several hosts on one PostgreSQL database (runs when the suite runs on
//! PostgreSQL: `STREAMHOST_TEST_POSTGRES`). Each host is a real server
//! process with its own data dir; they share the test server's database.

use std::time::Duration;

use serde_json::{json, Value};

use crate::subscriptions::{ev, P};
use crate::support::{wait_for, Server, SseClient};

/// Short leases, so a stopped host loses its streams quickly.
const CLUSTER: &str = "[cluster]\nlease-ms = 1500\n";

fn on_sqlite() -> bool {
    if crate::support::postgres_base().is_none() {
        println!("skipped on SQLite: several hosts need PostgreSQL storage");
        return true;
    }
    false
}

fn offsets(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn any_host_serves_any_stream_through_its_owner() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let stream = format!("{P}/orders");
    // A creates the stream: A owns it.
    let (status, _) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": 1})))
        .await;
    assert_eq!(status, 200);
    // A live connection through B is fed by the owner.
    let mut live = SseClient::open(&b, &format!("{stream}:connect?replayAfterOffset=0"))
        .await
        .expect("a connection through B");
    // Appends through B go to A; offsets stay dense.
    for n in 2..=4 {
        let (status, out) = b
            .post(&format!("{stream}:append"), ev("x.y/a", json!({"n": n})))
            .await;
        assert_eq!(status, 200, "{out}");
    }
    let through_a = a.all_events(&stream).await;
    let through_b = b.all_events(&stream).await;
    assert_eq!(through_a, through_b);
    let all = offsets(&through_a);
    assert_eq!(all, (1..=all.len() as u64).collect::<Vec<_>>(), "dense");
    let ns: Vec<_> = through_a
        .iter()
        .filter(|e| e["type"] == "x.y/a")
        .map(|e| e["payload"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, vec![1, 2, 3, 4]);
    let mut seen = Vec::new();
    while seen.len() < all.len() {
        let batch = live.batch().await;
        seen.extend(offsets(batch["events"].as_array().unwrap()));
    }
    assert_eq!(seen, all, "the connection through B");
    // Both hosts are in the cluster; A holds the stream.
    let (status, cluster) = b.get("/v1/cluster").await;
    assert_eq!(status, 200, "{cluster}");
    assert_eq!(cluster["self"], json!(b.url));
    let hosts = cluster["hosts"].as_array().unwrap();
    let host = |url: &str| hosts.iter().find(|h| h["url"] == json!(url)).cloned();
    assert_eq!(
        host(&a.url).expect("A is listed")["streams"],
        1,
        "{cluster}"
    );
    assert_eq!(
        host(&b.url).expect("B is listed")["streams"],
        0,
        "{cluster}"
    );
}

#[tokio::test]
async fn a_deposed_owner_cannot_commit() {
    if on_sqlite() {
        return;
    }
    let a = Server::start_with(Some(CLUSTER), &[]);
    let b = Server::joining(&a, Some(CLUSTER));
    let stream = format!("{P}/ledger");
    let (status, _) = a
        .post(&format!("{stream}:append"), ev("x.y/a", json!({"by": "a"})))
        .await;
    assert_eq!(status, 200);
    // A stops (as in a long pause): it renews nothing, its lease expires,
    // and B takes the stream over and writes to it.
    a.signal("STOP");
    // Until A's lease expires, B forwards to A, which does not answer
    // (503 after a lease's length); then B owns the stream. The same key
    // makes the retries one event.
    let by_b =
        json!({"events": [{"type": "x.y/a", "payload": {"by": "b"}, "idempotencyKey": "b-1"}]});
    wait_for(
        "B to take the stream over",
        Duration::from_secs(20),
        async || b.post(&format!("{stream}:append"), by_b.clone()).await.0 == 200,
    )
    .await;
    a.signal("CONT");
    // A still believes it owns the stream: its write is refused in the
    // commit (the lease's epoch moved), and nothing of it is stored.
    let (status, out) = a
        .post(
            &format!("{stream}:append"),
            ev("x.y/a", json!({"by": "a-after"})),
        )
        .await;
    assert_ne!(status, 200, "a deposed owner committed: {out}");
    assert!(
        a.log().contains("a deposed owner's write is refused"),
        "A's log says why:\n{}",
        a.log()
    );
    let events = b.all_events(&stream).await;
    assert!(
        events.iter().all(|e| e["payload"]["by"] != "a-after"),
        "{events:?}"
    );
    assert_eq!(
        offsets(&events),
        (1..=events.len() as u64).collect::<Vec<_>>()
    );
    // Asked again, A knows the owner now: the request goes to B.
    let (status, out) = a
        .post(
            &format!("{stream}:append"),
            ev("x.y/a", json!({"by": "a-retry"})),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let events = b.all_events(&stream).await;
    assert_eq!(events.last().unwrap()["payload"]["by"], "a-retry");
}
