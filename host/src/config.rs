//! Server configuration: a TOML file with kebab-case keys (see API.md), every
//! key with a default, unknown keys and bad values refused at start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::stream::validate_project;

use streamhost_core::delivery::project_share;
pub use streamhost_core::delivery::DeliveryConfig;
pub use streamhost_core::stream::MAX_BODY_BYTES_DEFAULT;
pub use streamhost_storage::{
    redact, Durability, KEY_CACHE_BYTES_DEFAULT, READ_BYTES_MAX_DEFAULT, VERSIONS_KEPT_DEFAULT,
};
/// The whole server configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on (`127.0.0.1:7410`).
    pub listen: SocketAddr,
    /// Directory holding `streamhost.db` (`./streamhost-data`).
    pub data_dir: PathBuf,
    /// How hard a commit is pushed to disk before it is acknowledged.
    pub durability: Durability,
    /// Where streams are stored: `"sqlite"` (the default: `streamhost.db`
    /// in the data dir) or a PostgreSQL URL (`"postgres://user@host/db"`).
    pub storage: Option<String>,
    /// Largest request body accepted, in bytes (8 MiB); larger gets `413`.
    pub max_body_bytes: usize,
    /// Delivery of subscriptions: attempts, backoff, the timeout of one call.
    pub delivery: DeliveryConfig,
    /// Wasm processors.
    pub processors: ProcessorsConfig,
    /// The processor outbox's executors.
    pub effects: EffectsConfig,
    /// Ingest with broker acceptance.
    pub ingest: IngestConfig,
    /// Where webhooks may go.
    pub webhooks: WebhooksConfig,
    /// Memory bounds.
    pub limits: LimitsConfig,
    /// HTTP connections: timeouts and how many may be open.
    pub http: HttpConfig,
    /// Several hosts on one PostgreSQL database.
    pub cluster: ClusterConfig,
    /// Traces exported over OTLP/HTTP.
    pub telemetry: TelemetryConfig,
    /// Bearer tokens; none: the server runs open.
    pub tokens: Vec<TokenConfig>,
}

/// OpenTelemetry spans exported over OTLP/HTTP (protobuf).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's base URL (`http://127.0.0.1:4318`): spans go to
    /// `{otlp-endpoint}/v1/traces`. Unset: `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// else nothing is exported.
    pub otlp_endpoint: Option<String>,
    /// The share of new traces sampled (1.0); a trace a caller started
    /// follows the caller's sampled flag.
    pub sample_ratio: f64,
    /// Spans waiting for export at most (2048); more are dropped and
    /// counted (`streamhost_trace_spans_dropped_total`), never waited for.
    pub max_queued_spans: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            max_queued_spans: 2048,
        }
    }
}

impl TelemetryConfig {
    /// The collector's base URL: as configured, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (empty: none).
    pub fn endpoint(&self) -> Option<String> {
        self.otlp_endpoint
            .clone()
            .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
    }
}

/// Where webhooks may go.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Refuse targets on loopback, private, link-local and other
    /// non-public addresses, checked after DNS resolution (default: true
    /// when tokens are configured, false in open mode; see
    /// [`Config::deny_private_networks`]).
    pub deny_private_networks: Option<bool>,
}

/// Several hosts on one PostgreSQL database (`storage = "postgres://…"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// How the other hosts reach this one (`http://<listen>`).
    pub advertise_url: Option<String>,
    /// A host that stops renewing loses its streams after this long (5 s).
    pub lease_ms: u64,
    /// Every database call (connect, statement, lock wait, open
    /// transaction, unanswered TCP) fails after this long (5 s).
    pub db_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            advertise_url: None,
            lease_ms: 5000,
            db_timeout_ms: 5000,
        }
    }
}

/// Memory bounds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// A stream actor with no live connection, no pending or scheduled
    /// delivery and no request for this long is released (60 s).
    pub idle_stream_ms: u64,
    /// One JSONata evaluation runs at most this long (100 ms).
    pub jsonata_timeout_ms: u64,
    /// No value a JSONata evaluation builds is larger than this, in bytes of
    /// JSON (1 MiB).
    pub jsonata_max_bytes: usize,
    /// Live connections (SSE and `waitForEvent`) one project may hold (1000).
    pub max_live_connections_per_project: usize,
    /// Ephemeral events held in memory by all streams together, in bytes
    /// (256 MiB).
    pub max_ephemeral_bytes: usize,
    /// The bytes of events or keys one read holds at most: an `:events`
    /// page, a replay page of a live connection, a delivery, copy or wake
    /// scan, a key listing (4 MiB). A read always holds at least one event
    /// or key; a shorter page is continued from its last offset or key.
    pub max_read_bytes: usize,
    /// The bytes one project may store (none: unbounded): its events over
    /// all its streams (each event's type, idempotency key and body), its
    /// processors' keyed state and its components' versions. At the bound
    /// its appends, ingest, copies into it, effect appends, keyed writes
    /// and deploys are refused with `507 project-storage-full`; the
    /// platform's own facts (halts, resumes) still land.
    pub max_project_bytes: Option<u64>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            idle_stream_ms: 60_000,
            jsonata_timeout_ms: crate::jsonata::EVALUATION_TIMEOUT_MS,
            jsonata_max_bytes: crate::jsonata::VALUE_BYTES_MAX,
            max_live_connections_per_project: 1000,
            max_ephemeral_bytes: 256 * 1024 * 1024,
            max_read_bytes: READ_BYTES_MAX_DEFAULT,
            max_project_bytes: None,
        }
    }
}

/// HTTP connections: timeouts and how many may be open.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct HttpConfig {
    /// A connection that has not sent a whole request head is closed after
    /// this long (10 s).
    pub header_timeout_ms: u64,
    /// An idle keep-alive connection is closed after this long (60 s).
    pub idle_timeout_ms: u64,
    /// Reading a request body takes at most this long (30 s).
    pub body_timeout_ms: u64,
    /// Open connections at most; more wait to be accepted (4096).
    pub max_connections: usize,
    /// Open connections from one client address at most (an IPv6 client's
    /// /64 counts as one address); one more is answered `429
    /// too-many-connections` and closed (1024).
    pub max_connections_per_address: usize,
    /// With tokens configured: of `max-connections`, the last this many are
    /// kept for authenticated requests. A connection given one of them is
    /// answered `503 connections-reserved` and closed on its first request
    /// without a valid token, so unauthenticated sockets never take the last
    /// places (a sixteenth of `max-connections` unless set: 256; none in
    /// open mode, which has no tokens).
    pub reserved_connections: Option<usize>,
    /// Open mode (no tokens): the host names served besides IP addresses,
    /// `localhost` and names under `.localhost` (none). A web page whose
    /// DNS name was pointed at this server (DNS rebinding) sends its own
    /// name as `Host`, and is refused.
    pub allowed_hosts: Vec<String>,
    /// A Durable Streams long-poll (`/ds/...?live=long-poll`) waits this
    /// long for data before `204` (20 s).
    pub long_poll_ms: u64,
}

impl HttpConfig {
    /// `reserved-connections`, or its default.
    pub fn reserved(&self) -> usize {
        self.reserved_connections
            .unwrap_or(self.max_connections / 16)
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            body_timeout_ms: 30_000,
            max_connections: 4096,
            max_connections_per_address: 1024,
            reserved_connections: None,
            allowed_hosts: Vec::new(),
            long_poll_ms: 20_000,
        }
    }
}

/// Processor runtime settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ProcessorsConfig {
    /// Idle time after which a processor instance is torn down (5 min).
    pub idle_teardown_ms: u64,
    /// Bytes of committed keyed-state values the host keeps in memory, over
    /// all processors (256 MiB).
    pub keyed_cache_bytes: u64,
    /// Where compiled components are kept (default `DATA_DIR/compiled`).
    /// Each file is named by the component's digest and the engine's
    /// configuration and checked before it is loaded, so servers may share
    /// one directory.
    pub compile_cache_dir: Option<std::path::PathBuf>,
    /// Bytes of compiled code kept in memory, over all components (512
    /// MiB): past it the least recently used components' code is dropped
    /// and loaded again from `compile-cache-dir` when next used (a
    /// JavaScript component holds about 35 MiB, a Python one about 50).
    pub compiled_code_bytes: usize,
    /// Calls into components running at once on this host: ITX calls, folds
    /// to an offset, shadow steps (256; well under the 512 blocking
    /// threads, which also serve storage reads).
    pub max_concurrent_calls: usize,
    /// Of those, one project's at most (16): more wait their turn (an ITX
    /// call over HTTP at most a second, then `429 too-many-calls`).
    pub max_concurrent_calls_per_project: usize,
    /// Versions of one component kept (50): a deploy past it lets the
    /// oldest go from the history, and their bytes once nothing else (a
    /// current component, a pending refold or shadow, a checkpoint) names
    /// them.
    pub max_versions_per_component: usize,
}

/// The processor outbox's executors.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct EffectsConfig {
    /// Executions of one effect before it is `failed` (15).
    pub max_attempts: u32,
    /// A `running` effect whose executor vanished is retried after this
    /// (30 s); longer than `delivery.timeout-ms`, which bounds one execution.
    pub lease_ms: u64,
    /// Effects executing at once (256): catching up is bound by how many
    /// wait on their commits at once, not by the CPU.
    pub concurrency: usize,
    /// One project's share of them (a quarter of `concurrency`, at least
    /// 1; see [`EffectsConfig::project_concurrency`]): past it, a project's
    /// effects wait while another's are due, and take no place of the
    /// last share's worth, so a project whose receivers hang leaves the
    /// others room.
    pub concurrency_per_project: Option<usize>,
    /// Webhook POSTs to one destination (a URL's host name) at once,
    /// subscription deliveries and effects alike (8): a slow receiver
    /// holds these, not every place of the host's.
    pub per_destination_concurrency: usize,
    /// Webhook POSTs a second to one destination (unset: unlimited): the
    /// POSTs past it are spaced out (after their place, within their
    /// timeout).
    pub per_destination_rate: Option<f64>,
}

impl EffectsConfig {
    /// Effects of one project executing at once.
    pub fn project_concurrency(&self) -> usize {
        project_share(self.concurrency_per_project, self.concurrency)
    }
}

impl Default for EffectsConfig {
    fn default() -> Self {
        EffectsConfig {
            max_attempts: 15,
            lease_ms: 30_000,
            concurrency: 256,
            concurrency_per_project: None,
            per_destination_concurrency: 8,
            per_destination_rate: None,
        }
    }
}

/// Ingest with broker acceptance: the HTTP buffer's capacity and the
/// JetStream bridge.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Events accepted and not yet appended, at most (50 000).
    pub max_pending_events: u64,
    /// Bytes of those events, at most (512 MiB).
    pub max_pending_bytes: u64,
    /// Largest event accepted, in bytes of its JSON (1 MiB).
    pub max_event_bytes: u64,
    /// Events one project may have pending (a quarter of
    /// `max-pending-events`; see [`IngestConfig::project_events`]).
    pub max_pending_events_per_project: Option<u64>,
    /// Bytes one project may have pending (a quarter of `max-pending-bytes`).
    pub max_pending_bytes_per_project: Option<u64>,
    /// Consume the JetStream stream `STREAMHOST_INGEST` of this server.
    pub nats_url: Option<String>,
    /// The stream's storage: `"file"` (the default; the only durable one)
    /// or `"memory"` (development only: capped at 20 MiB, lost when the
    /// broker restarts; a memory stream is refused unless asked for).
    pub nats_storage: NatsStorage,
    /// Copies of the stream a JetStream cluster keeps (1 to 5; 1, the
    /// default, on a single server). A registered stream with another count
    /// is updated in place at start.
    pub nats_replicas: usize,
}

/// The JetStream storage of the ingest stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NatsStorage {
    /// On the broker's disk: what the broker accepted survives its restart.
    #[default]
    File,
    /// In the broker's memory, capped at 20 MiB: for development, not
    /// durable.
    Memory,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            max_pending_events: 50_000,
            max_pending_bytes: 512 * 1024 * 1024,
            max_event_bytes: 1024 * 1024,
            max_pending_events_per_project: None,
            max_pending_bytes_per_project: None,
            nats_url: None,
            nats_storage: NatsStorage::File,
            nats_replicas: 1,
        }
    }
}

impl IngestConfig {
    /// Events one project may have pending.
    pub fn project_events(&self) -> u64 {
        self.max_pending_events_per_project
            .unwrap_or((self.max_pending_events / 4).max(1))
    }

    /// Bytes one project may have pending.
    pub fn project_bytes(&self) -> u64 {
        self.max_pending_bytes_per_project
            .unwrap_or((self.max_pending_bytes / 4).max(self.max_event_bytes))
    }
}

/// A bearer token and what it may touch. `Debug` never shows the token.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TokenConfig {
    /// The bearer token (never shown by `Debug`).
    pub token: String,
    /// Projects it may use.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Everything, including the global namespace.
    #[serde(default)]
    pub admin: bool,
    /// What it may do in its projects (`"configure"`, the default, or
    /// `"append"`).
    #[serde(default)]
    pub scope: Scope,
}

/// What a project token may do in its projects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Everything in its projects: events, subscriptions, reactors,
    /// deploys, effect actions.
    #[default]
    Configure,
    /// Append and read events only: no platform configuration event
    /// (subscriptions, pause, resume, cursors), deploy or effect action.
    Append,
}

impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConfig")
            .field("token", &"<redacted>")
            .field("projects", &self.projects)
            .field("admin", &self.admin)
            .field("scope", &self.scope)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7410)),
            data_dir: PathBuf::from("./streamhost-data"),
            durability: Durability::Full,
            storage: None,
            max_body_bytes: MAX_BODY_BYTES_DEFAULT,
            delivery: DeliveryConfig::default(),
            processors: ProcessorsConfig::default(),
            effects: EffectsConfig::default(),
            ingest: IngestConfig::default(),
            webhooks: WebhooksConfig::default(),
            limits: LimitsConfig::default(),
            http: HttpConfig::default(),
            cluster: ClusterConfig::default(),
            telemetry: TelemetryConfig::default(),
            tokens: Vec::new(),
        }
    }
}

impl Default for ProcessorsConfig {
    fn default() -> Self {
        ProcessorsConfig {
            idle_teardown_ms: 5 * 60 * 1000,
            keyed_cache_bytes: KEY_CACHE_BYTES_DEFAULT,
            compile_cache_dir: None,
            compiled_code_bytes: crate::processor::cache::PREPARED_BYTES_MAX,
            max_concurrent_calls: 256,
            max_concurrent_calls_per_project: 16,
            max_versions_per_component: VERSIONS_KEPT_DEFAULT,
        }
    }
}

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Config> {
        let config: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        Config::from_toml(&text).with_context(|| format!("in config file {}", path.display()))
    }

    /// The PostgreSQL URL of `storage`, or `None` for SQLite; an error
    /// names a value that is neither.
    pub fn postgres_url(&self) -> Result<Option<&str>> {
        match self.storage.as_deref() {
            None | Some("sqlite") => Ok(None),
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Ok(Some(url))
            }
            Some(other) => bail!(
                "storage {:?} is not \"sqlite\" or a PostgreSQL URL (postgres://user@host/db)",
                redact(other)
            ),
        }
    }

    /// Whether webhooks may not reach non-public addresses: as configured,
    /// else on exactly when tokens are configured.
    pub fn deny_private_networks(&self) -> bool {
        self.webhooks
            .deny_private_networks
            .unwrap_or(!self.tokens.is_empty())
    }

    /// What the configuration bounds in storage: the key cache, one read's
    /// bytes, the versions a deploy keeps.
    pub(crate) fn storage_bounds(&self) -> crate::storage::Bounds {
        crate::storage::Bounds {
            key_cache_bytes: self.processors.keyed_cache_bytes,
            read_bytes_max: self.limits.max_read_bytes,
            versions_kept: self.processors.max_versions_per_component,
        }
    }

    /// What the configuration bounds in deliveries' work: the JSONata
    /// limits and the largest event a transform may make.
    pub(crate) fn delivery_bounds(&self) -> crate::delivery::Bounds {
        crate::delivery::Bounds {
            jsonata: self.jsonata_limits(),
            event_bytes_max: self.max_body_bytes,
        }
    }

    /// The bounds of this host's JSONata evaluations (`[limits]`).
    pub(crate) fn jsonata_limits(&self) -> crate::jsonata::Limits {
        crate::jsonata::Limits {
            timeout_ms: self.limits.jsonata_timeout_ms,
            max_bytes: self.limits.jsonata_max_bytes,
        }
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<()> {
        self.postgres_url()?;
        if self.max_body_bytes == 0 {
            bail!("max-body-bytes must be at least 1, got 0");
        }
        let d = &self.delivery;
        if d.max_attempts == 0 {
            bail!("delivery.max-attempts must be at least 1, got 0");
        }
        if d.backoff_base_ms == 0 {
            bail!("delivery.backoff-base-ms must be at least 1, got 0");
        }
        if d.backoff_max_ms < d.backoff_base_ms {
            bail!(
                "delivery.backoff-max-ms ({}) is below delivery.backoff-base-ms ({})",
                d.backoff_max_ms,
                d.backoff_base_ms
            );
        }
        if d.timeout_ms == 0 {
            bail!("delivery.timeout-ms must be at least 1, got 0");
        }
        if self.cluster.db_timeout_ms < 100 {
            bail!(
                "cluster.db-timeout-ms must be at least 100, got {}",
                self.cluster.db_timeout_ms
            );
        }
        if self.cluster.lease_ms < 100 {
            bail!(
                "cluster.lease-ms must be at least 100, got {}",
                self.cluster.lease_ms
            );
        }
        let t = &self.telemetry;
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            bail!(
                "telemetry.sample-ratio must be between 0.0 and 1.0, got {}",
                t.sample_ratio
            );
        }
        if t.max_queued_spans == 0 {
            bail!("telemetry.max-queued-spans must be at least 1, got 0");
        }
        if let Some(url) = &t.otlp_endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("telemetry.otlp-endpoint {url:?} is not an http:// or https:// URL");
            }
        }
        if let Some(url) = &self.cluster.advertise_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("cluster.advertise-url {url:?} is not an http:// or https:// URL");
            }
        }
        let l = &self.limits;
        for (name, v) in [
            ("idle-stream-ms", l.idle_stream_ms),
            ("jsonata-timeout-ms", l.jsonata_timeout_ms),
            ("jsonata-max-bytes", l.jsonata_max_bytes as u64),
            (
                "max-live-connections-per-project",
                l.max_live_connections_per_project as u64,
            ),
            ("max-ephemeral-bytes", l.max_ephemeral_bytes as u64),
            ("max-read-bytes", l.max_read_bytes as u64),
            ("max-project-bytes", l.max_project_bytes.unwrap_or(1)),
        ] {
            if v == 0 {
                bail!("limits.{name} must be at least 1, got 0");
            }
        }
        let h = &self.http;
        for (name, v) in [
            ("header-timeout-ms", h.header_timeout_ms),
            ("idle-timeout-ms", h.idle_timeout_ms),
            ("body-timeout-ms", h.body_timeout_ms),
            ("max-connections", h.max_connections as u64),
            (
                "max-connections-per-address",
                h.max_connections_per_address as u64,
            ),
        ] {
            if v == 0 {
                bail!("http.{name} must be at least 1, got 0");
            }
        }
        if h.reserved() >= h.max_connections {
            bail!(
                "http.reserved-connections ({}) must be fewer than http.max-connections ({}): \
                 some connections must be open to anyone",
                h.reserved(),
                h.max_connections
            );
        }
        let p = &self.processors;
        for (name, v) in [
            ("idle-teardown-ms", p.idle_teardown_ms),
            ("max-concurrent-calls", p.max_concurrent_calls as u64),
            (
                "max-concurrent-calls-per-project",
                p.max_concurrent_calls_per_project as u64,
            ),
            (
                "max-versions-per-component",
                p.max_versions_per_component as u64,
            ),
            ("compiled-code-bytes", p.compiled_code_bytes as u64),
        ] {
            if v == 0 {
                bail!("processors.{name} must be at least 1, got 0");
            }
        }
        if d.concurrency == 0 {
            bail!("delivery.concurrency must be at least 1, got 0");
        }
        match d.concurrency_per_project {
            Some(0) => bail!("delivery.concurrency-per-project must be at least 1, got 0"),
            Some(v) if v > d.concurrency => bail!(
                "delivery.concurrency-per-project ({v}) is above the total it is a share of ({})",
                d.concurrency
            ),
            _ => {}
        }
        let e = &self.effects;
        if e.max_attempts == 0 {
            bail!("effects.max-attempts must be at least 1, got 0");
        }
        if e.concurrency == 0 {
            bail!("effects.concurrency must be at least 1, got 0");
        }
        if e.concurrency_per_project == Some(0) {
            bail!("effects.concurrency-per-project must be at least 1, got 0");
        }
        if e.per_destination_concurrency == 0 {
            bail!("effects.per-destination-concurrency must be at least 1, got 0");
        }
        if let Some(rate) = e.per_destination_rate {
            if !(rate.is_finite() && rate > 0.0) {
                bail!("effects.per-destination-rate must be a number of requests a second above 0, got {rate}");
            }
        }
        if e.lease_ms <= d.timeout_ms {
            bail!(
                "effects.lease-ms ({}) must be longer than delivery.timeout-ms ({}), \
                 which bounds one execution: a shorter lease would run an effect twice at once",
                e.lease_ms,
                d.timeout_ms
            );
        }
        let i = &self.ingest;
        for (name, v) in [
            ("max-pending-events", i.max_pending_events),
            ("max-pending-bytes", i.max_pending_bytes),
            ("max-event-bytes", i.max_event_bytes),
        ] {
            if v == 0 {
                bail!("ingest.{name} must be at least 1, got 0");
            }
        }
        for (name, v, total) in [
            (
                "max-pending-events-per-project",
                i.max_pending_events_per_project,
                i.max_pending_events,
            ),
            (
                "max-pending-bytes-per-project",
                i.max_pending_bytes_per_project,
                i.max_pending_bytes,
            ),
        ] {
            match v {
                Some(0) => bail!("ingest.{name} must be at least 1, got 0"),
                Some(v) if v > total => {
                    bail!("ingest.{name} ({v}) is above the total it is a share of ({total})")
                }
                _ => {}
            }
        }
        if !(1..=5).contains(&i.nats_replicas) {
            bail!(
                "ingest.nats-replicas must be 1 to 5 (JetStream's bound), got {}",
                i.nats_replicas
            );
        }
        if i.max_event_bytes > i.project_bytes() {
            bail!(
                "ingest.max-event-bytes ({}) is above a project's share of pending bytes ({}): \
                 such an event could never be accepted",
                i.max_event_bytes,
                i.project_bytes()
            );
        }
        if i.max_event_bytes > i.max_pending_bytes {
            bail!(
                "ingest.max-event-bytes ({}) is above ingest.max-pending-bytes ({}): \
                 such an event could never be accepted",
                i.max_event_bytes,
                i.max_pending_bytes
            );
        }
        if let Some(url) = &i.nats_url {
            if url.trim().is_empty() {
                bail!("ingest.nats-url is empty");
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, t) in self.tokens.iter().enumerate() {
            if t.token.trim().is_empty() {
                bail!("tokens[{i}].token is empty");
            }
            if !seen.insert(&t.token) {
                bail!("tokens[{i}].token is listed twice");
            }
            if !t.admin && t.projects.is_empty() {
                bail!("tokens[{i}] grants nothing: give it projects or admin = true");
            }
            if t.admin && t.scope == Scope::Append {
                bail!(
                    "tokens[{i}] is an admin token with scope = \"append\": an admin configures \
                     everything; give an appending token its projects instead of admin = true"
                );
            }
            for p in &t.projects {
                validate_project(p)
                    .map_err(|e| anyhow::anyhow!("tokens[{i}].projects: {}", e.message))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
    }

    #[test]
    fn the_api_md_example_parses() {
        let c = Config::from_toml(
            r#"
listen = "127.0.0.1:7410"
data-dir = "./streamhost-data"
durability = "full"

[delivery]
max-attempts = 15
backoff-base-ms = 1000
backoff-max-ms = 1800000
timeout-ms = 20000

[processors]
idle-teardown-ms = 300000
keyed-cache-bytes = 268435456

[effects]
max-attempts = 15
lease-ms = 30000
concurrency = 16

[ingest]
max-pending-events = 50000
max-pending-bytes = 536870912
max-event-bytes = 1048576
nats-url = "nats://127.0.0.1:4222"

[webhooks]
deny-private-networks = true

[limits]
idle-stream-ms = 60000
jsonata-timeout-ms = 100
jsonata-max-bytes = 1048576
max-live-connections-per-project = 1000
max-ephemeral-bytes = 268435456
max-read-bytes = 4194304

[http]
header-timeout-ms = 10000
idle-timeout-ms = 60000
body-timeout-ms = 30000
max-connections = 4096
max-connections-per-address = 1024

[[tokens]]
token = "s3cret-acme"
projects = ["acme"]

[[tokens]]
token = "s3cret-admin"
admin = true
"#,
        )
        .unwrap();
        assert_eq!(c.tokens.len(), 2);
        assert!(c.tokens[1].admin);
        assert_eq!(c.delivery.max_attempts, 15);
        assert!(c.deny_private_networks());
        assert_eq!(c.limits, LimitsConfig::default());
        assert_eq!(c.http, HttpConfig::default());
        assert_eq!(c.limits.idle_stream_ms, 60_000);
        assert_eq!(c.ingest.max_pending_events, 50_000);
        assert_eq!(c.ingest.nats_url.as_deref(), Some("nats://127.0.0.1:4222"));
        // The example sets 16 effects at once (the default is 64): a
        // project's share is then 4, and 12 places are open to one project.
        assert_eq!(
            c.effects,
            EffectsConfig {
                concurrency: 16,
                ..EffectsConfig::default()
            }
        );
        assert_eq!(c.effects.project_concurrency(), 4);
    }

    #[test]
    fn private_networks_are_denied_by_default_exactly_when_tokens_are_configured() {
        assert!(!Config::default().deny_private_networks());
        let with_tokens = Config::from_toml("[[tokens]]\ntoken = \"t\"\nadmin = true").unwrap();
        assert!(with_tokens.deny_private_networks());
        let opened = Config::from_toml(
            "[webhooks]\ndeny-private-networks = false\n[[tokens]]\ntoken = \"t\"\nadmin = true",
        )
        .unwrap();
        assert!(!opened.deny_private_networks());
    }

    #[test]
    fn a_projects_ingest_share_defaults_to_a_quarter() {
        let c = Config::default();
        assert_eq!(c.ingest.project_events(), 12_500);
        assert_eq!(c.ingest.project_bytes(), 128 * 1024 * 1024);
        let e = Config::from_toml("[ingest]\nmax-pending-events-per-project = 60000")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max-pending-events-per-project (60000)"), "{e}");
    }

    #[test]
    fn a_projects_delivery_share_defaults_to_a_quarter_and_names_a_bad_one() {
        let c = Config::default();
        assert_eq!(c.delivery.project_concurrency(), 256);
        let c = Config::from_toml("[delivery]\nconcurrency = 8").unwrap();
        assert_eq!(c.delivery.project_concurrency(), 2);
        let e = Config::from_toml("[delivery]\nconcurrency = 8\nconcurrency-per-project = 9")
            .unwrap_err()
            .to_string();
        assert!(e.contains("delivery.concurrency-per-project (9)"), "{e}");
        let e = Config::from_toml("[delivery]\nconcurrency = 0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("delivery.concurrency must be at least 1"), "{e}");
    }

    #[test]
    fn debug_never_shows_a_token() {
        let c = Config::from_toml("[[tokens]]\ntoken = \"s3cret-xyz\"\nadmin = true").unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret-xyz"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = Config::from_toml("listn = \"x\"").unwrap_err().to_string();
        assert!(e.contains("listn"), "{e}");
        let e = Config::from_toml("storage = \"mysql://db\"")
            .and_then(|c| c.validate())
            .unwrap_err()
            .to_string();
        assert!(e.contains("storage \"mysql://db\" is not"), "{e}");
        let pg = Config::from_toml("storage = \"postgres://app@db/streams\"").unwrap();
        assert_eq!(
            pg.postgres_url().unwrap(),
            Some("postgres://app@db/streams")
        );
        let e = Config::from_toml("durability = \"sometimes\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sometimes"), "{e}");
        let e = Config::from_toml("[delivery]\nmax-attempts = 0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max-attempts"), "{e}");
        let e = Config::from_toml("[[tokens]]\ntoken = \"t\"\nprojects = [\"Bad\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("Bad"), "{e}");
        let e = Config::from_toml("[delivery]\ntimeout-ms = 5000\n[effects]\nlease-ms = 5000")
            .unwrap_err()
            .to_string();
        assert!(e.contains("effects.lease-ms (5000)"), "{e}");
        let e = Config::from_toml("[http]\nmax-connections = 8\nreserved-connections = 8")
            .unwrap_err()
            .to_string();
        assert!(e.contains("reserved-connections (8)"), "{e}");
    }

    #[test]
    fn the_reserved_connections_are_a_sixteenth_unless_set() {
        assert_eq!(Config::default().http.reserved(), 256);
        let c = Config::from_toml("[http]\nmax-connections = 4").unwrap();
        assert_eq!(c.http.reserved(), 0);
        let c = Config::from_toml("[http]\nreserved-connections = 10").unwrap();
        assert_eq!(c.http.reserved(), 10);
    }
}
