//! HTTP acceptance: `POST /v1/projects/{p}/ingest{path}` answers `202` only
//! once its events are committed to the pending table (fsync'd per the
//! configured durability). Every event carries an idempotency key, checked
//! against what is pending and what its stream already holds, so a retried
//! acceptance stores nothing twice and a reused key with other content is a
//! `409`. Capacity is taken before the commit and given back for what the
//! commit did not store.

use std::collections::HashMap;

use super::{validate_event, Ingest};
use crate::error::Error;
use crate::storage::{IngestOp, NewPending, Refusal, SharedBound, Storage, WriteOp};
use crate::stream::{is_same_event, Event, EventInput, StreamAddress, APPEND_EVENTS_MAX};

/// Accepts `events` for the stream at `address`; answers how many were
/// accepted (all of them: replays of accepted events count).
pub async fn accept(
    storage: &Storage,
    ingest: &Ingest,
    address: &StreamAddress,
    events: Vec<EventInput>,
    accepted_at: String,
) -> Result<usize, Error> {
    if events.is_empty() {
        return Err(Error::invalid("events is empty: send at least one event"));
    }
    if events.len() > APPEND_EVENTS_MAX {
        return Err(Error::invalid(format!(
            "events has {} events, over the {APPEND_EVENTS_MAX}-event limit of one request",
            events.len()
        )));
    }
    let max = ingest.config().max_event_bytes;
    let mut rows: Vec<(EventInput, NewPending)> = Vec::with_capacity(events.len());
    let mut first_of_key: HashMap<String, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        validate_event(i, e, max)?;
        let key = e.idempotency_key.clone().unwrap_or_default();
        if let Some(&j) = first_of_key.get(&key) {
            if rows[j].0 != *e {
                return Err(Error::conflict(
                    "idempotency-conflict",
                    format!("events[{i}] reuses idempotency key {key:?} of events[{j}] with other content"),
                ));
            }
            continue;
        }
        let body = serde_json::to_string(e)
            .map_err(|err| Error::internal(format!("serializing events[{i}]: {err}")))?;
        first_of_key.insert(key.clone(), rows.len());
        rows.push((
            e.clone(),
            NewPending {
                project: address.namespace.storage_key().to_string(),
                path: address.path.clone(),
                key,
                body,
                accepted_at: accepted_at.clone(),
            },
        ));
    }
    // A key drained to the stream between the check and the commit makes
    // the commit refuse (it checks the stream under the ingest lock): the
    // check runs again and sees it there.
    for _ in 0..3 {
        let fresh = {
            let (storage, address, rows) = (storage.clone(), address.clone(), rows.clone());
            tokio::task::spawn_blocking(move || not_yet_accepted(&storage, &address, rows))
                .await
                .map_err(|e| Error::internal(format!("checking idempotency keys: {e}")))??
        };
        if fresh.is_empty() {
            return Ok(events.len());
        }
        match commit(storage, ingest, fresh).await {
            Err(Retry::KeyInStream) => continue,
            Err(Retry::No(e)) => return Err(e),
            Ok(()) => return Ok(events.len()),
        }
    }
    Err(Error::unavailable(
        "overloaded",
        format!("the acceptance into {address} kept racing the drain of its own keys; retry"),
        1,
    ))
}

/// Why [`commit`] did not commit.
enum Retry {
    /// A key reached the stream meanwhile: check again.
    KeyInStream,
    No(Error),
}

/// Commits the acceptance of `fresh` rows, within capacity.
async fn commit(storage: &Storage, ingest: &Ingest, fresh: Vec<NewPending>) -> Result<(), Retry> {
    let (n, bytes) = (
        fresh.len() as u64,
        fresh.iter().map(|r| r.body.len() as u64).sum::<u64>(),
    );
    // Several hosts accept and drain the one pending table: capacity is
    // counted there, in the acceptance's own transaction. One host counts
    // in memory (no table scan per acceptance).
    let shared = storage.cluster().is_some();
    let (project, path) = fresh
        .first()
        .map(|r| (r.project.clone(), r.path.clone()))
        .unwrap_or_default();
    let bound = shared.then(|| SharedBound {
        max_events: ingest.config().max_pending_events,
        max_bytes: ingest.config().max_pending_bytes,
        project_max_events: ingest.config().project_events(),
        project_max_bytes: ingest.config().project_bytes(),
    });
    if !shared {
        ingest.reserve(&project, n, bytes).map_err(Retry::No)?;
    }
    let release = |events: u64, bytes: u64| {
        if !shared {
            ingest.release(&project, events, bytes)
        }
    };
    let committed = storage
        .submit(WriteOp::Ingest(IngestOp::Accept { rows: fresh, bound }))
        .await;
    match committed {
        Ok(Ok(answer)) => {
            let (stored, stored_bytes) = IngestOp::accepted(answer);
            release(n - stored, bytes - stored_bytes);
            ingest.ring(&project, &path);
            Ok(())
        }
        Ok(Err(e)) => {
            release(n, bytes);
            Err(match e.refusal() {
                Some(Refusal::KeyInStream) => Retry::KeyInStream,
                Some(Refusal::CapacityExhausted(what)) => Retry::No(Error::unavailable(
                    "capacity-exhausted",
                    format!(
                        "ingest is at capacity{what} (everything accepted before is kept; \
                         retry later)"
                    ),
                    super::CAPACITY_RETRY_AFTER_S,
                )),
                Some(Refusal::KeyConflict(key)) => Retry::No(Error::conflict(
                    "idempotency-conflict",
                    format!(
                        "idempotency key {key:?} is already used by an accepted event not yet \
                         appended, with a different type, payload or metadata"
                    ),
                )),
                _ => Retry::No(Error::internal(format!("accepting events failed: {e}"))),
            })
        }
        Err(_) => {
            release(n, bytes);
            Err(Retry::No(Error::internal("the storage writer stopped")))
        }
    }
}

/// The rows whose keys are neither pending nor committed to the stream; a
/// key held by other content is a conflict.
fn not_yet_accepted(
    storage: &Storage,
    address: &StreamAddress,
    rows: Vec<(EventInput, NewPending)>,
) -> Result<Vec<NewPending>, Error> {
    let internal = |e: anyhow::Error| Error::internal(format!("reading idempotency keys: {e:#}"));
    let project = address.namespace.storage_key();
    // Pending rows first, the stream after: a row leaves the pending table
    // only once its event is committed to the stream, so a key not pending
    // now is either in the stream when it is read next, or new (the other
    // order missed a key drained in between, and accepted it twice).
    let mut pending = HashMap::new();
    for (_, row) in &rows {
        if let Some(body) = storage
            .ingest_pending_body(project, &address.path, &row.key)
            .map_err(internal)?
        {
            pending.insert(row.key.clone(), body);
        }
    }
    let stream = storage
        .load_stream(project, &address.path)
        .map_err(internal)?;
    let keys: Vec<&str> = rows.iter().map(|(_, r)| r.key.as_str()).collect();
    let committed = match &stream {
        Some(s) => storage.events_by_keys(s.row_id, &keys).map_err(internal)?,
        None => HashMap::new(),
    };
    let mut fresh = Vec::with_capacity(rows.len());
    for (input, row) in rows {
        let conflict = |held: &str| {
            Error::conflict(
                "idempotency-conflict",
                format!(
                    "idempotency key {:?} is already used by {held} with a different type, \
                     payload or metadata",
                    row.key
                ),
            )
        };
        if let Some(body) = pending.get(&row.key) {
            let pending: EventInput = serde_json::from_str(body)
                .map_err(|e| Error::internal(format!("parsing a pending event: {e}")))?;
            if pending != input {
                return Err(conflict("an accepted event not yet appended"));
            }
            continue;
        }
        if let Some(body) = committed.get(&row.key) {
            let event: Event = serde_json::from_str(body)
                .map_err(|e| Error::internal(format!("parsing a stored event: {e}")))?;
            if !is_same_event(&event, &input) {
                return Err(conflict(&format!("the event at offset {}", event.offset)));
            }
            continue;
        }
        fresh.push(row);
    }
    Ok(fresh)
}
