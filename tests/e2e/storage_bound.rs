//! `[limits] max-project-bytes`: one project cannot fill the disk the others
//! write to. At its bound a project's appends, ingest and the copies into it
//! are refused with `507 project-storage-full` naming the bound; the
//! platform's own facts (a halt) still land; another project writes on; the
//! count survives a restart (it is kept by every commit, `streams.bytes`).

use std::time::Duration;

use serde_json::json;

use crate::support::{assert_error, guest, wait_for, Server};

const A: &str = "/v1/projects/acme/streams";
const B: &str = "/v1/projects/beta/streams";

/// 40 kB a project; a copy retried once a second, halted after two tries.
const BOUND: &str = r#"
[limits]
max-project-bytes = 40000

[delivery]
max-attempts = 2
backoff-base-ms = 1000
backoff-max-ms = 1000
"#;

/// An event with a payload of about `bytes` bytes.
fn sized(bytes: usize) -> serde_json::Value {
    json!({"events": [{"type": "x.y/blob", "payload": {"blob": "x".repeat(bytes)}}]})
}

#[tokio::test]
async fn a_project_at_its_storage_bound_is_refused_and_the_others_write_on() {
    let mut s = Server::start_with(Some(BOUND), &[]);
    // /src's blobs are copied to /dst.
    let (status, out) = s
        .post(
            &format!("{A}/src:append"),
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "copy", "filter": {"eventTypes": ["x.y/blob"]},
                    "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/dst",
                        "delivery": {"start": "now", "onFailingEvent": "halt"}}}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    // 25 kB of a 40 kB bound: stored; its copy, 25 kB more, is not.
    let (status, out) = s.post(&format!("{A}/src:append"), sized(25_000)).await;
    assert_eq!(status, 200, "{out}");
    // 5 kB appends fill what is left.
    let mut stored = 0;
    let refused = loop {
        let (status, out) = s.post(&format!("{A}/fill:append"), sized(5_000)).await;
        if status != 200 {
            break (status, out);
        }
        stored += 1;
        assert!(stored < 4, "15 kB hold no more than 3 events of 5 kB");
    };
    assert!(stored >= 1, "no event of 5 kB stored in the 15 kB left");
    assert_error(&refused, 507, "project-storage-full", "max-project-bytes");
    assert!(
        refused.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"acme\"") && m.contains("40000")),
        "{}",
        refused.1
    );

    // The copy was refused, retried, and halted naming the bound: the halt,
    // a platform fact, lands in the full project; nothing was copied.
    let halted = s
        .wait_halted(&format!("{A}/src"), "copy", Duration::from_secs(30))
        .await;
    assert!(
        halted["error"]
            .as_str()
            .is_some_and(|e| e.contains("max-project-bytes")),
        "{halted}"
    );
    let (_, dst) = s.get(&format!("{A}/dst:events?afterOffset=0")).await;
    assert!(
        !dst["events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["type"] == "x.y/blob"),
        "{dst}"
    );

    // Another project is not affected.
    let (status, out) = s.post(&format!("{B}/fill:append"), sized(5_000)).await;
    assert_eq!(status, 200, "{out}");
    // /metrics shows what each project stores.
    let acme = s
        .metric("streamhost_project_stored_bytes{project=\"acme\"}")
        .await;
    assert!(
        (30_000..=40_000).contains(&acme),
        "acme stores {acme} bytes"
    );

    // Ingest into the full project is refused before anything is accepted.
    let (status, out) = s
        .post(
            "/v1/projects/acme/ingest/fill",
            json!({"events": [{"type": "x.y/blob", "payload": {"blob": "x".repeat(5_000)},
                "idempotencyKey": "k-1"}]}),
        )
        .await;
    assert_error(&(status, out), 507, "project-storage-full", "acme");

    // The count is kept with the streams: after a restart the project is
    // still full, the other still writes.
    s.restart();
    let after = s.post(&format!("{A}/fill:append"), sized(5_000)).await;
    assert_error(&after, 507, "project-storage-full", "acme");
    let (status, out) = s.post(&format!("{B}/more:append"), sized(5_000)).await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test]
async fn a_wiped_stream_gives_its_room_back_within_seconds() {
    let s = Server::start_with(Some("[limits]\nmax-project-bytes = 20000\n"), &[]);
    // Small events with long idempotency keys: each key is stored too.
    let mut n = 0;
    let refused = loop {
        let out = s
            .post(
                &format!("{A}/keys:append"),
                json!({"events": [{"type": "x.y/k", "idempotencyKey": format!("{n:0>400}")}]}),
            )
            .await;
        if out.0 != 200 {
            break out;
        }
        n += 1;
        assert!(n < 60, "20 kB hold fewer than 60 events with 400-byte keys");
    };
    assert!(n >= 20, "only {n} events with 400-byte keys fit in 20 kB");
    assert_error(&refused, 507, "project-storage-full", "acme");
    // Wiping the stream frees what it stored: storage's count, read again
    // every few seconds, lets the project write again.
    let (status, out) = s.post(&format!("{A}/keys:reset"), json!({})).await;
    assert_eq!(status, 200, "{out}");
    wait_for(
        "the wiped stream's room back",
        Duration::from_secs(15),
        async || {
            s.post(
                &format!("{A}/other:append"),
                json!({"events": [{"type": "x.y/k", "payload": {"n": 1}}]}),
            )
            .await
            .0 == 200
        },
    )
    .await;
}

/// A project's processors' keyed state and its components' versions count
/// against its bound as its events do: a deploy past it is refused with
/// `507 project-storage-full`; a wake whose keyed writes would pass it
/// fails, is retried, and halts naming the bound, storing none of them;
/// another project deploys on; the count read back from storage after a
/// restart holds the keys and the components.
#[tokio::test]
async fn keyed_state_and_components_count_against_the_projects_bound() {
    let (ledger, counter, totals) = (guest("ledger"), guest("counter"), guest("order_totals"));
    let components = (ledger.len() + counter.len()) as u64;
    // Room for one import of 10,000 accounts (`balance/acct-1xxxxx` and
    // `1`: 200,000 bytes of keys) beside the two components and a few
    // events; not for a second, nor for a third component after one.
    let bound = components + 300_000;
    assert!(
        totals.len() > 100_000,
        "order_totals is {} bytes",
        totals.len()
    );
    let config = format!(
        "[limits]\nmax-project-bytes = {bound}\n\n[delivery]\nmax-attempts = 2\n\
         backoff-base-ms = 200\nbackoff-max-ms = 200\ntimeout-ms = 10000\n"
    );
    let mut s = Server::start_with(Some(&config), &[]);
    for (name, bytes) in [("ledger", ledger.clone()), ("counter", counter)] {
        let (status, out) = s.deploy("acme", name, bytes).await;
        assert!(status == 200 || status == 201, "{out}");
    }
    let stream = format!("{A}/bank");
    let (status, out) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
                "payload": {"subscriptionKey": "ledger",
                    "receiver": {"action": "processor-wake",
                        "expression": ["components", ["get", "ledger"], "wake"]}}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let import = |from: u64| {
        json!({"events": [{"type": "imported",
            "payload": {"from": from, "count": 10_000, "cents": 1}}]})
    };
    let (status, out) = s.post(&format!("{stream}:append"), import(100_000)).await;
    assert_eq!(status, 200, "{out}");
    crate::processors::caught_up(&s, &stream, "ledger").await;
    let accounts = async |prefix: &str| {
        let (status, keys) = s
            .get(&format!(
                "{stream}:processors/ledger/keys?prefix=balance%2F{prefix}&limit=1"
            ))
            .await;
        assert_eq!(status, 200, "{keys}");
        keys["keys"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(accounts("acct-1").await, 1, "the first import's accounts");

    // A third component does not fit: refused, naming the project.
    let refused = s.deploy("acme", "totals", totals.clone()).await;
    assert_error(&refused, 507, "project-storage-full", "acme");
    assert!(
        refused.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("keyed state") && m.contains(&bound.to_string())),
        "{}",
        refused.1
    );
    let (status, _) = s.get("/v1/projects/acme/components/totals").await;
    assert_eq!(status, 404, "the refused deploy stored nothing");

    // A second import does not fit either: its wake fails, is retried,
    // and halts naming the bound; none of its accounts is stored.
    let (status, out) = s.post(&format!("{stream}:append"), import(200_000)).await;
    assert_eq!(status, 200, "{out}");
    let halted = s
        .wait_halted(&stream, "ledger", Duration::from_secs(30))
        .await;
    assert!(
        halted["error"]
            .as_str()
            .is_some_and(|e| e.contains("max-project-bytes") && e.contains("keyed state")),
        "{halted}"
    );
    assert_eq!(accounts("acct-2").await, 0, "the refused import's accounts");

    // Another project deploys on.
    let (status, out) = s.deploy("beta", "totals", totals.clone()).await;
    assert!(status == 200 || status == 201, "{out}");

    // After a restart the count is storage's (keys and components, besides
    // the events): still no room for the third component.
    s.restart();
    let after = s.deploy("acme", "totals", totals).await;
    assert_error(&after, 507, "project-storage-full", "acme");
}
