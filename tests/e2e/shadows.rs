//! Shadow versions end to end: `PUT ...?refold=shadow` folds the new version
//! beside the live one (real guests: the live `counter`, the shadow
//! `effector`, which returns the webhooks its events ask for), shows the
//! state's RFC 6902 diff and the held effects, and promotes or discards
//! each instance; a real loopback receiver sees what runs.

use std::time::Duration;

use serde_json::{json, Value};

use crate::effects::{all_effects, request, settled, wake, Receiver, EFFECTS};
use crate::support::{assert_error, cli_json, guest, wait_for, Server};

const ACME: &str = "/v1/projects/acme";

fn stream(path: &str) -> String {
    format!("{ACME}/streams{path}")
}

/// Waits until the shadow of `proc` on `path` is ready at the live
/// checkpoint; answers its view.
async fn ready(s: &Server, path: &str) -> Value {
    crate::support::shadow_ready(s, &stream(path), "proc").await
}

async fn digest_of(s: &Server) -> Value {
    let (status, c) = s.get(&format!("{ACME}/components/proc")).await;
    assert_eq!(status, 200, "{c}");
    c["digest"].clone()
}

fn hook(r: &Receiver, key: &str) -> Value {
    json!([{"key": key, "webhook": {"url": format!("{}/ok/{key}", r.base), "body": {"k": key}}}])
}

#[tokio::test]
async fn a_shadow_folds_beside_the_live_version_shows_its_diff_and_held_effects_and_promotes_per_instance(
) {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    // Version 1 (the counter) on three streams; it ignores the webhooks
    // the events ask for.
    let (status, v1) = s.deploy("acme", "proc", guest("counter")).await;
    assert_eq!(status, 200, "{v1}");
    for path in ["/orders", "/returns", "/refunds"] {
        wake(&s, &stream(path), "p", "proc").await;
        for i in 0..3 {
            request(
                &s,
                &stream(path),
                hook(&r, &format!("{}-old-{i}", &path[1..])),
            )
            .await;
        }
        crate::processors::caught_up(&s, &stream(path), "proc").await;
    }

    // Version 2 (the effector) as a shadow: the current version stays.
    let (status, v2) = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{v2}");
    assert_eq!(v2["shadowing"], json!(["/orders", "/refunds", "/returns"]));
    assert!(v2.get("refolding").is_none(), "{v2}");
    assert_eq!(digest_of(&s).await, v1["digest"], "the live version stays");

    // New events: the live version folds them (the wakes stay on it); the
    // shadow folds them too and holds their effects.
    for path in ["/orders", "/returns"] {
        for i in 0..2 {
            request(
                &s,
                &stream(path),
                hook(&r, &format!("{}-new-{i}", &path[1..])),
            )
            .await;
        }
        let live = crate::processors::caught_up(&s, &stream(path), "proc").await;
        assert_eq!(live["digest"], v1["digest"], "{live}");
        // The counter folds every event, the platform's included.
        let events = s.all_events(&stream(path)).await.len();
        assert_eq!(live["state"]["events"], events, "{live}");
    }
    let orders = ready(&s, "/orders").await;
    assert_eq!(orders["digest"], v2["digest"], "{orders}");
    assert_eq!(orders["liveDigest"], v1["digest"], "{orders}");
    assert_eq!(orders["shadowOffset"], orders["checkpointOffset"]);
    // Counter {events, sum, lastOffset} → effector {events, effects}.
    let diff = orders["stateDiff"].as_array().expect("a diff").clone();
    assert!(
        diff.iter()
            .any(|op| op["op"] == "add" && op["path"] == "/effects" && op["value"] == 5),
        "{diff:?}"
    );
    assert!(
        diff.iter()
            .any(|op| op["op"] == "remove" && op["path"] == "/sum"),
        "{diff:?}"
    );
    assert_eq!(
        orders["keysDiff"],
        json!({"added": 0, "removed": 0, "changed": 0, "sample": []})
    );
    // History's effects ran under the live version: only the new events'
    // are held, and none has run.
    assert_eq!(orders["heldEffects"]["count"], 2, "{orders}");
    let held: Vec<&Value> = orders["heldEffects"]["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["key"])
        .collect();
    assert_eq!(held, [&json!("orders-new-0"), &json!("orders-new-1")]);
    assert!(
        all_effects(&s, "").await.is_empty(),
        "a shadow runs nothing"
    );
    assert!(r.posts.lock().unwrap().is_empty());

    // Promote /orders (held effects dropped): its state is the live state
    // patched with the diff, at the same checkpoint, on version 2.
    let (_, live_before) = s
        .get(&format!("{}:processors/proc", stream("/orders")))
        .await;
    let (status, promoted) = s
        .post(
            &format!("{}:promoteShadow", stream("/orders")),
            json!({"component": "proc"}),
        )
        .await;
    assert_eq!(status, 200, "{promoted}");
    assert_eq!(promoted["outcome"], "promoted");
    assert_eq!(promoted["effectsStored"], 0);
    assert_eq!(
        promoted["checkpointOffset"],
        live_before["checkpointOffset"]
    );
    let (_, after) = s
        .get(&format!("{}:processors/proc", stream("/orders")))
        .await;
    assert_eq!(after["digest"], v2["digest"], "{after}");
    assert_eq!(after["checkpointOffset"], live_before["checkpointOffset"]);
    let mut patched = live_before["state"].clone();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(diff)).unwrap();
    json_patch::patch(&mut patched, &patch).unwrap();
    assert_eq!(
        after["state"], patched,
        "the diff took the live state to the shadow's"
    );
    assert!(all_effects(&s, "").await.is_empty(), "held effects dropped");
    // /orders runs version 2 now: its next event's effect runs.
    request(&s, &stream("/orders"), hook(&r, "orders-next")).await;
    settled(&s, "orders-next", "succeeded").await;
    let (_, orders_now) = s
        .get(&format!("{}:processors/proc", stream("/orders")))
        .await;
    assert_eq!(orders_now["state"]["effects"], 6, "{orders_now}");
    // /returns still runs version 1 beside its shadow.
    request(&s, &stream("/returns"), hook(&r, "returns-next")).await;
    let returns = crate::processors::caught_up(&s, &stream("/returns"), "proc").await;
    assert_eq!(returns["digest"], v1["digest"], "{returns}");
    let events = s.all_events(&stream("/returns")).await.len();
    assert_eq!(returns["state"]["events"], events, "{returns}");
    assert!(all_effects(&s, "&stream=/returns").await.is_empty());
    assert_eq!(digest_of(&s).await, v1["digest"], "one instance promoted");

    // Promote /returns running its held effects: the three events after
    // the shadow started, each once.
    let shadow = ready(&s, "/returns").await;
    assert_eq!(shadow["heldEffects"]["count"], 3, "{shadow}");
    let (status, promoted) = s
        .post(
            &format!("{}:promoteShadow", stream("/returns")),
            json!({"component": "proc", "runHeldEffects": true}),
        )
        .await;
    assert_eq!(status, 200, "{promoted}");
    assert_eq!(promoted["effectsStored"], 3);
    for key in ["returns-new-0", "returns-new-1", "returns-next"] {
        settled(&s, key, "succeeded").await;
        assert_eq!(r.posts_to(&format!("/ok/{key}")).len(), 1, "{key} ran once");
    }
    assert!(
        r.posts_to("/ok/returns-old-0").is_empty(),
        "history's effects are not held"
    );

    // Discard /refunds: the live instance is untouched, the shadow gone.
    let (_, refunds_before) = s
        .get(&format!("{}:processors/proc", stream("/refunds")))
        .await;
    let (status, discarded) = s
        .post(
            &format!("{}:discardShadow", stream("/refunds")),
            json!({"component": "proc"}),
        )
        .await;
    assert_eq!(status, 200, "{discarded}");
    assert_eq!(discarded["outcome"], "discarded");
    let gone = s
        .get(&format!("{}:processors/proc/shadow", stream("/refunds")))
        .await;
    assert_error(&gone, 404, "shadow-not-found", "proc");
    let (_, refunds) = s
        .get(&format!("{}:processors/proc", stream("/refunds")))
        .await;
    assert_eq!(refunds["state"], refunds_before["state"]);
    assert_eq!(refunds["digest"], v1["digest"]);
    // No instance shadows any more and two were promoted: version 2 is the
    // component's current version.
    assert_eq!(digest_of(&s).await, v2["digest"]);
    let again = s
        .post(
            &format!("{}:promoteShadow", stream("/orders")),
            json!({"component": "proc"}),
        )
        .await;
    assert_error(&again, 404, "shadow-not-found", "/orders");
}

#[tokio::test]
async fn a_shadow_survives_a_restart_a_deploy_replaces_it_and_bad_requests_name_the_value() {
    let r = Receiver::start().await;
    let mut s = Server::start_with(Some(EFFECTS), &[]);
    let not_deployed = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=shadow")
        .await;
    assert_error(&not_deployed, 404, "component-not-found", "proc");
    let (_, v1) = s.deploy("acme", "proc", guest("counter")).await;
    wake(&s, &stream("/orders"), "p", "proc").await;
    for i in 0..3 {
        request(&s, &stream("/orders"), hook(&r, &format!("old-{i}"))).await;
    }
    crate::processors::caught_up(&s, &stream("/orders"), "proc").await;

    let bad = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=maybe")
        .await;
    assert_error(&bad, 400, "invalid-request", "\"maybe\"");
    let bad = s
        .deploy_with_query(
            "acme",
            "proc",
            guest("effector"),
            "refold=shadow&replayEffects=true",
        )
        .await;
    assert_error(&bad, 400, "invalid-request", "replayEffects");
    let (status, v2) = s
        .deploy_with_query("acme", "proc", guest("effector"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{v2}");
    let before = ready(&s, "/orders").await;
    let bad = s
        .post(
            &format!("{}:promoteShadow", stream("/orders")),
            json!({"component": "proc", "runHeldEfects": true}),
        )
        .await;
    assert_error(&bad, 400, "invalid-request", "runHeldEfects");

    // A restart: the shadow's record survives and it folds again.
    s.restart();
    let after = ready(&s, "/orders").await;
    assert_eq!(after["digest"], v2["digest"]);
    assert_eq!(after["stateDiff"], before["stateDiff"]);
    let (_, live) = s
        .get(&format!("{}:processors/proc", stream("/orders")))
        .await;
    assert_eq!(live["digest"], v1["digest"], "the live version stays");

    // A plain deploy replaces the shadow (here: the live version again).
    let (status, same) = s.deploy("acme", "proc", guest("counter")).await;
    assert_eq!(status, 200, "{same}");
    let gone = s
        .get(&format!("{}:processors/proc/shadow", stream("/orders")))
        .await;
    assert_error(&gone, 404, "shadow-not-found", "refold=shadow");
    request(&s, &stream("/orders"), hook(&r, "later")).await;
    let live = crate::processors::caught_up(&s, &stream("/orders"), "proc").await;
    assert_eq!(live["digest"], v1["digest"]);
    assert!(all_effects(&s, "").await.is_empty());
}

#[tokio::test]
async fn the_cli_deploys_a_shadow_shows_its_diff_and_promotes_it() {
    let r = Receiver::start().await;
    let s = Server::start_with(Some(EFFECTS), &[]);
    let (_, v1) = s.deploy("acme", "proc", guest("counter")).await;
    wake(&s, &stream("/orders"), "p", "proc").await;
    request(&s, &stream("/orders"), hook(&r, "old")).await;
    crate::processors::caught_up(&s, &stream("/orders"), "proc").await;
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("effector.wasm");
    std::fs::write(&wasm, guest("effector")).unwrap();

    let deployed = cli_json(&s, &["deploy", "--shadow", "proc", wasm.to_str().unwrap()]);
    assert_eq!(deployed["shadowing"], json!(["/orders"]), "{deployed}");
    let conflicting = crate::support::run_cli(&[
        "deploy",
        "--shadow",
        "--refold",
        "--url",
        &s.url,
        "--project",
        "acme",
        "proc",
        wasm.to_str().unwrap(),
    ]);
    assert!(
        !conflicting.0 && conflicting.2.contains("--refold"),
        "{conflicting:?}"
    );
    ready(&s, "/orders").await;
    let shown = cli_json(&s, &["shadow", "show", "/orders", "proc"]);
    assert_eq!(shown["status"], "ready", "{shown}");
    assert_eq!(shown["liveDigest"], v1["digest"]);
    assert!(
        !shown["stateDiff"].as_array().unwrap().is_empty(),
        "{shown}"
    );
    let promoted = cli_json(&s, &["shadow", "promote", "/orders", "proc"]);
    assert_eq!(promoted["outcome"], "promoted", "{promoted}");
    // The only instance promoted: the version is current.
    assert_eq!(digest_of(&s).await, deployed["digest"]);
    let (ok, _, err) = crate::support::run_cli(&[
        "shadow",
        "discard",
        "--url",
        &s.url,
        "--project",
        "acme",
        "/orders",
        "proc",
    ]);
    assert!(!ok && err.contains("shadow-not-found"), "{err}");
}

#[tokio::test]
async fn a_shadows_keys_diff_names_the_keys_it_adds_and_removes_and_its_promotion_moves_the_bucket()
{
    let s = Server::start_with(Some(EFFECTS), &[]);
    // /bank: the ledger keeps a balance per account; its shadow (the
    // counter) keeps none. /tally: the other way round.
    let (_, ledger) = s.deploy("acme", "books", guest("ledger")).await;
    let (_, counter) = s.deploy("acme", "tally", guest("counter")).await;
    wake(&s, &stream("/bank"), "b", "books").await;
    wake(&s, &stream("/tally"), "t", "tally").await;
    for path in ["/bank", "/tally"] {
        for (account, cents) in [("a-1", 250), ("a-2", 40)] {
            let (status, out) = s
                .post(
                    &format!("{}:append", stream(path)),
                    json!({"events": [{"type": "deposited", "payload": {"account": account, "cents": cents}}]}),
                )
                .await;
            assert_eq!(status, 200, "{out}");
        }
    }
    crate::processors::caught_up(&s, &stream("/bank"), "books").await;
    crate::processors::caught_up(&s, &stream("/tally"), "tally").await;

    let (status, out) = s
        .deploy_with_query("acme", "books", guest("counter"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = s
        .deploy_with_query("acme", "tally", guest("ledger"), "refold=shadow")
        .await;
    assert_eq!(status, 200, "{out}");

    let shadow_of = async |path: &str, component: &str| {
        let mut seen = Value::Null;
        wait_for(
            "the shadow to be ready",
            Duration::from_secs(30),
            async || {
                let (status, v) = s
                    .get(&format!("{}:processors/{component}/shadow", stream(path)))
                    .await;
                assert_eq!(status, 200, "{v}");
                seen = v;
                seen["status"] == "ready"
            },
        )
        .await;
        seen
    };
    let bank = shadow_of("/bank", "books").await;
    assert_eq!(
        bank["keysDiff"],
        json!({"added": 0, "removed": 2, "changed": 0, "sample": [
            {"key": "balance/a-1", "change": "removed", "live": "250"},
            {"key": "balance/a-2", "change": "removed", "live": "40"},
        ]}),
        "{bank}"
    );
    assert_eq!(bank["liveDigest"], ledger["digest"]);
    let tally = shadow_of("/tally", "tally").await;
    assert_eq!(
        tally["keysDiff"],
        json!({"added": 2, "removed": 0, "changed": 0, "sample": [
            {"key": "balance/a-1", "change": "added", "shadow": "250"},
            {"key": "balance/a-2", "change": "added", "shadow": "40"},
        ]}),
        "{tally}"
    );
    assert_eq!(tally["liveDigest"], counter["digest"]);

    // Promoted, /tally's instance has the shadow's keys.
    let (status, out) = s
        .post(
            &format!("{}:promoteShadow", stream("/tally")),
            json!({"component": "tally"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, key) = s
        .get(&format!(
            "{}:processors/tally/keys/balance%2Fa-1",
            stream("/tally")
        ))
        .await;
    assert_eq!(status, 200, "{key}");
    assert_eq!(key["value"], "250");
    // The instance verifies: its state and keys are the new version's fold.
    let (status, v) = s
        .post(
            &format!("{}:verifyProcessor", stream("/tally")),
            json!({"component": "tally"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["matches"], true, "{v}");
}
