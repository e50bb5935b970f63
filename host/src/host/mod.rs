//! The host: storage, stream actors, auth and metrics wired together from a
//! [`Config`]. This is the embedding API: open a host, then serve it over HTTP
//! or call it directly. Each family of operations has its module: streams
//! here and in [`streams`], then [`components`], [`processors`], [`backfill`], [`itx`], [`ingest`], [`live`],
//! [`effects`], [`subscriptions`] and [`cluster`];
//! [`request`] is every stream operation as one typed request, applied by
//! [`Host::apply`].

/// The setters of an event selection (`event_types`, `jsonata_condition`)
/// that a connection, a wait and a backfill share.
macro_rules! selection_setters {
    () => {
        /// Only events of these types.
        pub fn event_types<S: Into<String>>(mut self, types: impl IntoIterator<Item = S>) -> Self {
            self.event_types = Some(types.into_iter().map(Into::into).collect());
            self
        }

        /// Only events for which `expression` (JSONata) is truthy.
        pub fn condition(mut self, expression: impl Into<String>) -> Self {
            self.jsonata_condition = Some(expression.into());
            self
        }
    };
}

/// `after` and `through` of a backfill's range (`after_offset`,
/// `through_offset`).
macro_rules! range_setters {
    () => {
        /// Only the events after `offset`.
        pub fn after(mut self, offset: u64) -> Self {
            self.after_offset = offset;
            self
        }

        /// Only the events up to `offset`.
        pub fn through(mut self, offset: u64) -> Self {
            self.through_offset = Some(offset);
            self
        }
    };
}

pub mod attention;
pub mod backfill;
pub mod backup;
pub mod cluster;
pub mod components;
pub mod durable;
pub mod effects;
pub mod ingest;
pub mod itx;
pub mod live;
pub mod processors;
pub mod reactors;
pub mod redact;
pub mod request;
pub mod retention;
pub mod secrets;
pub mod shadows;
pub mod streams;
pub mod subscriptions;
pub mod trace;
mod wait;

use std::sync::Arc;

use anyhow::{Context, Result};

use crate::actor::{RuntimeView, Streams};
use crate::auth::Auth;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::storage::Storage;
use crate::stream::{
    AppendInput, AppendOutput, CoreState, Event, EventInput, Namespace, ReadQuery, StreamAddress,
};
use crate::subscription::Subscription;
use request::{StreamAnswer, StreamRequest};

/// Webhook POSTs at once to all destinations together: no bound of its
/// own (each destination has its share; the deliveries' and effects'
/// concurrency bound the rest).
const DESTINATIONS_MAX: usize = 1 << 20;

/// A running streamhost. Cheap to clone.
#[derive(Clone)]
pub struct Host {
    /// The configuration it was opened with.
    pub(crate) config: Arc<Config>,
    /// The stream registry: every stream actor.
    pub(crate) streams: Streams,
    /// Bearer-token authentication.
    pub(crate) auth: Arc<Auth>,
    /// Prometheus metrics.
    pub(crate) metrics: Metrics,
    /// Ingest with broker acceptance (HTTP buffer, JetStream bridge).
    pub(crate) ingest: crate::ingest::Ingest,
    /// Sends requests for streams another host owns to it (several hosts).
    forwarder: reqwest::Client,
    /// The Durable Streams protocol's per-stream write order and access times.
    pub(crate) durable: Arc<durable::DurableStreams>,
    /// The streams this host applies retention to.
    pub(crate) retained: Arc<retention::Retained>,
}

impl Host {
    /// Opens the data directory and starts the storage writer. Must be called
    /// inside a Tokio runtime.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// use streamhost::{Config, Host};
    ///
    /// let host = Host::open(Config { data_dir: dir.path().join("data"), ..Config::default() })?;
    /// assert_eq!(host.config().data_dir, dir.path().join("data"));
    /// # Ok(()) }
    /// ```
    pub fn open(config: Config) -> Result<Host> {
        Self::open_with_clock(config, Arc::new(SystemClock))
    }

    /// As [`Host::open`], with an injected clock.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicI64, Ordering};
    /// use streamhost::{Clock, Config, EventInput, Host};
    ///
    /// /// A clock the program moves by hand.
    /// struct Manual(AtomicI64);
    /// impl Clock for Manual {
    ///     fn now_ms(&self) -> i64 {
    ///         self.0.load(Ordering::Relaxed)
    ///     }
    /// }
    ///
    /// let clock = Arc::new(Manual(AtomicI64::new(1_800_000_000_000)));
    /// let config = Config { data_dir: dir.path().into(), ..Config::default() };
    /// let host = Host::open_with_clock(config, clock.clone())?;
    /// let orders = host.stream("acme", "/orders")?;
    /// let out = host.append(&orders, [EventInput::new("events.example/order-created")]).await?;
    /// assert_eq!(out.events[0].created_at, "2027-01-15T08:00:00.000Z");
    /// # Ok(()) }
    /// ```
    pub fn open_with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Host> {
        // PostgreSQL's blocking client runs a runtime of its own, which
        // cannot start on a thread that drives async tasks (an embedding
        // program opens its host inside its runtime, often a current-thread
        // one): the host opens on a thread of its own, in the caller's
        // runtime's context (its background tasks start there).
        let runtime = tokio::runtime::Handle::try_current().ok();
        std::thread::scope(|s| {
            s.spawn(|| {
                let _entered = runtime.as_ref().map(|r| r.enter());
                Self::open_here(config, clock)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn open_here(config: Config, clock: Arc<dyn Clock>) -> Result<Host> {
        config.validate()?;
        let metrics = Metrics::new();
        let commits = metrics.commit_observer();
        let storage = match config.postgres_url()? {
            Some(url) => Storage::open_postgres(
                url,
                &config.data_dir,
                config.cluster.advertise_url.as_deref().unwrap_or_default(),
                config.cluster.lease_ms,
                config.cluster.db_timeout_ms,
                config.storage_bounds(),
                commits,
            ),
            None => Storage::open(
                &config.data_dir,
                config.durability,
                config.storage_bounds(),
                commits,
            ),
        }
        .context("opening storage")?;
        backup::clear_scratch(&config.data_dir);
        let pending = storage
            .ingest_pending_by_project()
            .context("counting pending ingest")?;
        let waking = storage
            .streams_with_cursors()
            .context("listing streams with subscriptions")?;
        let runtime = crate::processor::runtime::Runtime::with_compiled_code_bytes(
            config
                .processors
                .compile_cache_dir
                .clone()
                .unwrap_or_else(|| config.data_dir.join("compiled")),
            config.processors.compiled_code_bytes,
        )
        .context("starting the wasm runtime")?;
        // Each project's stored bytes, when they are bounded.
        let stored = crate::quota::StoredBytes::new(config.limits.max_project_bytes);
        if stored.max().is_some() {
            stored.refresh(
                storage
                    .project_bytes()
                    .context("counting each project's stored bytes")?,
            );
        }
        let settings = crate::actor::StreamSettings {
            delivery: config.delivery.clone(),
            webhooks: crate::executor::webhook::Client::new(
                config.deny_private_networks(),
                config.effects.per_destination_rate,
            )
            .context("building the webhook client")?,
            idle_stream_ms: config.limits.idle_stream_ms,
            max_live_connections_per_project: config.limits.max_live_connections_per_project,
            max_ephemeral_bytes: config.limits.max_ephemeral_bytes,
            stored: stored.clone(),
            calls: crate::processor::share::Shares::new(
                config.processors.max_concurrent_calls,
                config.processors.max_concurrent_calls_per_project,
            ),
            destinations: crate::processor::share::Shares::new(
                DESTINATIONS_MAX,
                config.effects.per_destination_concurrency,
            ),
            bounds: config.delivery_bounds(),
            telemetry: crate::telemetry::Telemetry::start(&config.telemetry, metrics.clone())
                .context("starting the trace export")?,
        };
        let streams = Streams::new(storage, clock.clone(), metrics.clone(), settings, runtime);
        if stored.max().is_some() {
            refresh_stored_bytes(streams.downgrade(), stored);
        }
        crate::executor::effect::start(
            streams.executors().streams.clone(),
            streams.executors().effects.clone(),
            crate::executor::effect::Settings {
                effects: config.effects.clone(),
                delivery: config.delivery.clone(),
                clock,
            },
        );
        let ingest =
            crate::ingest::Ingest::new(config.ingest.clone(), config.delivery.clone(), pending);
        crate::ingest::drain::start(streams.downgrade(), ingest.clone());
        if let Some(url) = &config.ingest.nats_url {
            crate::ingest::nats::start(
                streams.downgrade(),
                ingest.clone(),
                url.clone(),
                crate::ingest::nats::Placement {
                    storage: config.ingest.nats_storage,
                    replicas: config.ingest.nats_replicas,
                },
            );
        }
        // What a new version set off and a previous process did not finish
        // (resumes, refolds) is done now.
        {
            let streams = streams.clone();
            let timeout_ms = config.delivery.timeout_ms;
            tokio::spawn(async move {
                // Folds' keyed state no pending refold or shadow can resume.
                let swept = streams
                    .storage()
                    .submit(crate::storage::WriteOp::Scratch(
                        crate::storage::ScratchOp::Sweep,
                    ))
                    .await;
                if let Ok(Err(e)) = swept {
                    tracing::warn!(error = %e, "dropping folds' keyed state left by a previous process");
                }
                crate::rollout::versions::resume_pending(&streams).await;
                crate::rollout::refold::resume_pending(&streams, timeout_ms).await;
                crate::rollout::shadow::resume_pending(&streams, timeout_ms).await
            });
        }
        // Several hosts: renew this host's leases, and take over the streams
        // of hosts that stopped renewing theirs (their deliveries, wakes and
        // effects resume here): on every renewal, and at once when a host
        // announces it stopped (LISTEN/NOTIFY).
        if let Some(me) = streams.storage().cluster().cloned() {
            let renewed = Arc::new(tokio::sync::Notify::new());
            watch_tenure(streams.clone(), renewed.clone());
            let streams = streams.clone();
            let (stopped, mut heard) = tokio::sync::mpsc::unbounded_channel();
            streams.storage().listen_for_stopped_hosts(stopped);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(me.heartbeat());
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        Some(host) = heard.recv() => {
                            tracing::info!(host = %host, "a host stopped: taking over its streams");
                        }
                    }
                    let storage = streams.storage().clone();
                    let lapses = storage.lease_lapses();
                    let expired = tokio::task::spawn_blocking(move || {
                        storage.heartbeat()?;
                        storage.expired_leases()
                    })
                    .await;
                    renewed.notify_one();
                    if streams.storage().lease_lapses() != lapses {
                        // The database let this host's leases expire: other
                        // hosts may have taken streams its actors hold.
                        tracing::warn!("this host's leases had expired in the database: its streams are loaded again");
                        streams.lease_changed();
                    }
                    let expired = match expired {
                        Ok(Ok(expired)) => expired,
                        Ok(Err(e)) => {
                            tracing::error!(error = %format!("{e:#}"), "renewing this host's leases failed");
                            continue;
                        }
                        Err(_) => continue,
                    };
                    for (project, path) in expired {
                        let namespace = Namespace::from_storage_key(&project);
                        if let Ok(address) = StreamAddress::new(namespace, &path) {
                            tracing::info!(stream = %address, "taking over a stream whose owner stopped renewing its lease");
                            let streams = streams.clone();
                            tokio::spawn(async move { streams.wake(&address).await });
                        }
                    }
                }
            });
        }
        let retained = Arc::new(retention::Retained::default());
        retention::start(streams.downgrade(), retained.clone());
        // Streams with subscriptions resume delivering without waiting for a touch.
        for (project, path) in waking {
            let namespace = Namespace::from_storage_key(&project);
            if let Ok(address) = StreamAddress::new(namespace, &path) {
                let streams = streams.clone();
                tokio::spawn(async move { streams.wake(&address).await });
            }
        }
        Ok(Host {
            auth: Arc::new(Auth::new(&config.tokens)),
            config: Arc::new(config),
            streams,
            metrics,
            ingest,
            forwarder: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(2))
                .build()
                .context("building the forwarding client")?,
            durable: Arc::default(),
            retained,
        })
    }

    /// The configuration it was opened with.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// assert_eq!(host.config().data_dir, dir.path());
    /// # Ok(()) }
    /// ```
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Why this host cannot write now (`None`: it can): its storage writer
    /// stopped, or its last transaction failed as a whole (a full disk, a
    /// lost database). Cleared by the next commit. `GET /healthz` answers
    /// `503` while it is set.
    pub fn unable_to_write(&self) -> Option<String> {
        self.streams.storage().unable_to_write()
    }

    /// The stream registry (with the `internals` feature: the crate's own
    /// benchmarks and tests).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    /// Prometheus metrics (with the `internals` feature).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The client that forwards requests to a stream's owning host.
    pub(crate) fn forwarder(&self) -> &reqwest::Client {
        &self.forwarder
    }

    /// The address of stream `path` in `project` (canonicalized); a bad
    /// project or path is an error naming it.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// let orders = host.stream("acme", "/orders/eu/")?;
    /// assert_eq!(orders.path, "/orders/eu");
    ///
    /// let bad = host.stream("Acme Corp", "/orders").unwrap_err();
    /// assert_eq!(bad.kind, streamhost::ErrorKind::Invalid);
    /// assert!(bad.message.contains("Acme Corp"), "{}", bad.message);
    /// # Ok(()) }
    /// ```
    pub fn stream(&self, project: &str, path: &str) -> Result<StreamAddress, Error> {
        StreamAddress::new(Namespace::project(project)?, path)
    }

    /// Appends events to a stream (creating it) as an API caller would:
    /// answered once they are durably committed.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use serde_json::json;
    /// use streamhost::EventInput;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// let order = EventInput::new("events.example/order-created")
    ///     .payload(json!({"total": 120}))
    ///     .idempotency_key("order-1");
    /// let out = host.append(&orders, [order.clone()]).await?;
    /// assert_eq!(out.events[0].offset, 2); // offset 1: the stream's creation
    ///
    /// // The same idempotency key again: the first append's event, not a new one.
    /// let again = host.append(&orders, [order]).await?;
    /// assert_eq!(again.events[0].offset, 2);
    /// # Ok(()) }
    /// ```
    pub async fn append(
        &self,
        stream: &StreamAddress,
        events: impl IntoIterator<Item = EventInput>,
    ) -> Result<AppendOutput, Error> {
        let append = StreamRequest::Append(AppendInput::new(events));
        match self.apply(stream, append).await? {
            StreamAnswer::Appended { output, .. } => Ok(output),
            other => Err(other.unexpected()),
        }
    }

    /// Up to `limit` (at most 500) committed events after `after_offset`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::EventInput;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.append(&orders, [EventInput::new("events.example/order-created")]).await?;
    /// let events = host.events(&orders, 0, 100).await?;
    /// let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    /// assert_eq!(types, ["events.iterate.com/stream/created", "events.example/order-created"]);
    /// # Ok(()) }
    /// ```
    pub async fn events(
        &self,
        stream: &StreamAddress,
        after_offset: u64,
        limit: usize,
    ) -> Result<Vec<Event>, Error> {
        let read = StreamRequest::Events(ReadQuery {
            after_offset,
            limit,
            include_ephemeral: false,
        });
        let page = match self.apply(stream, read).await? {
            StreamAnswer::Events(page) => page,
            other => return Err(other.unexpected()),
        };
        page.events
            .iter()
            .map(|raw| {
                serde_json::from_str(raw.get())
                    .map_err(|e| Error::internal(format!("parsing a stored event: {e}")))
            })
            .collect()
    }

    /// A stream's reduced core state.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::EventInput;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.append(&orders, [EventInput::new("events.example/order-created")]).await?;
    /// let state = host.state(&orders).await?;
    /// assert_eq!((state.max_offset, state.event_count), (2, 2));
    /// # Ok(()) }
    /// ```
    pub async fn state(&self, stream: &StreamAddress) -> Result<CoreState, Error> {
        match self.apply(stream, StreamRequest::State).await? {
            StreamAnswer::State(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::state`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn state_here(&self, stream: &StreamAddress) -> Result<CoreState, Error> {
        self.streams.state(stream).await
    }

    /// A stream's runtime: its subscriptions' deliveries (lag, attempts,
    /// halts, latencies) and its live connections.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::Subscription;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.subscribe(&orders, &Subscription::copy_to("audit", "/audit")).await?;
    /// let runtime = host.runtime(&orders).await?;
    /// assert!(!runtime.subscriptions["audit"].halted);
    /// assert!(runtime.connections.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn runtime(&self, stream: &StreamAddress) -> Result<RuntimeView, Error> {
        match self.apply(stream, StreamRequest::Runtime).await? {
            StreamAnswer::Runtime(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::runtime`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn runtime_here(&self, stream: &StreamAddress) -> Result<RuntimeView, Error> {
        self.streams.runtime(stream).await
    }

    /// Runs a storage read on a blocking thread; its failure is `internal`,
    /// prefixed with `what`.
    pub(crate) async fn read_storage<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Storage) -> anyhow::Result<T> + Send + 'static,
    ) -> Result<T, Error> {
        let storage = self.streams.storage().clone();
        tokio::task::spawn_blocking(move || f(&storage))
            .await
            .map_err(|e| Error::internal(format!("{what} panicked: {e}")))?
            .map_err(|e| Error::internal(format!("{what} failed: {e:#}")))
    }

    /// Configures `subscription` on its `source` stream; answers the
    /// `subscription-configured` event.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{EventInput, Subscription};
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// let configured = host
    ///     .subscribe(
    ///         &orders,
    ///         &Subscription::copy_to("big-orders", "/orders/big").condition("payload.total > 100"),
    ///     )
    ///     .await?;
    /// assert_eq!(configured.event_type, "events.iterate.com/stream/subscription-configured");
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(
        &self,
        source: &StreamAddress,
        subscription: &Subscription,
    ) -> Result<Event, Error> {
        let mut out = self.append(source, [subscription.to_event()]).await?;
        out.events
            .pop()
            .ok_or_else(|| Error::internal("the subscription was not appended"))
    }
}

/// How often each project's stored bytes are read from storage again, at
/// most.
const STORED_BYTES_REFRESH: std::time::Duration = std::time::Duration::from_secs(2);

/// A count from storage waits at least this many times as long as the last
/// one took: its share of a reader stays at most 1/20 however many keys
/// the processors keep (the keyed state is summed key by key).
const STORED_BYTES_REST: u32 = 20;

/// Reads each project's stored bytes from storage every
/// [`STORED_BYTES_REFRESH`] or [`STORED_BYTES_REST`] times the last count's
/// time, whichever is longer (what other hosts and the platform's own
/// appends wrote, what overwrites and deletes gave back; what this host
/// admitted meanwhile was counted as it was admitted), until the registry
/// is gone.
fn refresh_stored_bytes(streams: crate::actor::StreamsRef, stored: Arc<crate::quota::StoredBytes>) {
    tokio::spawn(async move {
        // (The host counted when it opened.)
        let mut rest = STORED_BYTES_REFRESH;
        loop {
            tokio::time::sleep(rest).await;
            let Some(streams) = streams.upgrade() else {
                return;
            };
            let storage = streams.storage().clone();
            drop(streams);
            let started = std::time::Instant::now();
            match tokio::task::spawn_blocking(move || storage.project_bytes()).await {
                Ok(Ok(usage)) => stored.refresh(usage),
                Ok(Err(e)) => {
                    tracing::warn!(error = %format!("{e:#}"), "counting each project's stored bytes failed")
                }
                Err(_) => {}
            }
            rest = STORED_BYTES_REFRESH.max(started.elapsed() * STORED_BYTES_REST);
        }
    });
}

/// Several hosts: tells the stream actors when this host's leases lapse
/// (at `renewal start + lease-ms - margin` with no renewal since: live
/// connections end, deliveries pause) and when a renewal brings them back.
/// Runs apart from the renewals, which may hang on the database.
fn watch_tenure(streams: Streams, renewed: Arc<tokio::sync::Notify>) {
    tokio::spawn(async move {
        loop {
            let storage = streams.storage();
            let left = storage
                .lease_valid_until_ms()
                .saturating_sub(crate::storage::tenure_clock_ms());
            if left > 0 {
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(left)) => {}
                    _ = renewed.notified() => {}
                }
                continue;
            }
            if storage.is_stopping() {
                streams.lease_changed();
                return;
            }
            tracing::warn!("this host could not renew its leases in time: it serves none of its streams until it does");
            streams.lease_changed();
            while !streams.storage().lease_valid() {
                renewed.notified().await;
            }
            tracing::info!("this host renewed its leases: serving its streams again");
            streams.lease_changed();
        }
    });
}

impl Host {
    /// A selection by event types and a JSONata condition, compiled under
    /// this host's bounds; a bad condition is `invalid-jsonata` naming
    /// `jsonataCondition`.
    pub(crate) fn selection(
        &self,
        event_types: Option<Vec<String>>,
        jsonata_condition: Option<String>,
    ) -> Result<crate::filter::CompiledFilter, Error> {
        selection(event_types, jsonata_condition, self.config.jsonata_limits())
    }
}

/// A selection by event types and a JSONata condition, compiled; a bad
/// condition is `invalid-jsonata` naming `jsonataCondition`.
pub(crate) fn selection(
    event_types: Option<Vec<String>>,
    jsonata_condition: Option<String>,
    limits: crate::jsonata::Limits,
) -> Result<crate::filter::CompiledFilter, Error> {
    let filter = crate::subscription::Filter {
        event_types,
        jsonata_condition,
    };
    crate::filter::CompiledFilter::new(Some(&filter), false, limits)
        .map_err(|m| Error::invalid_with("invalid-jsonata", format!("jsonataCondition: {m}")))
}
