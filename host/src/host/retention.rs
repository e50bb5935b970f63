//! Retention (`:configureRetention`): a stream's bounds by age and count,
//! applied in the background. Each step removes a bounded batch of events
//! from the front of the log (an `events-removed` line, whose commit
//! deletes them), never past a durable subscription's cursor or a
//! processor's checkpoint; before events a processor folded go, its
//! checkpoint is kept as its **base** (state and keys), from which
//! verification, refolds and time travel start. The decision is the
//! core's (`stream::retention`); this module reads what it needs.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::actor::{Streams, StreamsRef};
use crate::error::Error;
use crate::storage::WriteOp;
use crate::stream::retention::{self, Front, Retention};
use crate::stream::{
    types, AppendInput, Authority, CoreState, Event, EventInput, Namespace, StreamAddress,
};

use super::request::{StreamAnswer, StreamRequest};
use super::Host;

/// How often the host applies retention to the streams that set it.
const STEP_EVERY: Duration = Duration::from_secs(1);
/// How often the host lists again the streams that set retention (what
/// other hosts configured, streams this host took over).
const LIST_EVERY: Duration = Duration::from_secs(60);
/// After a step that removed events, the sweep rests this many times as
/// long as the step took (at most a tenth of the time removing).
const REST_PER_STEP: u32 = 9;
/// Most bytes of event bodies one step reads from the front of the log.
const FRONT_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The streams this host applies retention to: listed from storage when
/// the host opens and every [`LIST_EVERY`], and added to by every
/// `:configureRetention` it serves.
#[derive(Default)]
pub(crate) struct Retained(Mutex<HashSet<StreamAddress>>);

impl Retained {
    fn add(&self, address: &StreamAddress) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(address.clone());
    }

    fn remove(&self, address: &StreamAddress) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(address);
    }

    fn all(&self) -> Vec<StreamAddress> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

impl Host {
    /// Sets `stream`'s retention bounds (`None` and `None`: removes them):
    /// events older than `max_age_ms`, and the oldest beyond `max_events`
    /// stored events, are removed from the front of its log in the
    /// background, never past a durable subscription's cursor or a
    /// processor's checkpoint. Answers the `retention-configured` event.
    /// `400` for a bound of zero.
    pub async fn configure_retention(
        &self,
        stream: &StreamAddress,
        max_age_ms: Option<u64>,
        max_events: Option<u64>,
    ) -> Result<Event, Error> {
        let request = StreamRequest::ConfigureRetention {
            max_age_ms,
            max_events,
        };
        match self.apply(stream, request).await? {
            StreamAnswer::RetentionConfigured(e) => Ok(*e),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::configure_retention`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn configure_retention_here(
        &self,
        stream: &StreamAddress,
        max_age_ms: Option<u64>,
        max_events: Option<u64>,
    ) -> Result<Event, Error> {
        let mut payload = serde_json::Map::new();
        payload.insert("maxAgeMs".into(), json!(max_age_ms));
        payload.insert("maxEvents".into(), json!(max_events));
        let set = Retention::from_payload("configureRetention", &payload)?;
        // A stream that does not exist has nothing to keep (and the
        // append below must not create it).
        self.streams.state(stream).await?;
        let mut out = self
            .streams
            .append(
                stream,
                AppendInput {
                    events: vec![
                        EventInput::new(types::RETENTION_CONFIGURED).payload(payload.into())
                    ],
                    expected_stream_id: None,
                },
                Authority::Platform,
            )
            .await?;
        match set {
            Some(_) => self.retained.add(stream),
            None => self.retained.remove(stream),
        }
        Ok(out.events.remove(0))
    }
}

/// Applies retention in the background until the registry is gone: every
/// [`STEP_EVERY`] to each stream that sets it. A long backlog goes in
/// steps of [`retention::REMOVAL_EVENTS_MAX`] events, each followed by a
/// rest [`REST_PER_STEP`] times as long as the step took: removing is
/// background work, and takes a bounded share of the writer from the
/// appends beside it.
pub(crate) fn start(streams: StreamsRef, retained: Arc<Retained>) {
    tokio::spawn(async move {
        let mut listed: Option<std::time::Instant> = None;
        loop {
            if listed.is_none_or(|t| t.elapsed() >= LIST_EVERY) {
                let Some(s) = streams.upgrade() else {
                    return;
                };
                let storage = s.storage().clone();
                drop(s);
                match tokio::task::spawn_blocking(move || storage.streams_with_retention()).await {
                    Ok(Ok(found)) => {
                        for (project, path) in found {
                            let namespace = Namespace::from_storage_key(&project);
                            if let Ok(address) = StreamAddress::new(namespace, &path) {
                                retained.add(&address);
                            }
                        }
                        listed = Some(std::time::Instant::now());
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %format!("{e:#}"), "listing the streams with retention failed")
                    }
                    Err(_) => {}
                }
            }
            for address in retained.all() {
                loop {
                    let Some(s) = streams.upgrade() else {
                        return;
                    };
                    let started = std::time::Instant::now();
                    let result = step(&s, &address).await;
                    drop(s);
                    match result {
                        Ok(Step::Removed(n)) => {
                            tokio::time::sleep(started.elapsed() * REST_PER_STEP).await;
                            if n == retention::REMOVAL_EVENTS_MAX {
                                continue;
                            }
                        }
                        Ok(Step::Nothing) => {}
                        Ok(Step::NotRetained) => retained.remove(&address),
                        Err(e) if e.code == "stream-not-found" => retained.remove(&address),
                        // Another host owns it now: its sweep applies it.
                        Err(e) if e.owner_url.is_some() => retained.remove(&address),
                        Err(e) => {
                            tracing::warn!(stream = %address, error = %e.message, "applying retention failed")
                        }
                    }
                    break;
                }
            }
            tokio::time::sleep(STEP_EVERY).await;
        }
    });
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The stream sets no retention.
    NotRetained,
    /// Nothing was due, or the floor held it.
    Nothing,
    /// This many stored events were removed.
    Removed(usize),
}

/// What a step read, on a blocking thread.
struct Planned {
    through: u64,
    count: usize,
    digest: String,
}

/// One retention step on `address`: reads the front of the log and the
/// floor, keeps the bases of the processors whose folded events go, then
/// appends the `events-removed` line whose commit deletes them.
pub(crate) async fn step(streams: &Streams, address: &StreamAddress) -> Result<Step, Error> {
    let state = streams.state(address).await?;
    let Some(bounds) = state.retention else {
        return Ok(Step::NotRetained);
    };
    let storage = streams.storage().clone();
    let now_ms = streams.clock().now_ms();
    let ns = address.namespace.storage_key().to_string();
    let path = address.path.clone();
    let from = state.first_offset;
    // The removal goes only to the lifetime it was planned on.
    let stream_id = state.stream_id.clone();
    // Without an age bound, only the excess over the count is read; a
    // stream within its count reads nothing.
    let excess = state
        .retained_events()
        .saturating_sub(bounds.max_events.unwrap_or(u64::MAX)) as usize;
    let want = match bounds.max_age_ms {
        Some(_) => retention::REMOVAL_EVENTS_MAX,
        None => excess.min(retention::REMOVAL_EVENTS_MAX),
    };
    if want == 0 || state.stored_events() == 0 {
        return Ok(Step::Nothing);
    }
    let planned = tokio::task::spawn_blocking(move || -> Result<Option<Planned>, Error> {
        let internal = |e: anyhow::Error| Error::internal(format!("{e:#}"));
        let Some(row) = storage.load_stream(&ns, &path).map_err(internal)? else {
            return Ok(None);
        };
        if excess == 0 {
            // Only the age can remove: is the oldest event old enough?
            let age = bounds.max_age_ms.unwrap_or(u64::MAX).min(i64::MAX as u64) as i64;
            let oldest = storage
                .events_within(row.row_id, from - 1, 1, state.max_offset, FRONT_BYTES_MAX)
                .map_err(internal)?;
            let due = oldest
                .first()
                .and_then(|(_, body)| created_at_ms(body))
                .is_some_and(|at| at < now_ms.saturating_sub(age));
            if !due {
                return Ok(None);
            }
        }
        let (floor, wakes) = floor(&storage, &ns, row.row_id, &state).map_err(internal)?;
        if floor < from {
            return Ok(None);
        }
        let bodies = storage
            .events_within(
                row.row_id,
                from - 1,
                want,
                floor.min(state.max_offset),
                FRONT_BYTES_MAX,
            )
            .map_err(internal)?;
        let front: Vec<Front> = bodies
            .iter()
            .map(|(offset, body)| Front {
                offset: *offset,
                created_at_ms: created_at_ms(body).unwrap_or(i64::MAX),
            })
            .collect();
        let Some(cut) = retention::removal(&bounds, &front, state.retained_events(), now_ms, floor)
        else {
            return Ok(None);
        };
        let digest = retention::chain_digest(
            &state.removed_digest,
            bodies[..cut.count].iter().map(|(_, b)| b.as_str()),
        );
        // Every processor that folded what goes keeps its checkpoint as
        // its base first (its checkpoint is at or past the cut: the floor).
        for component in wakes {
            let kept = storage
                .processor_base(row.row_id, &component)
                .map_err(internal)?
                .filter(|b| b.stream_id == state.stream_id && b.offset >= cut.through_offset);
            if kept.is_some() {
                continue;
            }
            let offset = storage
                .commit_blocking(WriteOp::KeepBase {
                    row_id: row.row_id,
                    component: component.clone(),
                    stream_id: state.stream_id.clone(),
                    chain: digest.clone(),
                })
                .map_err(|e| Error::internal(e.message().to_string()))?;
            if offset < cut.through_offset as i64 {
                // The instance went back (a reset): the next step sees it.
                return Ok(None);
            }
        }
        Ok(Some(Planned {
            through: cut.through_offset,
            count: cut.count,
            digest,
        }))
    })
    .await
    .map_err(|e| Error::internal(format!("planning retention panicked: {e}")))??;
    let Some(p) = planned else {
        return Ok(Step::Nothing);
    };
    let line = EventInput::new(types::EVENTS_REMOVED).payload(json!({
        "fromOffset": from,
        "throughOffset": p.through,
        "count": p.count,
        "digest": p.digest,
    }));
    streams
        .append(
            address,
            AppendInput {
                events: vec![line],
                expected_stream_id: Some(stream_id),
            },
            Authority::Platform,
        )
        .await?;
    Ok(Step::Removed(p.count))
}

/// The lowest offset through which every durable subscription and
/// processor of the stream is done (a push subscription's acknowledged
/// cursor or its start, a processor's checkpoint; 0 while a refold or a
/// shadow of the processor's component folds the log from its start), and
/// the processors.
fn floor(
    storage: &crate::storage::Storage,
    ns: &str,
    row_id: i64,
    state: &CoreState,
) -> anyhow::Result<(u64, Vec<String>)> {
    let cursors = storage.load_cursors(row_id)?;
    let mut floor = u64::MAX;
    let mut wakes = Vec::new();
    for (key, sub) in &state.subscriptions.outbound.by_key {
        if let crate::subscription::Receiver::ProcessorWake { expression } =
            &sub.configuration.receiver
        {
            let Ok(component) = crate::itx::wake_component(expression) else {
                continue;
            };
            let done = if storage.refold_pending(ns, &component)? {
                0 // a refold or shadow reads the log from its start (or base)
            } else {
                storage
                    .checkpoint(row_id, &component)?
                    .filter(|c| c.stream_id == state.stream_id)
                    .map_or(0, |c| c.checkpoint_offset)
            };
            floor = floor.min(done);
            wakes.push(component);
            continue;
        }
        if sub.configuration.receiver.delivery().is_none() {
            continue; // a reactor: it runs inside appends, no cursor
        }
        let done = cursors
            .iter()
            .find(|c| &c.subscription_key == key && c.generation == sub.generation())
            .map_or(sub.start_cursor(), |c| c.acknowledged_offset);
        floor = floor.min(done);
    }
    Ok((floor, wakes))
}

/// An event body's `createdAt`, in milliseconds since the epoch.
fn created_at_ms(body: &str) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct At {
        #[serde(rename = "createdAt")]
        created_at: String,
    }
    let at: At = serde_json::from_str(body).ok()?;
    crate::clock::parse_time(&at.created_at).ok()
}
