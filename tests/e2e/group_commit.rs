//! The group-commit writer, driven directly on the database a test server
//! made (either engine): each write of a group commits or fails on its own,
//! and a write refused for a repeated idempotency key says so.

use streamhost::metrics::Metrics;
use streamhost::storage::{NewStream, Storage, StoredEvent, StreamCommit, StreamRef, WriteOp};

use crate::support::Server;

fn event(offset: u64, key: &str) -> StoredEvent {
    StoredEvent {
        offset,
        event_type: "x.y/e".into(),
        idempotency_key: Some(key.into()),
        body: format!(r#"{{"offset":{offset},"type":"x.y/e","idempotencyKey":"{key}"}}"#).into(),
    }
}

fn commit(stream: StreamRef, events: Vec<StoredEvent>) -> WriteOp {
    let head = events.last().map_or(0, |e| e.offset);
    WriteOp::Commit(StreamCommit {
        stream,
        events,
        head_offset: head,
        state_json: String::new(),
        state_offset: head,
        cursors: Vec::new(),
        removed_cursors: Vec::new(),
        fence: None,
        effects: Vec::new(),
        settled: None,
        redactions: Vec::new(),
        removed_through: None,
        staged: Vec::new(),
    })
}

fn new_stream(path: &str) -> StreamRef {
    StreamRef::New(NewStream {
        project: "p".into(),
        path: path.into(),
        stream_id: format!("id-{path}"),
        created_at: "2026-01-01T00:00:00.000Z".into(),
    })
}

#[test]
fn each_write_of_a_group_commits_or_fails_on_its_own() {
    let mut server = Server::start();
    server.stop();
    let host_dir = tempfile::tempdir().unwrap();
    let storage = match server.postgres_url() {
        Some(url) => Storage::open_postgres(
            url,
            host_dir.path(),
            "http://127.0.0.1:9",
            5_000,
            5_000,
            Default::default(),
            Metrics::new().commit_observer(),
        ),
        None => Storage::open(
            &server.data_dir(),
            streamhost::config::Durability::Full,
            Default::default(),
            Metrics::new().commit_observer(),
        ),
    }
    .expect("opening the server's storage");

    let mut rows = Vec::new();
    for path in ["/a", "/b", "/c"] {
        let key = format!("k{path}");
        rows.push(
            storage
                .commit_blocking(commit(new_stream(path), vec![event(1, &key)]))
                .expect("creating a stream"),
        );
    }
    let existing = |row: usize, expected_head: u64| StreamRef::Existing {
        row_id: rows[row],
        expected_head,
    };
    // Submitted together (the writer takes what is queued as one group).
    let replies: Vec<_> = [
        commit(existing(0, 1), vec![event(2, "k/a")]), // a repeated key
        commit(existing(1, 1), vec![event(2, "k/b2"), event(3, "k/b3")]),
        commit(existing(2, 5), vec![event(6, "k/c6")]), // a stale head
        commit(new_stream("/d"), vec![event(1, "k/d")]),
    ]
    .into_iter()
    .map(|op| storage.submit(op))
    .collect();
    let results: Vec<_> = replies
        .into_iter()
        .map(|r| r.blocking_recv().expect("an answer"))
        .collect();

    let repeated = results[0].as_ref().expect_err("a repeated key is refused");
    assert!(repeated.duplicate_key(), "{repeated}");
    assert_eq!(results[1].as_ref().ok(), Some(&rows[1]));
    let stale = results[2].as_ref().expect_err("a stale head is refused");
    assert!(!stale.duplicate_key(), "{stale}");
    assert!(stale.to_string().contains("expected 5"), "{stale}");
    let d = *results[3].as_ref().expect("a new stream commits");

    let offsets = |row: i64| -> Vec<u64> {
        storage
            .events_after(row, 0, 100, u64::MAX)
            .unwrap()
            .into_iter()
            .map(|(o, _)| o)
            .collect()
    };
    assert_eq!(offsets(rows[0]), vec![1], "nothing of the refused write");
    assert_eq!(offsets(rows[1]), vec![1, 2, 3]);
    assert_eq!(offsets(rows[2]), vec![1], "nothing of the stale write");
    assert_eq!(offsets(d), vec![1]);
    let b = storage.load_stream("p", "/b").unwrap().expect("stream /b");
    assert_eq!((b.row_id, b.head_offset), (rows[1], 3));
    let a = storage.load_stream("p", "/a").unwrap().expect("stream /a");
    assert_eq!(a.head_offset, 1, "the refused write moved no head");
}
