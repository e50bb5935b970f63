//! The receiver's stamp fence and copy deduplication, driven through the
//! library (public callers cannot deliver copies): a real host on a temp
//! SQLite file, real actors.

use std::time::Duration;

use serde_json::{json, Value};
use streamhost::delivery::copy::{CopyBatch, SourceInfo};
use streamhost::stream::{AppendInput, Authority, Event, Namespace, ReadQuery, StreamAddress};
use streamhost::{Config, Host};

use crate::support::wait_for;

fn input(v: Value) -> AppendInput {
    serde_json::from_value(v).unwrap()
}

async fn events(host: &Host, at: &StreamAddress) -> Vec<Value> {
    match host
        .streams()
        .read(
            at,
            ReadQuery {
                after_offset: 0,
                limit: 500,
                include_ephemeral: false,
            },
        )
        .await
    {
        Ok(page) => page
            .events
            .iter()
            .map(|r| serde_json::from_str(r.get()).unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_stamps_are_rejected_and_equal_ones_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    let ns = Namespace::project("acme").unwrap();
    let src = StreamAddress::new(ns.clone(), "/src").unwrap();
    let dst = StreamAddress::new(ns, "/dst").unwrap();
    let configure = |description: &str| {
        input(
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": "k", "description": description,
                "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/dst",
                             "delivery": {"start": "beginning", "onFailingEvent": "halt"}}}}]}),
        )
    };
    let first = host
        .streams()
        .append(&src, configure("v1"), Authority::Public)
        .await
        .unwrap();
    let gen1 = first.events[0].offset;
    let data = host
        .streams()
        .append(
            &src,
            input(json!({"events": [{"type": "x.y/a", "payload": {"n": 1}}]})),
            Authority::Public,
        )
        .await
        .unwrap();
    let event: Event = data.events[0].clone();
    // Replace: generation 2 delivers and the receiver records its stamp.
    let second = host
        .streams()
        .append(&src, configure("v2"), Authority::Public)
        .await
        .unwrap();
    let gen2 = second.events[0].offset;
    wait_for(
        "generation 2 to reach the receiver",
        Duration::from_secs(10),
        async || {
            events(&host, &dst)
                .await
                .iter()
                .any(|e| e["source"]["copiedFrom"][0]["cursorChangedAtSourceOffset"] == gen2)
        },
    )
    .await;
    let before = events(&host, &dst).await.len();

    let source = SourceInfo {
        project_id: Some("acme".into()),
        path: "/src".into(),
        stream_id: first.stream_id.clone(),
        stream_created_at: first.stream_created_at.clone(),
    };
    let batch = |generation: u64, source: SourceInfo| CopyBatch {
        source,
        subscription_key: "k".into(),
        generation,
        transform: None,
        events: vec![event.clone()],
        shaped: None,
    };

    // A delayed batch of the older configuration.
    let stale = host
        .streams()
        .deliver(&dst, batch(gen1, source.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        (stale.kind, stale.code),
        (streamhost::ErrorKind::Conflict, "stale-delivery")
    );
    assert!(
        stale.message.contains("already accepted a newer delivery"),
        "{}",
        stale.message
    );
    // A batch from an older lifetime of the source.
    let older_lifetime = SourceInfo {
        stream_created_at: "2000-01-01T00:00:00.000Z".into(),
        ..source.clone()
    };
    let stale = host
        .streams()
        .deliver(&dst, batch(gen2 + 100, older_lifetime))
        .await
        .unwrap_err();
    assert_eq!(stale.code, "stale-delivery");
    // The same stamp again: accepted, and deduplicated by the copy identity.
    let again = host
        .streams()
        .deliver(&dst, batch(gen2, source.clone()))
        .await
        .unwrap();
    assert_eq!(again.appended, 1);
    assert_eq!(
        events(&host, &dst).await.len(),
        before,
        "a retried delivery collapses"
    );
    // A newer stamp is accepted and moves the fence.
    host.streams()
        .deliver(&dst, batch(gen2 + 1, source.clone()))
        .await
        .unwrap();
    assert_eq!(events(&host, &dst).await.len(), before + 1);
    let state = host.streams().state(&dst).await.unwrap();
    assert_eq!(
        state.subscriptions.inbound.by_source_path["/src"]["k"].cursor_changed_at_source_offset,
        gen2 + 1
    );
    let stale = host
        .streams()
        .deliver(&dst, batch(gen2, source))
        .await
        .unwrap_err();
    assert_eq!(stale.code, "stale-delivery");
}
