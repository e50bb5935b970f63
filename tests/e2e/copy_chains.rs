//! Copy provenance across chains, cycle drops with their audit line, and the
//! 32-hop bound.

use std::time::Duration;

use serde_json::{json, Value};

use crate::subscriptions::{data, ev, subscribe, wait_count, wait_for_type, FAST, P};
use crate::support::{wait_for, Server};

/// Waits until every subscription of `source` has caught up with its head.
async fn settled(s: &Server, source: &str) {
    wait_for(
        &format!("{source} deliveries to settle"),
        Duration::from_secs(20),
        async || {
            let (_, rt) = s.get(&format!("{P}{source}:runtime")).await;
            rt["subscriptions"]
                .as_object()
                .is_some_and(|subs| subs.values().all(|r| r["lag"] == 0 && r["attempt"] == 0))
        },
    )
    .await;
}

#[tokio::test]
async fn a_chain_of_seven_streams_keeps_provenance() {
    let s = Server::start_with(Some(FAST), &[]);
    for i in 1..7 {
        subscribe(
            &s,
            &format!("/c{}", i + 1),
            json!({"sourceStreamPath": format!("/c{i}"), "subscriptionKey": format!("hop{i}"),
                   "filter": {"eventTypes": ["x.y/travel"]}}),
        )
        .await;
    }
    s.post(&format!("{P}/c1:append"), ev("x.y/travel", json!({"n": 1})))
        .await;
    let last = wait_count(&s, "/c7", 1).await;
    let hops = last[0]["source"]["copiedFrom"].as_array().unwrap();
    let paths: Vec<_> = hops
        .iter()
        .map(|h| h["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, vec!["/c1", "/c2", "/c3", "/c4", "/c5", "/c6"]);
    let keys: Vec<_> = hops
        .iter()
        .map(|h| h["subscriptionKey"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, vec!["hop1", "hop2", "hop3", "hop4", "hop5", "hop6"]);
    assert_eq!(
        hops[0]["offset"], 3,
        "the first hop names the original event"
    );
    assert!(hops
        .iter()
        .all(|h| h["type"] == "x.y/travel" && h["projectId"] == "acme"));
    assert_eq!(last[0]["payload"], json!({"n": 1}));
}

#[tokio::test]
async fn a_reciprocal_pair_terminates_with_one_audit_line() {
    let s = Server::start_with(Some(FAST), &[]);
    subscribe(
        &s,
        "/b",
        json!({"sourceStreamPath": "/a", "subscriptionKey": "a-to-b"}),
    )
    .await;
    subscribe(
        &s,
        "/a",
        json!({"sourceStreamPath": "/b", "subscriptionKey": "b-to-a"}),
    )
    .await;
    s.post(&format!("{P}/a:append"), ev("x.y/ping", json!({})))
        .await;
    wait_for(
        "the drop audit on /a",
        Duration::from_secs(20),
        async || {
            data(&s, "/a")
                .await
                .iter()
                .any(|e| e["type"] == "events.iterate.com/stream/error-occurred")
        },
    )
    .await;
    settled(&s, "/a").await;
    settled(&s, "/b").await;
    let a = data(&s, "/a").await;
    let audits: Vec<&Value> = a
        .iter()
        .filter(|e| e["type"] == "events.iterate.com/stream/error-occurred")
        .collect();
    assert_eq!(audits.len(), 1, "{a:#?}");
    let message = audits[0]["payload"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "dropped 1 copied event(s) from \"/b\" subscription \"b-to-a\" (source offsets"
        ),
        "{message}"
    );
    // /b holds the ping and /a's configure event, never the audit line.
    let b = data(&s, "/b").await;
    assert!(
        b.iter()
            .all(|e| e["type"] != "events.iterate.com/stream/error-occurred"),
        "{b:#?}"
    );
    assert!(b.iter().any(|e| e["type"] == "x.y/ping"));
    // The ping came back to /a only as a dropped copy: /a holds no copy of it.
    assert!(a
        .iter()
        .filter(|e| e["type"] == "x.y/ping")
        .all(|e| e.get("source").is_none()));
}

#[tokio::test]
async fn the_33rd_hop_is_dropped() {
    let s = Server::start_with(Some(FAST), &[]);
    // s0 -> s1 -> ... -> s33: an event reaching s32 carries 32 hops.
    for i in 0..33 {
        subscribe(
            &s,
            &format!("/s{}", i + 1),
            json!({"sourceStreamPath": format!("/s{i}"), "subscriptionKey": "next",
                   "filter": {"eventTypes": ["x.y/far"]}}),
        )
        .await;
    }
    s.post(&format!("{P}/s0:append"), ev("x.y/far", json!({})))
        .await;
    let at32 = wait_for_type(&s, "/s32", "x.y/far").await;
    assert_eq!(
        at32[0]["source"]["copiedFrom"].as_array().unwrap().len(),
        32
    );
    wait_for_type(&s, "/s33", "events.iterate.com/stream/error-occurred").await;
    settled(&s, "/s32").await;
    let at33 = data(&s, "/s33").await;
    assert_eq!(at33.len(), 1, "{at33:#?}");
    assert_eq!(at33[0]["type"], "events.iterate.com/stream/error-occurred");
    assert!(
        at33[0]["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("32-hop"),
        "{}",
        at33[0]
    );
}
