//! Moves events accepted over HTTP to their streams: one worker per host
//! drains each stream with pending events in a task of its own (16 at
//! once, 4 of one project), appending its events in acceptance order (up
//! to 1000 an append), then deletes their rows, which frees their
//! capacity; a stream with a long backlog holds up no other. A crash
//! between the two appends them again, answered from their idempotency keys:
//! nothing twice. A stream that refuses for now (paused, overloaded, a
//! reactor that cannot run yet, a storage failure) keeps its events, in
//! order and counted against capacity, and is tried again after the
//! delivery backoff; an event refused for good (a reactor's final refusal,
//! its key used by a direct append with other content) is parked: kept with
//! its reason, still counted, until redriven or discarded, and the events
//! behind it go on.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::Ingest;
use crate::actor::{Streams, StreamsRef};
use crate::clock::format_timestamp;
use crate::error::{Error, ErrorKind};
use crate::storage::{IngestOp, PendingRow, WriteOp};
use crate::stream::{
    AppendInput, Authority, EventInput, Namespace, StreamAddress, APPEND_EVENTS_MAX,
};

/// Streams drained at once.
const CONCURRENCY: usize = 16;
/// Streams of one project drained at once: a project with many slow
/// streams leaves the others room.
const PROJECT_CONCURRENCY: usize = CONCURRENCY / 4;
/// A stream: (project, path).
type Stream = (String, String);
/// Most bytes of pending events in one append.
const APPEND_BYTES_MAX: i64 = 4 * 1024 * 1024;
/// Longest the worker sleeps without looking (acceptances wake it at once).
const IDLE_LOOK: Duration = Duration::from_secs(5);

/// Whether an append error may pass (try again later) or never will. A
/// project at its storage bound waits for room (a deleted stream, a
/// higher bound): what was accepted is kept, not parked.
pub fn is_retryable(e: &Error) -> bool {
    matches!(
        e.kind,
        ErrorKind::Unavailable
            | ErrorKind::Internal
            | ErrorKind::Timeout
            | ErrorKind::InsufficientStorage
    )
}

/// Starts the worker; it ends with the stream registry.
pub fn start(streams: StreamsRef, ingest: Ingest) {
    tokio::spawn(run(streams, ingest));
}

async fn run(streams: StreamsRef, ingest: Ingest) {
    // Streams refused for now: until when they wait, and how many
    // refusals in a row (their backoff).
    let mut held: HashMap<Stream, Instant> = HashMap::new();
    let mut failures: HashMap<Stream, u32> = HashMap::new();
    // Streams being drained, each by a task of its own: a slow stream
    // holds up no other, and a project drains at most
    // [`PROJECT_CONCURRENCY`] streams at once.
    let mut draining: JoinSet<(Stream, bool)> = JoinSet::new();
    // The stream each drain task works on.
    let mut in_flight: HashMap<tokio::task::Id, Stream> = HashMap::new();
    let mut round = ingest.retry_round();
    // Whether to read the pending table next: at start, after a drain task
    // ends, when a held stream's time comes and now and then (another
    // host's acceptances). An acceptance on this host names its stream
    // instead: reading the whole table for each would cost as much as
    // the drain under a backlog.
    let mut look = true;
    loop {
        if ingest.retry_round() != round {
            round = ingest.retry_round();
            held.clear();
            look = true;
        }
        let Some(live) = streams.upgrade() else {
            draining.abort_all();
            return;
        };
        let rung = ingest.take_rung();
        let pending = if look {
            look = false;
            let storage = live.storage().clone();
            match tokio::task::spawn_blocking(move || storage.ingest_pending_streams()).await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    tracing::warn!(error = %format!("{e:#}"), "reading pending ingest failed");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading pending ingest failed");
                    Vec::new()
                }
            }
        } else {
            // A rung stream not started now (its project at its share,
            // all places taken, held) is read from the table when a task
            // ends or its time comes.
            let mut rung: Vec<Stream> = rung.into_iter().collect();
            rung.sort();
            rung
        };
        let now = Instant::now();
        held.retain(|_, until| *until > now);
        let mut per_project: HashMap<String, usize> = HashMap::new();
        for s in in_flight.values() {
            *per_project.entry(s.0.clone()).or_default() += 1;
        }
        for s in pending {
            if in_flight.len() >= CONCURRENCY {
                break;
            }
            let busy = per_project.entry(s.0.clone()).or_default();
            if held.contains_key(&s)
                || in_flight.values().any(|f| *f == s)
                || *busy >= PROJECT_CONCURRENCY
            {
                continue;
            }
            *busy += 1;
            let (live, ingest) = (live.clone(), ingest.clone());
            let key = s.clone();
            let task = draining.spawn(async move {
                let drained = drain_stream(&live, &ingest, &s.0, &s.1).await;
                (s, drained)
            });
            in_flight.insert(task.id(), key);
        }
        drop(live);
        let wait = held
            .values()
            .min()
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or(IDLE_LOOK)
            .min(IDLE_LOOK);
        // A stream done (its next events, or another stream's, go next),
        // an acceptance, or the first held stream's time.
        tokio::select! {
            Some(done) = draining.join_next_with_id(), if !draining.is_empty() => {
                let mut finished = vec![done];
                while let Some(more) = draining.try_join_next_with_id() {
                    finished.push(more);
                }
                look = true;
                for done in finished {
                    let (s, drained) = match done {
                        Ok((id, (s, drained))) => {
                            in_flight.remove(&id);
                            (s, drained)
                        }
                        Err(e) => {
                            // A drain task that failed: its stream is
                            // looked at again (its rows are still pending).
                            in_flight.remove(&e.id());
                            continue;
                        }
                    };
                    if drained {
                        failures.remove(&s);
                    } else {
                        let n = failures.entry(s.clone()).or_insert(0);
                        *n = n.saturating_add(1);
                        held.insert(s, Instant::now() + ingest.backoff(*n));
                    }
                }
            }
            rang = tokio::time::timeout(wait, ingest.bell().notified()) => {
                if rang.is_err() {
                    look = true;
                }
            }
        }
    }
}

/// Appends a stream's pending events until none are left (true) or the
/// stream refuses for now (false).
async fn drain_stream(streams: &Streams, ingest: &Ingest, project: &str, path: &str) -> bool {
    let namespace = if project.is_empty() {
        Namespace::Global
    } else {
        Namespace::Project(project.to_string())
    };
    let address = match StreamAddress::new(namespace, path) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(project, path, error = %e.message, "pending ingest for a bad stream path");
            return false;
        }
    };
    loop {
        let storage = streams.storage().clone();
        let (p, q) = (project.to_string(), path.to_string());
        let rows = tokio::task::spawn_blocking(move || {
            storage.ingest_pending_rows(&p, &q, APPEND_EVENTS_MAX, APPEND_BYTES_MAX)
        })
        .await;
        let rows = match rows {
            Ok(Ok(rows)) => rows,
            _ => return false,
        };
        if rows.is_empty() {
            ingest.unblock(project, path);
            return true;
        }
        let events: Vec<EventInput> = match rows
            .iter()
            .map(|r| serde_json::from_str(&r.body))
            .collect::<Result<_, _>>()
        {
            Ok(events) => events,
            Err(_) => {
                // Not written by this build's acceptance: one by one finds it.
                if !one_by_one(streams, ingest, &address, rows).await {
                    return false;
                }
                continue;
            }
        };
        let input = AppendInput {
            events,
            expected_stream_id: None,
        };
        match streams.append(&address, input, Authority::Public).await {
            Ok(_) => {
                ingest.unblock(project, path);
                if !appended(streams, ingest, project, &rows).await {
                    return false;
                }
            }
            Err(e) if is_retryable(&e) => {
                tracing::debug!(stream = %address, error = %e.message, "ingest held");
                ingest.block(
                    project,
                    path,
                    &e.message,
                    format_timestamp(streams.now_ms()),
                );
                return false;
            }
            Err(_) => {
                if !one_by_one(streams, ingest, &address, rows).await {
                    return false;
                }
            }
        }
    }
}

/// Appends `rows` one at a time, parking those refused for good; false if
/// the stream refused for now.
async fn one_by_one(
    streams: &Streams,
    ingest: &Ingest,
    address: &StreamAddress,
    rows: Vec<PendingRow>,
) -> bool {
    for row in rows {
        let result = match serde_json::from_str::<EventInput>(&row.body) {
            Ok(event) => {
                let input = AppendInput {
                    events: vec![event],
                    expected_stream_id: None,
                };
                streams
                    .append(address, input, Authority::Public)
                    .await
                    .map(|_| ())
            }
            Err(e) => Err(Error::invalid(format!(
                "the accepted event is unreadable: {e}"
            ))),
        };
        match result {
            Ok(()) => {
                ingest.unblock(address.namespace.storage_key(), &address.path);
                if !appended(
                    streams,
                    ingest,
                    address.namespace.storage_key(),
                    std::slice::from_ref(&row),
                )
                .await
                {
                    return false;
                }
            }
            Err(e) if is_retryable(&e) => {
                ingest.block(
                    address.namespace.storage_key(),
                    &address.path,
                    &e.message,
                    format_timestamp(streams.now_ms()),
                );
                return false;
            }
            Err(e) => {
                tracing::warn!(
                    stream = %address,
                    key = %row.key,
                    reason = %e.message,
                    "an accepted event was refused for good: parked (list, redrive or discard it \
                     at /v1/projects/{{p}}/ingest/parked)"
                );
                let op = IngestOp::Park {
                    id: row.id,
                    reason: e.message.clone(),
                    parked_at: format_timestamp(streams.now_ms()),
                };
                // Parked, it keeps its capacity until it is settled.
                match streams.storage().submit(WriteOp::Ingest(op)).await {
                    Ok(Ok(_)) => {}
                    _ => return false,
                }
            }
        }
    }
    true
}

/// Deletes the rows of events committed to their stream and frees their
/// capacity; false if the delete did not commit (they are appended again,
/// as replays, later).
async fn appended(streams: &Streams, ingest: &Ingest, project: &str, rows: &[PendingRow]) -> bool {
    let op = IngestOp::Appended {
        ids: rows.iter().map(|r| r.id).collect(),
    };
    match streams.storage().submit(WriteOp::Ingest(op)).await {
        Ok(Ok(answer)) => {
            // What this delete removed (another host's drain may have
            // removed some first).
            let (gone, bytes) = IngestOp::accepted(answer);
            ingest.release(project, gone, bytes);
            true
        }
        _ => false,
    }
}
