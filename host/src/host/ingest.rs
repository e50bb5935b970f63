//! Ingest with broker acceptance: events accepted durably now and appended
//! in order shortly after (`202` over HTTP), and the JetStream bridge's
//! status and registration. `POST /v1/projects/{p}/ingest{path}`,
//! `GET /v1/ingest` and `POST /v1/ingest:register` over HTTP.

use std::time::Duration;

use super::Host;
use crate::clock::format_timestamp;
use crate::error::Error;
use crate::ingest::nats::BridgeStatus;
use crate::ingest::IngestStatus;
use crate::stream::{EventInput, StreamAddress};

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
        // Several hosts: what is pending is in the shared table, not in
        // this host's memory.
        if self.streams.storage().cluster().is_some() {
            let (events, bytes) = self
                .read_storage("reading pending ingest", |s| s.ingest_pending_totals())
                .await?;
            status.http.pending = events;
            status.http.bytes = bytes;
        }
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
}
