//! Ingest with broker acceptance: events accepted durably now and appended
//! in order shortly after (`202` over HTTP), and the JetStream bridge's
//! status and registration. `POST /v1/projects/{p}/ingest{path}`,
//! `GET /v1/ingest` and `POST /v1/ingest:register` over HTTP.

use std::time::Duration;

use super::Host;
use crate::clock::format_timestamp;
use crate::error::Error;
use crate::ingest::nats::BridgeStatus;
use crate::ingest::{IngestStatus, ParkedEvent, ParkedPage, ParkedQuery};
use crate::storage::{IngestOp, WriteOp};
use crate::stream::{AppendInput, AppendOutput, Authority, EventInput, Namespace, StreamAddress};

impl Host {
    /// Accepts `events` for `stream`: once this answers they are durable
    /// and will be appended in order, once each (their idempotency keys are
    /// required). Answers how many were accepted.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::EventInput;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// let accepted = host
    ///     .ingest(&orders, vec![EventInput::new("events.example/order-created").idempotency_key("order-7")])
    ///     .await?;
    /// assert_eq!(accepted, 1);
    /// # Ok(()) }
    /// ```
    pub async fn ingest(
        &self,
        stream: &StreamAddress,
        events: Vec<EventInput>,
    ) -> Result<usize, Error> {
        // A project at its storage bound accepts nothing it could not store.
        let project = stream.namespace.storage_key();
        let bytes: u64 = events
            .iter()
            .map(|e| serde_json::to_string(e).map_or(0, |b| b.len() as u64))
            .sum();
        self.streams.stored().check(project, bytes)?;
        let now = format_timestamp(self.streams.now_ms());
        crate::ingest::accept::accept(self.streams.storage(), &self.ingest, stream, events, now)
            .await
    }

    /// Pending ingest and the JetStream bridge (with several hosts, the
    /// pending events of all of them).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// let status = host.ingest_status().await?;
    /// assert_eq!(status.http.last_error, None);
    /// assert!(status.nats.is_none()); // no JetStream bridge configured
    /// # Ok(()) }
    /// ```
    pub async fn ingest_status(&self) -> Result<IngestStatus, Error> {
        let mut status = self.ingest.status();
        status.http.drops = self
            .read_storage("reading dropped ingest", |s| s.ingest_drops())
            .await?;
        status.http.last_error = status.http.drops.last().map(|d| {
            format!(
                "event with idempotency key {:?} for {} in {:?} could not be appended and was \
                 dropped at {}: {}",
                d.idempotency_key, d.path, d.project, d.dropped_at, d.reason
            )
        });
        status.http.parked = self
            .read_storage("reading parked ingest", |s| s.ingest_parked_by_project())
            .await?
            .iter()
            .map(|(_, n)| n)
            .sum();
        // Several hosts: what is pending is in the shared table, not in
        // this host's memory.
        if self.streams.storage().cluster().is_some() {
            let (events, bytes) = self
                .read_storage("reading pending ingest", |s| s.ingest_pending_totals())
                .await?;
            status.http.pending = events;
            status.http.bytes = bytes;
        }
        // Parked events take capacity but wait for no drain.
        status.http.pending = status.http.pending.saturating_sub(status.http.parked);
        Ok(status)
    }

    /// Registers the JetStream stream the bridge sees now (it must be
    /// empty) and consumes it: answers the bridge's status, or
    /// `registration-refused` with the reason (`nats-not-configured`
    /// without a bridge).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// // Without a JetStream bridge there is nothing to register.
    /// let refused = host.register_ingest().await.unwrap_err();
    /// assert_eq!(refused.code, "nats-not-configured");
    /// # Ok(()) }
    /// ```
    pub async fn register_ingest(&self) -> Result<BridgeStatus, Error> {
        self.ingest.register(Duration::from_secs(20)).await
    }

    /// `project`'s parked ingest events: accepted, then refused for good,
    /// kept until redriven or discarded; oldest first.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::ParkedQuery;
    ///
    /// let page = host.ingest_parked("acme", ParkedQuery::default()).await?;
    /// assert!(page.parked.is_empty());
    /// assert_eq!(page.next_after_id, None);
    /// # Ok(()) }
    /// ```
    pub async fn ingest_parked(
        &self,
        project: &str,
        query: ParkedQuery,
    ) -> Result<ParkedPage, Error> {
        Namespace::project(project)?;
        let limit = query.limit.clamp(1, crate::ingest::PARKED_LIMIT_MAX);
        let p = project.to_string();
        let rows = self
            .read_storage("reading parked ingest", move |s| {
                s.ingest_parked(&p, query.path.as_deref(), query.after_id, limit + 1)
            })
            .await?;
        let more = rows.len() > limit;
        let parked: Vec<ParkedEvent> = rows
            .into_iter()
            .take(limit)
            .map(ParkedEvent::from_row)
            .collect();
        let next_after_id = if more {
            parked.last().map(|p| p.id)
        } else {
            None
        };
        Ok(ParkedPage {
            parked,
            next_after_id,
        })
    }

    /// One parked event of `project`, or `404 parked-event-not-found`.
    async fn parked_one(&self, project: &str, id: i64) -> Result<ParkedEvent, Error> {
        Namespace::project(project)?;
        let p = project.to_string();
        self.read_storage("reading a parked ingest event", move |s| {
            s.ingest_parked_one(&p, id)
        })
        .await?
        .map(ParkedEvent::from_row)
        .ok_or_else(|| {
            Error::not_found(
                "parked-event-not-found",
                format!(
                    "project {project:?} has no parked ingest event {id} (it was redriven or \
                     discarded, or never parked)"
                ),
            )
        })
    }

    /// The parked event is settled: its row goes, which frees its capacity.
    async fn settle_parked(&self, project: &str, id: i64) -> Result<(), Error> {
        let op = IngestOp::Settle {
            project: project.to_string(),
            id,
        };
        let answer = self
            .streams
            .storage()
            .submit(WriteOp::Ingest(op))
            .await
            .map_err(|_| Error::internal("the storage writer stopped"))?
            .map_err(|e| Error::internal(format!("settling parked event {id} failed: {e}")))?;
        let (gone, bytes) = IngestOp::accepted(answer);
        self.ingest.release(project, gone, bytes);
        Ok(())
    }

    /// Appends parked event `id` of `project` again (its idempotency key
    /// makes it land once at most) and, once it is in its stream, settles
    /// it. Answers the append's answer; a refusal answers as the append
    /// would, and the event stays parked.
    pub async fn redrive_parked(&self, project: &str, id: i64) -> Result<AppendOutput, Error> {
        let parked = self.parked_one(project, id).await?;
        let event: EventInput = parked
            .event
            .clone()
            .and_then(|e| serde_json::from_value(e).ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "parked event {id} is not an event ({}): it cannot be redriven; publish it \
                     again fixed, then discard this one",
                    parked.reason
                ))
            })?;
        let address = StreamAddress::new(Namespace::project(project)?, &parked.path)?;
        let input = AppendInput {
            events: vec![event],
            expected_stream_id: None,
        };
        let output = self
            .streams
            .append(&address, input, Authority::Public)
            .await?;
        self.settle_parked(project, id).await?;
        Ok(output)
    }

    /// Drops parked event `id` of `project` for good: one
    /// `error-occurred` line on its stream records it (when the event names
    /// a stream), then it is settled. Answers the event as it was parked.
    pub async fn discard_parked(&self, project: &str, id: i64) -> Result<ParkedEvent, Error> {
        let parked = self.parked_one(project, id).await?;
        if let Ok(address) = StreamAddress::new(Namespace::project(project)?, &parked.path) {
            let key = parked
                .event
                .as_ref()
                .and_then(|e| e.get("idempotencyKey"))
                .and_then(|k| k.as_str())
                .map(|k| format!(" (idempotency key {k:?})"))
                .unwrap_or_default();
            let mut payload = serde_json::Map::new();
            payload.insert(
                "message".into(),
                serde_json::Value::String(format!(
                    "parked ingest event {id}{key} was discarded; it was refused for good: {}",
                    parked.reason
                )),
            );
            payload.insert(
                "ingest".into(),
                serde_json::json!({
                    "parkedId": id,
                    "source": parked.source,
                    "acceptedAt": parked.accepted_at,
                    "parkedAt": parked.parked_at,
                    "event": parked.event,
                }),
            );
            let line = EventInput {
                event_type: crate::stream::types::ERROR_OCCURRED.to_string(),
                payload: Some(payload),
                metadata: None,
                idempotency_key: Some(format!("ingest-discarded:{id}:{}", parked.parked_at)),
                ephemeral: None,
                offset: None,
                source: None,
                trace: None,
                redacted: None,
            };
            let input = AppendInput {
                events: vec![line],
                expected_stream_id: None,
            };
            self.streams
                .append(&address, input, Authority::Platform)
                .await?;
        }
        self.settle_parked(project, id).await?;
        Ok(parked)
    }
}
