//! Reactors on the `Host`: `:backfillReactor` reruns one reactor over a
//! range of its stream's history and keeps the effects that are new (the
//! outbox ignores identities it holds). Reactors themselves run inside
//! appends (`crate::reactor`, the stream's actor).

use serde::{Deserialize, Serialize};

use super::request::{StreamAnswer, StreamRequest};
use super::Host;
use crate::clock::format_timestamp;
use crate::error::Error;
use crate::reactor::{Appended, Reacting};
use crate::storage::{EffectOp, EffectSource, WriteOp};
use crate::stream::{Event, StreamAddress};

/// Events read per page.
const PAGE_EVENTS: usize = 500;

/// A rerun of one reactor over history: which events. Build with
/// [`ReactorBackfill::new`]; it is also the body of `:backfillReactor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReactorBackfill {
    /// The reactor's name (its subscription key).
    pub name: String,
    /// The events after this offset (0: from the start).
    #[serde(default, deserialize_with = "crate::stream::bounded::offset")]
    pub after_offset: u64,
    /// Up to this offset (`None`: the stream's head when it starts).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::stream::bounded::optional_offset"
    )]
    pub through_offset: Option<u64>,
    /// Only events of these types (within the reactor's filter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// Only events for which this JSONata expression is truthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonata_condition: Option<String>,
}

impl ReactorBackfill {
    /// Reruns reactor `name` over its whole stream.
    pub fn new(name: impl Into<String>) -> Self {
        ReactorBackfill {
            name: name.into(),
            after_offset: 0,
            through_offset: None,
            event_types: None,
            jsonata_condition: None,
        }
    }

    range_setters!();
    selection_setters!();
}

/// What a reactor backfill came to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReactorBackfilled {
    /// Stored events looked at.
    pub scanned: u64,
    /// Events the reactor ran for (its filter and the selection matched).
    pub matched: u64,
    /// Effects new to the outbox.
    pub effects_created: u64,
    /// Effects the outbox already had (from the live reactor or an
    /// earlier backfill).
    pub effects_existing: u64,
}

/// `404 reactor-not-found`.
fn reactor_not_found(name: &str, path: &str) -> Error {
    Error::not_found(
        "reactor-not-found",
        format!("no reactor named {name:?} is configured on stream {path:?}"),
    )
}

impl Host {
    /// Reruns one reactor over a range of `stream`'s history (events from
    /// before it was configured included) and keeps the effects the outbox
    /// does not hold yet. A reactor that fails on an event stops the run
    /// with `422 reactor-failed`; the effects stored before it stay.
    pub async fn backfill_reactor(
        &self,
        stream: &StreamAddress,
        backfill: ReactorBackfill,
    ) -> Result<ReactorBackfilled, Error> {
        match self
            .apply(stream, StreamRequest::BackfillReactor(backfill))
            .await?
        {
            StreamAnswer::ReactorBackfilled(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::backfill_reactor`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn backfill_reactor_here(
        &self,
        stream: &StreamAddress,
        backfill: ReactorBackfill,
    ) -> Result<ReactorBackfilled, Error> {
        let state = self.streams.state(stream).await?;
        let mut reactor = crate::reactor::configured(&state, self.config.jsonata_limits())
            .into_iter()
            .find(|r| r.name == backfill.name)
            .ok_or_else(|| reactor_not_found(&backfill.name, &stream.path))?;
        // History before its configuration is what a backfill is for.
        reactor.configured_at_offset = 0;
        let head = state.max_offset;
        let through = backfill.through_offset.unwrap_or(head).min(head);
        if backfill.after_offset > through {
            return Err(Error::invalid(format!(
                "afterOffset {} is past throughOffset {through}",
                backfill.after_offset
            )));
        }
        let narrow = if backfill.event_types.is_some() || backfill.jsonata_condition.is_some() {
            Some(self.selection(
                backfill.event_types.clone(),
                backfill.jsonata_condition.clone(),
            )?)
        } else {
            None
        };
        let storage = self.streams.storage().clone();
        let clock = self.streams.clock();
        let runtime = self.streams.wasm_runtime().clone();
        let project = stream.namespace.storage_key().to_string();
        let path = stream.path.clone();
        let stream_id = state.stream_id.clone();
        let mut after = backfill.after_offset;
        let guest = runtime.clone();
        let done = guest
            .run_guest(move || -> Result<ReactorBackfilled, Error> {
                let internal = |e: anyhow::Error| Error::internal(format!("{e:#}"));
                let row = storage
                    .load_stream(&project, &path)
                    .map_err(internal)?
                    .ok_or_else(|| Error::stream_not_found(&path))?;
                let reacting = Reacting {
                    storage: &storage,
                    runtime: &runtime,
                    project: &project,
                    stream_id: &stream_id,
                    rests: None,
                    enter: None,
                    telemetry: None,
                };
                let source = EffectSource {
                    project: project.clone(),
                    path: path.clone(),
                    stream_id: stream_id.clone(),
                    component: crate::effect::effect_component(&reactor.name),
                };
                let mut counts = ReactorBackfilled::default();
                while after < through {
                    let page = storage
                        .events_after(row.row_id, after, PAGE_EVENTS, through)
                        .map_err(internal)?;
                    let Some((last, _)) = page.last() else { break };
                    after = *last;
                    counts.scanned += page.len() as u64;
                    let mut events = Vec::with_capacity(page.len());
                    for (offset, body) in page {
                        let event: Event = serde_json::from_str(&body).map_err(|e| {
                            Error::internal(format!(
                                "the stored event at offset {offset} is not an event: {e}"
                            ))
                        })?;
                        if let Some(narrow) = &narrow {
                            let value = serde_json::to_value(&event).expect("events serialize");
                            let selected = narrow
                                .matches(&event.event_type, &event.payload, &value)
                                .map_err(|m| Error::invalid_with("invalid-jsonata", m))?;
                            if !selected {
                                continue;
                            }
                        }
                        events.push(Appended {
                            request: 0,
                            index: None,
                            event,
                            body,
                        });
                    }
                    let (reactions, calls) = reacting
                        .react(std::slice::from_ref(&reactor), &events)
                        .map_err(|r| r.error)?;
                    counts.matched += calls;
                    for reaction in reactions {
                        let returned = reaction.effects.len() as u64;
                        let now = clock.now_ms();
                        let created = storage
                            .submit(WriteOp::Effect(EffectOp::Insert {
                                source: source.clone(),
                                effects: reaction.effects,
                                now_ms: now,
                                created_at: format_timestamp(now),
                            }))
                            .blocking_recv()
                            .map_err(|_| Error::internal("the storage writer stopped"))?
                            .map_err(|e| Error::internal(format!("storing effects failed: {e}")))?
                            as u64;
                        counts.effects_created += created;
                        counts.effects_existing += returned - created;
                    }
                }
                Ok(counts)
            })
            .await
            .map_err(|e| Error::internal(format!("the reactor backfill panicked: {e}")))??;
        if done.effects_created > 0 {
            self.streams.executors().effects.ring();
        }
        Ok(done)
    }
}
