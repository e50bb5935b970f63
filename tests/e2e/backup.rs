//! Backup and restore: `streamhost backup --to FILE` from a running
//! server while appends go on, `streamhost restore`, and what both refuse.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::processors::{caught_up, PROC};
use crate::support::{assert_error, guest, postgres_base, run_cli, wait_for, Server, TOKENS};

const S: &str = "/v1/projects/acme/streams/orders";

/// Appends one order with key `key` (and 1 KiB of payload); whether it was
/// acknowledged.
async fn order(client: &reqwest::Client, url: &str, key: &str) -> bool {
    let event = json!({"type": "events.example/order", "idempotencyKey": key,
        "payload": {"n": 1, "note": "x".repeat(1024)}});
    client
        .post(format!("{url}{S}:append"))
        .json(&json!({"events": [event]}))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

#[tokio::test]
async fn a_backup_taken_under_load_restores_every_acknowledged_event_and_its_processor_verifies() {
    let server = Server::start_with(Some(PROC), &[]);
    if postgres_base().is_some() {
        // PostgreSQL's own tools back that log up.
        assert_error(
            &server.get("/v1/backup").await,
            409,
            "backup-unavailable",
            "pg_dump",
        );
        return;
    }
    let (status, out) = server.deploy("acme", "counter", guest("counter")).await;
    assert_eq!(status, 200, "{out}");
    let wake = json!({"type": "events.iterate.com/stream/subscription-configured",
        "payload": {"subscriptionKey": "counter",
            "receiver": {"action": "processor-wake", "expression": ["components", ["get", "counter"], "wake"]}}});
    let (status, out) = server
        .post(&format!("{S}:append"), json!({"events": [wake]}))
        .await;
    assert_eq!(status, 200, "{out}");
    // Some size first (about 8 MiB), so the copy takes a while.
    let client = reqwest::Client::new();
    for batch in 0..16 {
        let events: Vec<Value> = (0..500)
            .map(|i| {
                json!({"type": "events.example/order", "idempotencyKey": format!("pre-{batch}-{i}"),
                "payload": {"n": 1, "note": "x".repeat(1024)}})
            })
            .collect();
        let (status, out) = server
            .post(&format!("{S}:append"), json!({"events": events}))
            .await;
        assert_eq!(status, 200, "{out}");
    }
    // Four writers go on appending, each recording what was acknowledged.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (acked, stop, client, url) = (
                acked.clone(),
                stop.clone(),
                client.clone(),
                server.url.clone(),
            );
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w{w}-{n}");
                    if order(&client, &url, &key).await {
                        acked.lock().unwrap().push(key);
                    }
                    n += 1;
                }
            })
        })
        .collect();
    wait_for("appends under way", Duration::from_secs(20), async || {
        acked.lock().unwrap().len() >= 40
    })
    .await;
    let before: Vec<String> = acked.lock().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orders.db");
    let during = Arc::new(AtomicUsize::new(0));
    let (ok, out, err) = {
        let (file, url) = (file.clone(), server.url.clone());
        tokio::task::spawn_blocking(move || {
            run_cli(&["backup", "--to", file.to_str().unwrap(), "--url", &url])
        })
        .await
        .unwrap()
    };
    during.store(
        acked.lock().unwrap().len() - before.len(),
        Ordering::Relaxed,
    );
    assert!(ok, "{err}");
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["file"], json!(file.display().to_string()));
    assert!(summary["events"].as_u64().unwrap() > 8000, "{summary}");
    assert_eq!(
        summary["bytes"].as_u64().unwrap(),
        std::fs::metadata(&file).unwrap().len()
    );
    // Writes went on while the copy was taken, and after it.
    wait_for(
        "appends after the backup",
        Duration::from_secs(20),
        async || acked.lock().unwrap().len() >= before.len() + during.load(Ordering::Relaxed) + 20,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    assert!(
        during.load(Ordering::Relaxed) > 0,
        "no append was acknowledged while the backup ran"
    );
    // Nothing but the backup is left beside it.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["orders.db".to_string()]);

    let restored = dir.path().join("restored");
    let (ok, out, err) = restore(&file, &restored);
    assert!(ok, "{err}");
    let told: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(told["events"], summary["events"], "{told}");
    let again = Server::start_on(Some(&restored), Some(PROC), &[]);
    let events = again.all_events(S).await;
    let offsets: Vec<u64> = events
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(
        offsets,
        (1..=offsets.len() as u64).collect::<Vec<_>>(),
        "dense"
    );
    let keys: std::collections::HashSet<&str> = events
        .iter()
        .filter_map(|e| e["idempotencyKey"].as_str())
        .collect();
    let missing: Vec<&String> = before
        .iter()
        .filter(|k| !keys.contains(k.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged before the backup, missing from it: {missing:?}"
    );
    // The processor goes on from the copy's checkpoint, and verifies.
    caught_up(&again, S, "counter").await;
    let (status, v) = again
        .post(
            &format!("{S}:verifyProcessor"),
            json!({"component": "counter"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["matches"], true, "{v}");
    // And takes appends.
    assert!(order(&client, &again.url, "after-restore").await);
}

/// `streamhost backup --to FILE` against `server` with `token`.
fn backup_to(server: &Server, file: &std::path::Path, token: &str) -> (bool, String, String) {
    run_cli(&[
        "backup",
        "--to",
        file.to_str().unwrap(),
        "--url",
        &server.url,
        "--token",
        token,
    ])
}

/// `streamhost restore --from FILE --data-dir DIR`.
fn restore(file: &std::path::Path, dir: &std::path::Path) -> (bool, String, String) {
    run_cli(&[
        "restore",
        "--from",
        file.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
    ])
}

#[tokio::test]
async fn backup_and_restore_refuse_what_they_cannot_do_whole_and_leave_nothing_half_done() {
    let mut server = Server::start_with(Some(TOKENS), &[]);
    if postgres_base().is_some() {
        return; // the test above shows the PostgreSQL answer
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.db");
    // Admins only.
    for (token, status) in [(None, 401), (Some("t-acme"), 403)] {
        let (got, out) = server.get_as(token, "/v1/backup").await;
        assert_eq!(got, status, "{out}");
    }
    let (ok, _, err) = backup_to(&server, &file, "t-acme");
    assert!(!ok);
    assert!(err.contains("forbidden") && err.contains("(403)"), "{err}");
    assert!(!file.exists());
    // A directory that does not exist: named, nothing written.
    let nowhere = dir.path().join("no-such-dir/b.db");
    let (ok, _, err) = backup_to(&server, &nowhere, "t-admin");
    assert!(!ok);
    assert!(err.contains("no-such-dir"), "{err}");
    // An existing file is never overwritten.
    std::fs::write(&file, "keep me").unwrap();
    let (ok, _, err) = backup_to(&server, &file, "t-admin");
    assert!(!ok);
    assert!(err.contains("exists already"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    // A file that is not a backup is not restored.
    let target = dir.path().join("data");
    let (ok, _, err) = restore(&file, &target);
    assert!(!ok);
    assert!(err.contains("b.db is not a streamhost backup"), "{err}");
    assert!(!target.join("streamhost.db").exists());
    // A real one is, once; a data dir that holds a database is refused.
    std::fs::remove_file(&file).unwrap();
    let (ok, _, err) = backup_to(&server, &file, "t-admin");
    assert!(ok, "{err}");
    let (ok, _, err) = restore(&file, &target);
    assert!(ok, "{err}");
    let (ok, _, err) = restore(&file, &target);
    assert!(!ok);
    assert!(err.contains("already holds a database"), "{err}");
    let left: Vec<String> = std::fs::read_dir(&target)
        .unwrap()
        .chain(std::fs::read_dir(dir.path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    server.stop();
}

/// What a backup for `GET /v1/backup` leaves in the data dir when the
/// server is killed while it is written or sent (its partial copy, a whole
/// copy not yet unlinked) is removed when the server starts again;
/// anything else there is left alone, and backups go on.
#[tokio::test]
async fn a_backup_interrupted_by_a_kill_leaves_nothing_after_a_restart() {
    let mut server = Server::start_with(Some(TOKENS), &[]);
    if postgres_base().is_some() {
        return; // no backup files on PostgreSQL
    }
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = backup_to(&server, &dir.path().join("first.db"), "t-admin");
    assert!(ok, "{err}");
    server.kill();
    let scratch = server.data_dir().join("backups");
    let left = [
        ".backup-5f0c6a9e-0000-4000-8000-000000000001.db.partial-4242-17",
        "backup-5f0c6a9e-0000-4000-8000-000000000002.db",
    ];
    for name in left {
        std::fs::write(scratch.join(name), vec![0u8; 64 * 1024]).unwrap();
    }
    std::fs::write(scratch.join("notes.txt"), "not a backup").unwrap();
    server.restart();
    for name in left {
        assert!(!scratch.join(name).exists(), "{name} is still there");
    }
    assert!(
        scratch.join("notes.txt").exists(),
        "another file was removed"
    );
    let (ok, _, err) = backup_to(&server, &dir.path().join("second.db"), "t-admin");
    assert!(ok, "{err}");
}

/// What `streamhost backup --to FILE` killed mid-download left beside FILE
/// (its partial file, named after its process) is removed by the next
/// backup to that name; a partial of a process still running stays.
#[tokio::test]
async fn a_backup_removes_the_partial_file_a_killed_backup_to_its_name_left() {
    let mut server = Server::start_with(Some(TOKENS), &[]);
    if postgres_base().is_some() {
        return; // no backup files on PostgreSQL
    }
    let dir = tempfile::tempdir().unwrap();
    // A process that has ended: its pid names no running process.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let dead = ended.id();
    ended.wait().unwrap();
    let stale = dir.path().join(format!(".b.db.partial-{dead}-17"));
    let running = dir
        .path()
        .join(format!(".b.db.partial-{}-18", std::process::id()));
    let other = dir.path().join(format!(".c.db.partial-{dead}-19"));
    for f in [&stale, &running, &other] {
        std::fs::write(f, vec![0u8; 4096]).unwrap();
    }
    let (ok, _, err) = backup_to(&server, &dir.path().join("b.db"), "t-admin");
    assert!(ok, "{err}");
    assert!(!stale.exists(), "the dead backup's partial is still there");
    assert!(
        err.contains("removed") && err.contains(&format!("partial-{dead}-17")),
        "{err}"
    );
    assert!(running.exists(), "a running process's partial was removed");
    assert!(other.exists(), "another name's partial was removed");
    server.stop();
}
