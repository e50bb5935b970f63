//! Backfill: fold one processor from its initial state over a range of its
//! stream's committed events and keep only the effects (its state and
//! checkpoint do not change). Effects are deduplicated by identity, so a
//! second run creates nothing. `POST {stream}:backfillProcessor` over HTTP.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::components::component_not_found;
use super::request::{StreamAnswer, StreamRequest};
use super::Host;
use crate::clock::format_timestamp;
use crate::delivery::Failure;
use crate::error::Error;
use crate::filter::CompiledFilter;
use crate::processor::backfill::RangeFold;
use crate::processor::keyed::Bucket;
use crate::processor::wake::{consumed, Guest};
use crate::storage::{EffectOp, EffectSource, WriteOp};
use crate::stream::StreamAddress;

/// Least time between two progress reports.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// A backfill of one processor: which events it folds. Build with
/// [`Backfill::new`]; it is also the body of `:backfillProcessor`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Backfill {
    /// The processor's component.
    pub component: String,
    /// Folds the events after this offset (0: from the start).
    #[serde(default, deserialize_with = "crate::stream::bounded::offset")]
    pub after_offset: u64,
    /// Up to this offset (`None`: the stream's head when it starts).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::stream::bounded::optional_offset"
    )]
    pub through_offset: Option<u64>,
    /// Only events of these types (within what the processor consumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// Only events for which this JSONata expression is truthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonata_condition: Option<String>,
}

impl Backfill {
    /// Folds processor `component` over its whole stream.
    pub fn new(component: impl Into<String>) -> Self {
        Backfill {
            component: component.into(),
            after_offset: 0,
            through_offset: None,
            event_types: None,
            jsonata_condition: None,
        }
    }

    range_setters!();
    selection_setters!();
}

/// What a backfill came to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backfilled {
    /// Stored events looked at.
    pub scanned: u64,
    /// Events folded.
    pub folded: u64,
    /// Effects new to the outbox.
    pub effects_created: u64,
    /// Effects the outbox already had (an earlier run or the processor's).
    pub effects_existing: u64,
}

/// How far a running backfill has come: after its first batch, then at
/// most every half second.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackfillProgress {
    /// Events scanned through this offset.
    pub through_offset: u64,
    /// The offset it folds up to.
    pub head_offset: u64,
    /// Stored events looked at.
    pub scanned: u64,
    /// Events folded.
    pub folded: u64,
    /// Effects new to the outbox so far.
    pub effects_created: u64,
}

impl Host {
    /// Runs a backfill of a processor on `stream` to its end.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # use serde_json::json;
    /// # host.deploy(streamhost::Deploy::new("acme", "ledger", std::fs::read(guests.join("ledger.wasm"))?)).await?;
    /// # let bank = host.stream("acme", "/bank")?;
    /// # host.subscribe(&bank, &streamhost::Subscription::wake("ledger", "ledger").from_beginning()).await?;
    /// # host.append(&bank, [
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "alice", "cents": 500})),
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "bob", "cents": 70})),
    /// #     streamhost::EventInput::new("withdrawn").payload(json!({"account": "alice", "cents": 120})),
    /// # ]).await?;
    /// # let head = host.state(&bank).await?.max_offset;
    /// # host.wait_for_processor(&bank, "ledger", head, std::time::Duration::from_secs(60)).await?;
    /// use streamhost::Backfill;
    ///
    /// let done = host.backfill(&bank, Backfill::new("ledger").event_types(["deposited"])).await?;
    /// assert_eq!(done.folded, 2);
    /// assert_eq!(done.effects_created, 0); // the ledger returns no effects
    /// # Ok(()) }
    /// ```
    pub async fn backfill(
        &self,
        stream: &StreamAddress,
        backfill: Backfill,
    ) -> Result<Backfilled, Error> {
        match self
            .apply(stream, StreamRequest::BackfillProcessor(backfill))
            .await?
        {
            StreamAnswer::Backfilled(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::backfill`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn backfill_here(
        &self,
        stream: &StreamAddress,
        backfill: Backfill,
    ) -> Result<Backfilled, Error> {
        self.backfill_with_progress(stream, backfill, |_| {}).await
    }

    /// As [`Host::backfill`], telling `progress` how far it has come.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # use serde_json::json;
    /// # host.deploy(streamhost::Deploy::new("acme", "ledger", std::fs::read(guests.join("ledger.wasm"))?)).await?;
    /// # let bank = host.stream("acme", "/bank")?;
    /// # host.subscribe(&bank, &streamhost::Subscription::wake("ledger", "ledger").from_beginning()).await?;
    /// # host.append(&bank, [
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "alice", "cents": 500})),
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "bob", "cents": 70})),
    /// #     streamhost::EventInput::new("withdrawn").payload(json!({"account": "alice", "cents": 120})),
    /// # ]).await?;
    /// # let head = host.state(&bank).await?.max_offset;
    /// # host.wait_for_processor(&bank, "ledger", head, std::time::Duration::from_secs(60)).await?;
    /// use streamhost::Backfill;
    ///
    /// let done = host
    ///     .backfill_with_progress(&bank, Backfill::new("ledger").after(1), |p| {
    ///         println!("{} of {} folded", p.through_offset, p.head_offset)
    ///     })
    ///     .await?;
    /// assert_eq!(done.folded, 3);
    /// # Ok(()) }
    /// ```
    pub async fn backfill_with_progress(
        &self,
        stream: &StreamAddress,
        backfill: Backfill,
        mut progress: impl FnMut(BackfillProgress) + Send + 'static,
    ) -> Result<Backfilled, Error> {
        let state = self.streams.state(stream).await?;
        let subscription = super::processors::wake_subscription(&state, &backfill.component)
            .ok_or_else(|| {
                Error::not_found(
                    "processor-not-found",
                    format!(
                        "processor {:?} has no processor-wake subscription on stream {:?}",
                        backfill.component, stream.path
                    ),
                )
            })?;
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
        let subscription_filter =
            CompiledFilter::for_subscription(&subscription, self.config.jsonata_limits())
                .map_err(|m| Error::invalid_with("invalid-jsonata", m))?;
        let storage = self.streams.storage().clone();
        let runtime = self.streams.wasm_runtime().clone();
        let clock = self.streams.clock();
        let project = stream.namespace.storage_key().to_string();
        let path = stream.path.clone();
        let component = backfill.component;
        let timeout_ms = self.config.delivery.timeout_ms;
        let info = crate::processor::stream_info(&state, through);
        let after = backfill.after_offset;
        let guest = runtime.clone();
        let done = guest
            .run_guest(move || -> Result<Backfilled, Error> {
                let failed = |f: Failure| Error::unprocessable("processor-failed", f.message);
                let internal = |e: anyhow::Error| Error::internal(format!("{e:#}"));
                let row = storage
                    .load_stream(&project, &path)
                    .map_err(internal)?
                    .ok_or_else(|| Error::stream_not_found(&path))?;
                let (prepared, _) =
                    crate::processor::deployed(&storage, &runtime, &project, &component)
                        .map_err(internal)?
                        .ok_or_else(|| component_not_found(&project, &component))?;
                let guest_failed = |e: crate::processor::runtime::GuestError| {
                    Error::unprocessable("processor-failed", format!("{component}: {e}"))
                };
                let announcement = runtime
                    .describe(&component, &prepared, timeout_ms)
                    .map_err(guest_failed)?;
                let initial = runtime
                    .initial_state(&component, &prepared, timeout_ms)
                    .map_err(guest_failed)?;
                let source = EffectSource {
                    project: project.clone(),
                    path: path.clone(),
                    stream_id: info.stream_id.clone(),
                    component: component.clone(),
                };
                let fold = RangeFold {
                    guest: Guest {
                        runtime: &runtime,
                        prepared: &prepared,
                        component: &component,
                        timeout_ms,
                        output: None,
                    },
                    storage: &storage,
                    row_id: row.row_id,
                    stream: info,
                    filter: consumed(subscription_filter, &announcement),
                    narrow,
                    spill: None,
                };
                // From the beginning: from the instance's base when
                // retention removed what it folded.
                let (initial, after, bucket) = if after == 0 {
                    crate::processor::backfill::fold_start(
                        &storage,
                        row.row_id,
                        &component,
                        &source.stream_id,
                        initial,
                    )
                    .map_err(internal)?
                } else {
                    (initial, after, Bucket::empty())
                };
                let mut counts = Backfilled::default();
                // The first batch reports at once, later ones at most every PROGRESS_EVERY.
                let mut last_report: Option<Instant> = None;
                let (_, end, _) = fold
                    .run(initial, after, through, bucket, |effects, at| {
                        if !effects.is_empty() {
                            let now = clock.now_ms();
                            let returned = effects.len() as u64;
                            let created = storage
                                .submit(WriteOp::Effect(EffectOp::Insert {
                                    source: source.clone(),
                                    effects,
                                    now_ms: now,
                                    created_at: format_timestamp(now),
                                }))
                                .blocking_recv()
                                .map_err(|_| Failure::new("the storage writer stopped", true))?
                                .map_err(|e| {
                                    Failure::new(format!("storing effects failed: {e}"), true)
                                })? as u64;
                            counts.effects_created += created;
                            counts.effects_existing += returned - created;
                        }
                        if last_report.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                            last_report = Some(Instant::now());
                            progress(BackfillProgress {
                                through_offset: at.through,
                                head_offset: through,
                                scanned: at.scanned,
                                folded: at.folded,
                                effects_created: counts.effects_created,
                            });
                        }
                        Ok(())
                    })
                    .map_err(failed)?;
                counts.scanned = end.scanned;
                counts.folded = end.folded;
                Ok(counts)
            })
            .await
            .map_err(|e| Error::internal(format!("the backfill panicked: {e}")))??;
        if done.effects_created > 0 {
            self.streams.executors().effects.ring();
        }
        Ok(done)
    }
}
