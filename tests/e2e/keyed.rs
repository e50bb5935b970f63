//! Keyed processor state end to end: the `ledger` example (a balance per
//! account in `wasi:keyvalue`) run by the real server, its keys read back
//! through the API, verified, reset, refolded and folded offline.

use std::time::Duration;

use serde_json::{json, Value};

use crate::processors::{caught_up, PROC};
use crate::support::{assert_error, guest, run_cli, wait_for, Server};

const S: &str = "/v1/projects/acme/streams/bank";

fn wake() -> Value {
    json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "ledger",
            "receiver": {"action": "processor-wake",
                "expression": ["components", ["get", "ledger"], "wake"]}}}]})
}

async fn append(s: &Server, events: Value) {
    let (status, out) = s
        .post(&format!("{S}:append"), json!({ "events": events }))
        .await;
    assert_eq!(status, 200, "{out}");
}

fn deposit(account: &str, cents: i64) -> Value {
    json!({"type": "deposited", "payload": {"account": account, "cents": cents}})
}

fn withdraw(account: &str, cents: i64) -> Value {
    json!({"type": "withdrawn", "payload": {"account": account, "cents": cents}})
}

/// A ledger server with the processor deployed and subscribed.
async fn ledger() -> Server {
    let s = Server::start_with(Some(PROC), &[]);
    let (status, out) = s.deploy("acme", "ledger", guest("ledger")).await;
    assert!(status == 200 || status == 201, "{out}");
    let (status, out) = s.post(&format!("{S}:append"), wake()).await;
    assert_eq!(status, 200, "{out}");
    s
}

fn enc(key: &str) -> String {
    key.replace('/', "%2F")
}

async fn balance(s: &Server, account: &str) -> (u16, Value) {
    s.get(&format!(
        "{S}:processors/ledger/keys/{}",
        enc(&format!("balance/{account}"))
    ))
    .await
}

/// Every key and value the API pages out, with `limit`.
async fn all_keys(s: &Server, prefix: &str, limit: usize) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!(
            "{S}:processors/ledger/keys?prefix={}&limit={limit}",
            enc(prefix)
        );
        if let Some(a) = &after {
            url.push_str(&format!("&after={}", enc(a)));
        }
        let (status, page) = s.get(&url).await;
        assert_eq!(status, 200, "{page}");
        let keys = page["keys"].as_array().unwrap();
        assert!(keys.len() <= limit, "{page}");
        for k in keys {
            out.push((k["key"].as_str().unwrap().to_string(), k["value"].clone()));
        }
        match page["nextAfter"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return out,
        }
    }
}

#[tokio::test]
async fn a_ledger_keeps_a_balance_per_account_readable_through_the_api() {
    let s = ledger().await;
    append(
        &s,
        json!([
            deposit("a", 100),
            deposit("b", 250),
            deposit("a", 50),
            deposit("c/x", 1)
        ]),
    )
    .await;
    append(&s, json!([withdraw("b", 200)])).await;
    let p = caught_up(&s, S, "ledger").await;
    assert_eq!(p["state"]["accounts"], 3, "{p}");
    assert_eq!(p["state"]["totalCents"], 201, "{p}");

    assert_eq!(
        balance(&s, "a").await,
        (200, json!({"key": "balance/a", "value": "150"}))
    );
    assert_eq!(balance(&s, "b").await.1["value"], "50");
    assert_eq!(balance(&s, "c/x").await.1["value"], "1");
    assert_error(
        &balance(&s, "nobody").await,
        404,
        "key-not-found",
        "balance/nobody",
    );

    // Paging: every key once, in byte order, whatever the page size.
    let one_by_one = all_keys(&s, "balance/", 1).await;
    assert_eq!(
        one_by_one,
        vec![
            ("balance/a".to_string(), json!("150")),
            ("balance/b".to_string(), json!("50")),
            ("balance/c/x".to_string(), json!("1")),
        ]
    );
    assert_eq!(all_keys(&s, "", 100).await, one_by_one);
    assert_eq!(all_keys(&s, "balance/b", 100).await.len(), 1);
    assert!(all_keys(&s, "memo/", 100).await.is_empty());

    for bad in ["limit=0", "limit=1001", "limit=x", "colour=red"] {
        let answer = s.get(&format!("{S}:processors/ledger/keys?{bad}")).await;
        assert_eq!(answer.0, 400, "{bad}: {}", answer.1);
        assert!(
            answer.1["error"]["message"]
                .as_str()
                .unwrap()
                .contains(bad.split('=').next().unwrap()),
            "{bad}: {}",
            answer.1
        );
    }
    assert_error(
        &s.get(&format!("{S}:processors/nobody/keys")).await,
        404,
        "processor-not-found",
        "nobody",
    );

    // The CLI reads the same.
    let (ok, out, err) = run_cli(&[
        "keys",
        S_PATH,
        "ledger",
        "--prefix",
        "balance/",
        "--url",
        &s.url,
        "--project",
        "acme",
    ]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["keys"].as_array().unwrap().len(), 3, "{listed}");
    let (ok, out, err) = run_cli(&[
        "keys",
        S_PATH,
        "ledger",
        "--key",
        "balance/a",
        "--url",
        &s.url,
        "--project",
        "acme",
    ]);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["value"], "150");
}

const S_PATH: &str = "/bank";

#[tokio::test]
async fn a_failing_fold_commits_none_of_its_writes_and_its_repro_seeds_what_it_read() {
    let s = ledger().await;
    append(&s, json!([deposit("b", 100)])).await;
    caught_up(&s, S, "ledger").await;
    // One batch: the deposit to a is written, then the withdrawal fails.
    append(&s, json!([deposit("a", 50), withdraw("b", 500)])).await;
    s.wait_halted(S, "ledger", Duration::from_secs(30)).await;
    assert_error(&balance(&s, "a").await, 404, "key-not-found", "balance/a");
    assert_eq!(balance(&s, "b").await.1["value"], "100");
    let (_, p) = s.get(&format!("{S}:processors/ledger")).await;
    let failure = &p["lastFailure"];
    assert!(
        failure["message"].as_str().unwrap().contains("leaves -400"),
        "{failure}"
    );
    let repro = failure["repro"].as_str().unwrap();
    assert!(repro.starts_with("wasmtime run -S keyvalue "), "{repro}");
    assert!(
        repro.contains("-S 'keyvalue-in-memory-data=balance/b=100'"),
        "the key the call read from the bucket, with its value: {repro}"
    );
    // And it reproduces the failure under the plain wasmtime CLI: the
    // seeded balance is what makes the withdrawal fail.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ledger.wasm"), guest("ledger")).unwrap();
    let (_, printed) = crate::support::run_repro(repro, dir.path());
    assert!(
        printed.contains("err(") && printed.contains("leaves -400"),
        "{repro}\n{printed}"
    );
    assert!(
        !repro.contains("keyvalue-in-memory-data=balance/a"),
        "a key the call wrote first is not seeded: {repro}"
    );
    assert_eq!(p["state"]["totalCents"], 100, "{p}");
}

#[tokio::test]
async fn verify_compares_every_key_and_names_the_first_that_differs() {
    let s = ledger().await;
    append(
        &s,
        json!([deposit("a", 1), deposit("b", 2), deposit("c", 3)]),
    )
    .await;
    append(
        &s,
        json!([{"type": "noted", "payload": {"account": "a", "memo": "first"}}]),
    )
    .await;
    caught_up(&s, S, "ledger").await;
    let (status, v) = s
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "ledger"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["matches"], true, "{v}");
    assert_eq!(v["keysCompared"], 4, "{v}");

    // Change one stored value and add a key behind the processor's back.
    let db = s.db();
    db.execute(if db.is_postgres() {
        "UPDATE processor_keys SET value = convert_to('99', 'UTF8') WHERE key = 'balance/b'"
    } else {
        "UPDATE processor_keys SET value = CAST('99' AS BLOB) WHERE key = 'balance/b'"
    });
    let (_, v) = s
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "ledger"}),
        )
        .await;
    assert_eq!(v["matches"], false, "{v}");
    assert_eq!(
        v["storedState"], v["refoldedState"],
        "the JSON state agrees: {v}"
    );
    assert_eq!(
        v["firstDifferingKey"],
        json!({"key": "balance/b", "stored": "99", "refolded": "2"}),
        "{v}"
    );
    assert_eq!(v["keysCompared"], 4, "{v}");

    // A key the refold has and storage lost comes first when it sorts first.
    db.execute("DELETE FROM processor_keys WHERE key = 'balance/a'");
    let (_, v) = s
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "ledger"}),
        )
        .await;
    assert_eq!(
        v["firstDifferingKey"],
        json!({"key": "balance/a", "stored": null, "refolded": "1"}),
        "{v}"
    );
    assert_eq!(v["keysCompared"], 4, "{v}");
}

#[tokio::test]
async fn a_reset_clears_the_bucket_and_the_new_lifetime_starts_empty() {
    let s = ledger().await;
    append(&s, json!([deposit("old", 7)])).await;
    caught_up(&s, S, "ledger").await;
    let db = s.db();
    let old_bucket = db
        .query_i64("SELECT bucket FROM processor_checkpoints WHERE component = 'ledger'")
        .unwrap();
    let (status, _) = s.post(&format!("{S}:reset"), json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(
        db.query_i64(&format!(
            "SELECT count(*) FROM processor_keys WHERE bucket = {old_bucket}"
        )),
        Some(0),
        "the reset deleted the old bucket's rows"
    );
    let (status, out) = s.post(&format!("{S}:append"), wake()).await;
    assert_eq!(status, 200, "{out}");
    append(&s, json!([deposit("new", 1)])).await;
    caught_up(&s, S, "ledger").await;
    assert_eq!(
        all_keys(&s, "", 10).await,
        vec![("balance/new".to_string(), json!("1"))]
    );
}

/// Deploys `bytes` as the ledger with `?refold=true` and waits (up to a
/// minute) until the instance switched to it.
async fn refold(s: &Server, bytes: Vec<u8>) {
    let (status, out) = s
        .deploy_with_query("acme", "ledger", bytes, "refold=true")
        .await;
    assert!(status == 200 || status == 201, "{out}");
    let digest = out["digest"].as_str().unwrap().to_string();
    wait_for("the refold's switch", Duration::from_secs(60), async || {
        let (_, p) = s.get(&format!("{S}:processors/ledger")).await;
        p["digest"] == digest.as_str()
    })
    .await;
}

/// The same component with one more custom section: a new digest, the
/// same code.
fn another_version(bytes: Vec<u8>) -> Vec<u8> {
    crate::support::component_version(bytes, 2)
}

#[tokio::test]
async fn a_refold_builds_a_new_bucket_and_switches_to_it_with_the_state() {
    let s = ledger().await;
    append(
        &s,
        json!([deposit("a", 5), deposit("b", 6), withdraw("a", 2)]),
    )
    .await;
    let before = caught_up(&s, S, "ledger").await;
    let db = s.db();
    let bucket = || {
        db.query_i64("SELECT bucket FROM processor_checkpoints WHERE component = 'ledger'")
            .unwrap()
    };
    let old_bucket = bucket();
    let keys_before = all_keys(&s, "", 100).await;
    refold(&s, another_version(guest("ledger"))).await;
    assert_ne!(
        bucket(),
        old_bucket,
        "the switch moved to the refold's bucket"
    );
    assert_eq!(
        db.query_i64(&format!(
            "SELECT count(*) FROM processor_keys WHERE bucket = {old_bucket}"
        )),
        Some(0),
        "the old bucket's rows went with the switch"
    );
    assert_eq!(all_keys(&s, "", 100).await, keys_before);
    let (_, after) = s.get(&format!("{S}:processors/ledger")).await;
    assert_eq!(after["state"], before["state"]);
    // And the new version goes on from there.
    append(&s, json!([deposit("a", 10)])).await;
    caught_up(&s, S, "ledger").await;
    assert_eq!(balance(&s, "a").await.1["value"], "13");
}

#[tokio::test]
async fn keys_and_values_over_their_limits_halt_the_processor_naming_the_size() {
    let s = ledger().await;
    let long = "k".repeat(1100);
    append(&s, json!([deposit(&long, 1)])).await;
    let halted = s.wait_halted(S, "ledger", Duration::from_secs(30)).await;
    let text = halted.to_string();
    assert!(
        text.contains("1108 bytes, over the 1024-byte key limit"),
        "the key is balance/ + 1100 bytes: {text}"
    );

    let s = ledger().await;
    let memo = "m".repeat(1024 * 1024 + 10);
    append(
        &s,
        json!([{"type": "noted", "payload": {"account": "a", "memo": memo}}]),
    )
    .await;
    let halted = s.wait_halted(S, "ledger", Duration::from_secs(30)).await;
    let text = halted.to_string();
    assert!(
        text.contains("\\\"memo/a\\\" is 1048588 bytes, over the 1048576-byte value limit")
            || text.contains("\"memo/a\" is 1048588 bytes, over the 1048576-byte value limit"),
        "the value is the memo as JSON text: {text}"
    );
    assert_error(
        &s.get(&format!("{S}:processors/ledger/keys/memo%2Fa")).await,
        404,
        "key-not-found",
        "memo/a",
    );

    // A NUL in a key is refused the same on both engines, never passed to
    // the database: the processor halts naming it, and a read is a 400.
    let s = ledger().await;
    append(&s, json!([deposit("a\u{0}b", 1)])).await;
    let halted = s.wait_halted(S, "ledger", Duration::from_secs(30)).await;
    let text = halted.to_string();
    assert!(text.contains("holds a NUL byte"), "{text}");
    assert_error(
        &s.get(&format!("{S}:processors/ledger/keys/balance%2Fa%00b"))
            .await,
        400,
        "invalid-request",
        "NUL",
    );
    assert_error(
        &s.get(&format!("{S}:processors/ledger/keys?prefix=a%00"))
            .await,
        400,
        "invalid-request",
        "NUL",
    );
}

#[tokio::test]
async fn a_key_listing_is_bounded_in_bytes_and_next_after_continues_it() {
    const BOUND: usize = 100_000;
    let config = format!("{PROC}\n[limits]\nmax-read-bytes = {BOUND}\n");
    let s = Server::start_with(Some(&config), &[]);
    let (status, out) = s.deploy("acme", "ledger", guest("ledger")).await;
    assert!(status == 200 || status == 201, "{out}");
    append(&s, json!([wake()["events"][0]])).await;
    let memo = "m".repeat(30_000);
    let notes: Vec<Value> = (0..10)
        .map(|n| json!({"type": "noted", "payload": {"account": format!("a{n}"), "memo": memo}}))
        .collect();
    append(&s, json!(notes)).await;
    caught_up(&s, S, "ledger").await;
    // One page of 1000 would hold 300 KB: it stops at the key reaching 100 KB.
    let (mut after, mut keys, mut pages) = (String::new(), Vec::new(), 0);
    loop {
        let (status, page) = s
            .get(&format!(
                "{S}:processors/ledger/keys?prefix=memo%2F&limit=1000&after={}",
                enc(&after)
            ))
            .await;
        assert_eq!(status, 200, "{page}");
        let listed = page["keys"].as_array().unwrap();
        let sizes: Vec<usize> = listed
            .iter()
            .map(|k| k["key"].as_str().unwrap().len() + k["value"].to_string().len())
            .collect();
        assert!(
            sizes[..sizes.len().saturating_sub(1)].iter().sum::<usize>() < BOUND,
            "a page of {sizes:?}"
        );
        pages += 1;
        keys.extend(
            listed
                .iter()
                .map(|k| k["key"].as_str().unwrap().to_string()),
        );
        match page["nextAfter"].as_str() {
            Some(next) => after = next.to_string(),
            None => break,
        }
    }
    let expected: Vec<String> = (0..10).map(|n| format!("memo/a{n}")).collect();
    assert_eq!(keys, expected);
    assert!(
        pages >= 3,
        "300 KB of keys in pages of 100 KB: {pages} pages"
    );
}

#[tokio::test]
async fn the_offline_fold_sees_what_the_wake_saw_given_the_keys() {
    let s = ledger().await;
    let first = json!([deposit("a", 10), deposit("b", 20)]);
    let second = json!([withdraw("a", 3), deposit("c", 1),
        {"type": "audited", "payload": {"prefix": ""}}]);
    append(&s, first.clone()).await;
    let mid = caught_up(&s, S, "ledger").await;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let lines: Vec<String> = second
        .as_array()
        .unwrap()
        .iter()
        .map(Value::to_string)
        .collect();
    std::fs::write(&events, lines.join("\n")).unwrap();
    let wasm = dir.path().join("ledger.wasm");
    std::fs::write(&wasm, guest("ledger")).unwrap();
    // From the server's own data dir (SQLite), read while it runs: the
    // instance's state and keys at its checkpoint.
    let from_data_dir = (!s.db().is_postgres()).then(|| {
        let (ok, out, err) = run_cli(&[
            "fold",
            wasm.to_str().unwrap(),
            "--events",
            events.to_str().unwrap(),
            "--data-dir",
            s.data_dir().to_str().unwrap(),
            "--project",
            "acme",
            "--stream",
            S_PATH,
        ]);
        assert!(ok, "{err}");
        assert!(err.contains("2 keys"), "{err}");
        serde_json::from_str::<Value>(&out).unwrap()
    });
    append(&s, second.clone()).await;
    let end = caught_up(&s, S, "ledger").await;
    assert_eq!(end["state"]["audited"], 28, "{end}");
    if let Some(state) = from_data_dir {
        assert_eq!(state, end["state"], "the offline fold from the data dir");
    }

    // The keys after the first append, as the CLI lists them, are the start
    // of an offline fold of the second: it ends where the server did.
    let mid_keys = json!({"keys": [
        {"key": "balance/a", "value": "10"}, {"key": "balance/b", "value": "20"}]});
    let keys_in = dir.path().join("keys.json");
    std::fs::write(&keys_in, mid_keys.to_string()).unwrap();
    let state_in = dir.path().join("state.json");
    std::fs::write(&state_in, mid["state"].to_string()).unwrap();
    let keys_out = dir.path().join("out.json");
    let (ok, out, err) = run_cli(&[
        "fold",
        wasm.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
        "--state",
        state_in.to_str().unwrap(),
        "--keys",
        keys_in.to_str().unwrap(),
        "--keys-out",
        keys_out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let state: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(state["audited"], 28, "{out}");
    assert_eq!(state["totalCents"], end["state"]["totalCents"], "{out}");
    let offline: Value =
        serde_json::from_str(&std::fs::read_to_string(&keys_out).unwrap()).unwrap();
    let online: Vec<Value> = all_keys(&s, "", 100)
        .await
        .into_iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    assert_eq!(offline["keys"], json!(online));

    // A keys file that does not fit is named.
    std::fs::write(&keys_in, r#"{"balance/a": 5}"#).unwrap();
    let (ok, _, err) = run_cli(&[
        "fold",
        wasm.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
        "--keys",
        keys_in.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("key \"balance/a\"") && err.contains("keys.json"),
        "{err}"
    );
}

#[tokio::test]
async fn keyed_state_survives_a_restart_and_json_state_processors_keep_no_bucket_rows() {
    let mut s = ledger().await;
    append(&s, json!([deposit("a", 1)])).await;
    caught_up(&s, S, "ledger").await;
    s.restart();
    append(&s, json!([deposit("a", 2)])).await;
    caught_up(&s, S, "ledger").await;
    assert_eq!(balance(&s, "a").await.1["value"], "3");
    // A JSON-state processor beside it: its checkpoint has a bucket, no rows.
    s.deploy("acme", "counter", guest("counter")).await;
    let wake_counter = json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "count",
            "receiver": {"action": "processor-wake",
                "expression": ["components", ["get", "counter"], "wake"]}}}]});
    s.post(&format!("{S}:append"), wake_counter).await;
    append(&s, json!([deposit("a", 1)])).await;
    caught_up(&s, S, "counter").await;
    let db = s.db();
    assert_eq!(
        db.query_i64(
            "SELECT count(*) FROM processor_keys WHERE bucket =
               (SELECT bucket FROM processor_checkpoints WHERE component = 'counter')"
        ),
        Some(0)
    );
    let (status, page) = s.get(&format!("{S}:processors/counter/keys")).await;
    assert_eq!(
        (status, page),
        (200, json!({"keys": [], "nextAfter": null}))
    );
}

/// The `wasmtime` CLI: `STREAMHOST_WASMTIME`, else `wasmtime` on the PATH.
fn wasmtime_cli() -> Option<String> {
    if let Ok(path) = std::env::var("STREAMHOST_WASMTIME") {
        return Some(path);
    }
    let found = std::process::Command::new("wasmtime")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    found.then(|| "wasmtime".to_string())
}

/// Runs with the real `wasmtime` CLI (built with `wasi-keyvalue`): set
/// `STREAMHOST_WASMTIME` or put `wasmtime` on the PATH; without it the test
/// says so and checks nothing (CI does not build the CLI).
#[tokio::test]
async fn the_repro_of_a_keyed_fold_fails_the_same_way_under_the_wasmtime_cli() {
    let Some(cli) = wasmtime_cli() else {
        eprintln!("no wasmtime CLI (STREAMHOST_WASMTIME or PATH): the repro was not run");
        return;
    };
    let s = ledger().await;
    append(&s, json!([deposit("b", 100)])).await;
    caught_up(&s, S, "ledger").await;
    append(&s, json!([deposit("a", 50), withdraw("b", 500)])).await;
    s.wait_halted(S, "ledger", Duration::from_secs(30)).await;
    let (_, p) = s.get(&format!("{S}:processors/ledger")).await;
    let repro = p["lastFailure"]["repro"].as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("ledger.wasm");
    std::fs::write(&wasm, guest("ledger")).unwrap();
    let command = repro
        .strip_prefix("wasmtime ")
        .unwrap()
        .replace(" ledger.wasm", &format!(" {}", wasm.display()));
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cli} {command}"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 100 seeded - 500: without the seed the CLI would say -500.
    assert!(
        stdout.contains("leaves -400") && stdout.starts_with("err("),
        "{stdout}"
    );
}

/// Grows the ledger by `count` accounts from `from`, `per_event` per wake.
async fn import(s: &Server, from: u64, count: u64, per_event: u64) {
    let mut at = from;
    while at < from + count {
        let n = per_event.min(from + count - at);
        append(
            s,
            json!([{"type": "imported", "payload": {"from": at, "count": n, "cents": 100}}]),
        )
        .await;
        caught_up(s, S, "ledger").await;
        at += n;
    }
}

#[tokio::test]
async fn memory_stays_flat_while_a_processor_grows_to_millions_of_keys() {
    // 20,000 new keys a wake (a wake stays well inside its deadline on a
    // loaded machine). On PostgreSQL the same with fewer keys (its upserts are slower; the
    // bound under test is the host's, not the database's).
    let (warm, total) = if crate::support::postgres_base().is_some() {
        (100_000, 400_000)
    } else {
        (200_000, 2_000_000)
    };
    let config = PROC.replace(
        "[processors]\nidle-teardown-ms = 300\n",
        "[processors]\nidle-teardown-ms = 300\nkeyed-cache-bytes = 8388608\n",
    );
    let s = Server::start_with(Some(&config), &["--durability", "normal"]);
    s.deploy("acme", "ledger", guest("ledger")).await;
    s.post(&format!("{S}:append"), wake()).await;
    import(&s, 0, warm, 20_000).await;
    let baseline = s.rss_bytes();
    import(&s, warm, total - warm, 20_000).await;
    // Wakes that touch a few accounts spread over the whole bucket.
    for i in 0..20u64 {
        append(
            &s,
            json!([deposit(&format!("acct-{}", i * 99_991 % total), 1)]),
        )
        .await;
    }
    let p = caught_up(&s, S, "ledger").await;
    assert_eq!(p["state"]["accounts"], total, "{p}");
    let grown = s.rss_bytes();
    let db = s.db();
    assert_eq!(
        db.query_i64("SELECT count(*) FROM processor_keys"),
        Some(total as i64)
    );
    assert_eq!(
        balance(&s, &format!("acct-{}", total - 1)).await.1["value"],
        "100"
    );
    println!(
        "RSS after {warm} keys {} MiB, after {total} keys {} MiB",
        baseline / (1 << 20),
        grown / (1 << 20)
    );
    assert!(
        grown < baseline + 48 * (1 << 20),
        "RSS grew from {baseline} to {grown} bytes while the bucket grew {}x",
        total / warm
    );
}

#[tokio::test]
async fn a_backfill_folds_with_a_scratch_bucket_and_leaves_the_instances_keys_alone() {
    let s = ledger().await;
    append(&s, json!([deposit("b", 100)])).await;
    append(&s, json!([withdraw("b", 60)])).await;
    caught_up(&s, S, "ledger").await;
    let keys_before = all_keys(&s, "", 100).await;
    // From offset 0 the backfill's fold sees its own deposit before the
    // withdrawal, as the wakes did.
    let (status, out) = s
        .post(
            &format!("{S}:backfillProcessor"),
            json!({"component": "ledger"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["folded"], 2, "{out}");
    // Started after the deposit, it starts from an empty bucket, as from
    // the initial state: the withdrawal finds nothing to withdraw from.
    let deposit_at = s
        .all_events(S)
        .await
        .iter()
        .find(|e| e["type"] == "deposited")
        .unwrap()["offset"]
        .as_u64()
        .unwrap();
    let answer = s
        .post(
            &format!("{S}:backfillProcessor"),
            json!({"component": "ledger", "afterOffset": deposit_at}),
        )
        .await;
    assert_eq!(answer.0, 422, "{}", answer.1);
    assert!(answer.1.to_string().contains("leaves -60"), "{}", answer.1);
    assert_eq!(
        all_keys(&s, "", 100).await,
        keys_before,
        "backfills write no keys"
    );
}

#[tokio::test]
async fn the_state_at_any_offset_is_folded_on_demand_keys_included_and_stored_nowhere() {
    let s = ledger().await;
    let (_, created) = s.get(&format!("{S}:state")).await;
    let base = created["maxOffset"].as_u64().unwrap();
    append(&s, json!([deposit("a", 100), deposit("b", 250)])).await;
    append(&s, json!([deposit("a", 50), withdraw("b", 200)])).await;
    let live = caught_up(&s, S, "ledger").await;
    let s = &s;
    let at = async |offset: u64, query: &str| {
        s.get(&format!("{S}:processors/ledger/at/{offset}{query}"))
            .await
    };
    // After the first two deposits: a=100, b=250.
    let (status, two) = at(base + 2, "?keys=balance/").await;
    assert_eq!(status, 200, "{two}");
    assert_eq!(two["offset"], base + 2, "{two}");
    assert_eq!(two["state"]["totalCents"], 350, "{two}");
    assert_eq!(
        two["keys"],
        json!([{"key": "balance/a", "value": "100"}, {"key": "balance/b", "value": "250"}])
    );
    assert_eq!(
        two["digest"], live["digest"],
        "the deployed version folds it"
    );
    // At the head it is the live state; without `keys` no keys are listed.
    let (_, head) = at(base + 4, "").await;
    assert_eq!(head["state"], live["state"], "{head}");
    assert!(head.get("keys").is_none(), "{head}");
    // Before any of the ledger's events: its initial state, no keys.
    let (_, zero) = at(0, "?keys=").await;
    assert_eq!(zero["state"]["totalCents"], 0, "{zero}");
    assert_eq!(zero["keys"], json!([]));
    // Stored nowhere: the live instance did not move.
    let (_, after) = s.get(&format!("{S}:processors/ledger")).await;
    assert_eq!(after["checkpointOffset"], live["checkpointOffset"]);
    assert_eq!(after["state"], live["state"]);
    assert_eq!(balance(s, "a").await.1["value"], "150");

    assert_error(&at(base + 99, "").await, 400, "invalid-request", "beyond");
    assert_error(
        &at(1, "?colour=red").await,
        400,
        "invalid-request",
        "colour",
    );
    assert_error(
        &s.get(&format!("{S}:processors/ledger/at/x")).await,
        400,
        "invalid-request",
        "\"x\"",
    );
    assert_error(
        &s.get(&format!("{S}:processors/nope/at/1")).await,
        404,
        "processor-not-found",
        "nope",
    );
}

/// A shadow, a refold and a verification of a processor with 100 MiB of
/// keyed state (3,200 memos of 32 KiB) keep what they fold in storage as
/// they fold (a scratch bucket), not in the server's memory: each raises
/// the server's peak memory by a bounded part of it (its spills of 8
/// MiB), where a fold holding its writes in memory raised it by all of
/// them and more. The
/// shadow's keys diff streams both stored buckets; its promotion and the
/// refold's switch adopt the bucket the fold wrote, the old one's rows go.
#[tokio::test]
async fn a_shadow_a_refold_and_verify_keep_a_large_keyed_state_in_storage_not_in_memory() {
    if crate::support::skipped_on_postgres(
        "the memory bounded is the server's; the scratch bucket's rows on PostgreSQL are the \
         other shadow, refold and verify tests'",
    ) {
        return;
    }
    let (memos, memo_bytes) = (3200usize, 32 * 1024);
    let s = ledger().await;
    let memo = "m".repeat(memo_bytes - 16);
    for chunk in 0..memos / 10 {
        let events: Vec<Value> = (0..10)
            .map(|i| {
                json!({"type": "noted",
                       "payload": {"account": format!("a-{}", chunk * 10 + i), "memo": memo}})
            })
            .collect();
        append(&s, Value::Array(events)).await;
    }
    caught_up(&s, S, "ledger").await;
    let db = s.db();
    let count = |sql: &str| db.query_i64(sql).unwrap();
    let scratch_rows =
        "SELECT count(*) FROM processor_keys WHERE bucket IN (SELECT bucket FROM scratch_buckets)";
    assert_eq!(count("SELECT count(*) FROM processor_keys"), memos as i64);
    let peak_before = s.peak_rss_bytes();

    let (status, out) = s
        .deploy_with_query(
            "acme",
            "ledger",
            crate::support::component_version(guest("ledger"), 2),
            "refold=shadow",
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let view = crate::support::shadow_ready(&s, S, "ledger").await;
    // The shadow's keys are rows in storage, and equal the live ones (the
    // same code folded them): the diff read both buckets.
    assert_eq!(count(scratch_rows), memos as i64);
    assert_eq!(
        view["keysDiff"],
        json!({"added": 0, "removed": 0, "changed": 0, "sample": []}),
        "{view}"
    );
    let peak_shadow = s.peak_rss_bytes();
    let (status, out) = s
        .post(
            &format!("{S}:promoteShadow"),
            json!({"component": "ledger"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    // The instance's bucket is the one the shadow wrote; the old one's
    // rows went in the same write.
    assert_eq!(count("SELECT count(*) FROM scratch_buckets"), 0);
    assert_eq!(count("SELECT count(*) FROM processor_keys"), memos as i64);
    let (status, key) = s
        .get(&format!("{S}:processors/ledger/keys/memo%2Fa-3199"))
        .await;
    assert_eq!(status, 200);
    // (The memo as the guest stored it: JSON text.)
    assert!(key["value"] == json!(format!("\"{memo}\"")), "memo/a-3199");

    refold(&s, crate::support::component_version(guest("ledger"), 3)).await;
    assert_eq!(count("SELECT count(*) FROM scratch_buckets"), 0);
    assert_eq!(count("SELECT count(*) FROM processor_keys"), memos as i64);
    let peak_refold = s.peak_rss_bytes();
    let (status, v) = s
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "ledger"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["matches"], true, "{v}");
    let peak_verify = s.peak_rss_bytes();
    // Verify folded into a scratch bucket of its own, dropped after it.
    wait_for(
        "verify's scratch bucket to go",
        Duration::from_secs(10),
        async || {
            count("SELECT count(*) FROM scratch_buckets") == 0
                && count("SELECT count(*) FROM processor_keys") == memos as i64
        },
    )
    .await;
    let mib = |b: u64| b / (1 << 20);
    println!(
        "peak RSS before {} MiB, after the shadow {} MiB, after the refold {} MiB, after verify {} MiB ({} MiB of keys)",
        mib(peak_before),
        mib(peak_shadow),
        mib(peak_refold),
        mib(peak_verify),
        memos * memo_bytes / (1 << 20)
    );
    // Each fold raises the peak by a bounded part of the keys (its spills,
    // a batch of events, the allocator's arenas), not by all of them.
    let peaks = [
        ("shadow", peak_before, peak_shadow),
        ("refold", peak_shadow, peak_refold),
        ("verify", peak_refold, peak_verify),
    ];
    for (fold, from, to) in peaks {
        assert!(
            to < from + 48 * (1 << 20),
            "folding 100 MiB of keys ({fold}) raised the server's peak memory from {} to {} MiB",
            mib(from),
            mib(to)
        );
    }
}

/// A shadow's scratch bucket ends with it: a discard drops its rows; a
/// restart (after a SIGKILL) folds the shadow again into a new bucket that
/// replaces the one the killed process left; and at start a scratch
/// bucket no pending shadow or refold can resume is dropped.
#[tokio::test]
async fn a_shadows_scratch_bucket_goes_when_it_is_discarded_replaced_or_left_behind() {
    let mut s = ledger().await;
    append(
        &s,
        json!([deposit("a", 1), deposit("b", 2), deposit("c", 3)]),
    )
    .await;
    caught_up(&s, S, "ledger").await;
    let db = s.db();
    let count = |sql: &str| db.query_i64(sql).unwrap();
    let scratch_rows =
        "SELECT count(*) FROM processor_keys WHERE bucket IN (SELECT bucket FROM scratch_buckets)";
    let shadow = async |s: &Server, version: u8| {
        let (status, out) = s
            .deploy_with_query(
                "acme",
                "ledger",
                crate::support::component_version(guest("ledger"), version),
                "refold=shadow",
            )
            .await;
        assert_eq!(status, 200, "{out}");
        crate::support::shadow_ready(s, S, "ledger").await
    };

    shadow(&s, 2).await;
    assert_eq!(count(scratch_rows), 3);
    let (status, out) = s
        .post(
            &format!("{S}:discardShadow"),
            json!({"component": "ledger"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    wait_for(
        "the discarded shadow's keys to go",
        Duration::from_secs(10),
        async || count("SELECT count(*) FROM scratch_buckets") == 0,
    )
    .await;
    assert_eq!(
        count("SELECT count(*) FROM processor_keys"),
        3,
        "the live keys stay"
    );

    shadow(&s, 3).await;
    let killed_bucket = count("SELECT bucket FROM scratch_buckets");
    s.kill();
    // And a scratch bucket of a fold no pending record names (a refold of
    // a version since replaced).
    db.execute(
        "INSERT INTO scratch_buckets (bucket, project, path, component, digest, purpose)
         VALUES (77, 'acme', '/bank', 'ledger', 'sha256:gone', 'refold');
         INSERT INTO processor_keys (bucket, key, value) VALUES (77, 'balance/z', 'x')",
    );
    s.restart();
    let view = crate::support::shadow_ready(&s, S, "ledger").await;
    assert_eq!(view["keysDiff"]["changed"], 0, "{view}");
    assert_eq!(view["keysDiff"]["added"], 0, "{view}");
    wait_for(
        "the left scratch buckets to go",
        Duration::from_secs(10),
        async || {
            count("SELECT count(*) FROM scratch_buckets") == 1
                && count("SELECT count(*) FROM processor_keys WHERE bucket = 77") == 0
        },
    )
    .await;
    let bucket = count("SELECT bucket FROM scratch_buckets");
    assert_ne!(
        bucket, killed_bucket,
        "the shadow folded again into a new bucket"
    );
    assert_eq!(
        count(&format!(
            "SELECT count(*) FROM processor_keys WHERE bucket = {killed_bucket}"
        )),
        0
    );
    assert_eq!(count(scratch_rows), 3);
}

/// The state at an offset at or after the instance's checkpoint goes on
/// from the checkpoint (its state, and its keys as they were at it), not
/// from the start: once an event the ledger folded is redacted, a fold from
/// the start fails on it (the ledger reads every deposit's payload), while
/// the state at the checkpoint is served; before the checkpoint the fold
/// is from the start, as before.
#[tokio::test]
async fn the_state_at_the_checkpoint_goes_on_from_it_not_from_the_start() {
    let s = ledger().await;
    let (_, created) = s.get(&format!("{S}:state")).await;
    let base = created["maxOffset"].as_u64().unwrap();
    append(&s, json!([deposit("a", 100)])).await;
    append(&s, json!([deposit("b", 7)])).await;
    caught_up(&s, S, "ledger").await;
    let (status, out) = s
        .post(
            &format!("{S}:redact"),
            json!({"offset": base + 1, "reason": "test"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let live = caught_up(&s, S, "ledger").await;
    let checkpoint = live["checkpointOffset"].as_u64().unwrap();
    assert!(checkpoint > base + 2, "{live}");
    let at = async |offset: u64| {
        s.get(&format!("{S}:processors/ledger/at/{offset}?keys=balance/"))
            .await
    };
    let (status, v) = at(checkpoint).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], live["state"], "{v}");
    assert_eq!(
        v["keys"],
        json!([{"key": "balance/a", "value": "100"}, {"key": "balance/b", "value": "7"}])
    );
    // Before the checkpoint: from the start, which meets the redaction.
    assert_error(&at(base + 2).await, 422, "processor-failed", "redact");
}
