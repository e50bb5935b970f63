//! The `streamhost` command line: `streamhost serve`, and client commands
//! (`append`, `events`, `state`, ...) that talk to a running server over
//! HTTP. The binary is [`Cli::parse`](clap::Parser::parse) then [`run`];
//! `streamhost --help` lists the commands.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use crate::config::{Config, Durability};
use crate::host::backfill::Backfill;
use crate::host::live::{Connect, WaitFor};
use crate::host::request::{
    ClusterRequest, ComponentRequest, EffectRequest, IngestRequest, ItxRequest, StreamRequest,
};
use crate::host::streams::StreamsQuery;
use crate::host::Host;
use crate::http::mapping;
use crate::stream::{AppendInput, EventInput, Namespace, ReadQuery, StreamAddress};

/// Durable event streams with sandboxed WebAssembly processors.
#[derive(Debug, Parser)]
#[command(name = "streamhost", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How answers print: `pretty` JSON (the default on a terminal),
    /// compact `json`, one value a line (the default when piped), or a
    /// `table` for people (a list's items as rows, other answers as
    /// key/value lines).
    #[arg(long, global = true, value_enum)]
    output: Option<Output>,
}

/// The output style of answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Pretty,
    Json,
    Table,
}

static OUTPUT: std::sync::OnceLock<Output> = std::sync::OnceLock::new();

/// A JSON value as the output style wants it.
fn render(v: &Value) -> String {
    match OUTPUT.get().copied().unwrap_or(Output::Json) {
        Output::Pretty => serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()),
        Output::Json => v.to_string(),
        Output::Table => table(v),
    }
}

/// Widest cell of a table, in characters; longer values are cut with `…`.
const TABLE_CELL_CHARS_MAX: usize = 60;

/// A value as one table cell: text as it is, `null` as nothing, the rest
/// as compact JSON; cut at [`TABLE_CELL_CHARS_MAX`].
fn cell(v: &Value) -> String {
    let text = match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let text = text.replace('\n', " ");
    if text.chars().count() <= TABLE_CELL_CHARS_MAX {
        return text;
    }
    let cut: String = text.chars().take(TABLE_CELL_CHARS_MAX - 1).collect();
    format!("{cut}…")
}

/// Rows of objects as an aligned table: a header of their keys (in the
/// order first seen) and a line per row.
fn rows_table(rows: &[Value]) -> String {
    let mut columns: Vec<String> = Vec::new();
    for r in rows {
        for k in r.as_object().into_iter().flat_map(|o| o.keys()) {
            if !columns.contains(k) {
                columns.push(k.clone());
            }
        }
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| cell(&r[c.as_str()])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([c.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: &[String]| {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = vec![line(&columns)];
    out.extend(cells.iter().map(|r| line(r)));
    out.join("\n")
}

/// A field of an answer as table rows, if it is a list of objects (rows),
/// a map of objects (a row each, its key first: `:runtime`'s
/// subscriptions) or one object (one row); `None` for a plain value.
fn as_rows(v: &Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object) => Some(a.clone()),
        Value::Object(m) if !m.is_empty() && m.values().all(Value::is_object) => Some(
            m.iter()
                .map(|(k, row)| {
                    let mut keyed = serde_json::Map::new();
                    keyed.insert("key".into(), json!(k));
                    keyed.extend(
                        row.as_object()
                            .into_iter()
                            .flatten()
                            .map(|(a, b)| (a.clone(), b.clone())),
                    );
                    Value::Object(keyed)
                })
                .collect(),
        ),
        Value::Object(m) if !m.is_empty() => Some(vec![v.clone()]),
        _ => None,
    }
}

/// An answer as a table: the plain fields as aligned `key  value` lines
/// first, then every field that holds objects (streams, components,
/// effects, versions, keys, halts, subscriptions, an event) as rows under
/// its name.
fn table(v: &Value) -> String {
    let Some(fields) = v.as_object() else {
        return match as_rows(v) {
            Some(rows) => rows_table(&rows),
            None => cell(v),
        };
    };
    let plain: Vec<(&String, &Value)> = fields
        .iter()
        .filter(|(_, v)| as_rows(v).is_none())
        .collect();
    let width = plain
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out: Vec<String> = plain
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {}", cell(v)).trim_end().to_string())
        .collect();
    for (k, rows) in fields.iter().filter_map(|(k, v)| Some((k, as_rows(v)?))) {
        if !out.is_empty() {
            out.push(String::new());
        }
        out.push(format!("{k}:"));
        out.push(rows_table(&rows));
    }
    out.join("\n")
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the server (SQLite under the data dir).
    Serve(ServeArgs),
    /// Append one event to a stream.
    Append(AppendArgs),
    /// Read a page of a stream's events.
    Events(EventsArgs),
    /// List the streams of a project (or the global namespace), in path order.
    Streams(StreamsArgs),
    /// Print a stream's reduced core state.
    State(StateArgs),
    /// Print a stream's runtime: subscription delivery progress, connections.
    Runtime(StateArgs),
    /// Wait for the next event after an offset that matches (`waitForEvent`);
    /// prints it, or fails when none comes within the timeout.
    Wait(WaitArgs),
    /// Subscribe a receiver to a source stream's events (appends
    /// subscription-configured to the source).
    Subscribe(SubscribeArgs),
    /// Remove a subscription from its source stream.
    Unsubscribe(SubscriptionArgs),
    /// Resume a halted subscription (optionally from a new cursor).
    ResumeSubscription(ResumeSubscriptionArgs),
    /// Move a subscription's cursor: it delivers the events after the offset.
    SetCursor(SetCursorArgs),
    /// Pause a stream: appends are refused until it is resumed.
    Pause(PauseArgs),
    /// Resume a paused stream.
    Resume(StateArgs),
    /// Delete a stream's events and state (admin); the next append starts a new lifetime.
    Reset(StateArgs),
    /// A processor instance: checkpoint, state, digest, status, last failure.
    Processor(ProcessorArgs),
    /// A processor's keyed state: a page of its keys, every key (`--all`),
    /// or one key (`--key`).
    Keys(KeysArgs),
    /// Call an exported function of a deployed component (ITX).
    Itx(ItxArgs),
    /// The deployed components of a project.
    Components(ProjectArgs),
    /// Whether the server is up (`GET /healthz`).
    Health(HealthArgs),
    /// Print a stream's events as they arrive, one JSON line each.
    Tail(TailArgs),
    /// Deploy (or replace) a component in a project.
    Deploy(DeployArgs),
    /// Deployed components.
    #[command(subcommand)]
    Component(ComponentCommand),
    /// Refold a processor from offset 0 and compare with its stored state.
    Verify(VerifyArgs),
    /// A processor's shadow version (`deploy --shadow`): show, promote,
    /// discard.
    #[command(subcommand)]
    Shadow(ShadowCommand),
    /// Create a processor's effects for past events (its state does not change).
    Backfill(BackfillArgs),
    /// The processor outbox: effects and their execution.
    #[command(subcommand)]
    Effects(EffectsCommand),
    /// Fold a processor component over a JSONL file of events, offline.
    Fold(FoldArgs),
    /// Check a processor over fixture events: no trap, the same state on a
    /// second run and whatever the batch cuts, and the expected state.
    Test(TestArgs),
    /// Ingest with broker acceptance: accept events, the buffer's and the
    /// JetStream bridge's status, register a JetStream stream.
    #[command(subcommand)]
    Ingest(IngestCommand),
    /// Scaffold a project.
    #[command(subcommand)]
    New(NewCommand),
    /// The server at a glance: health, streams, subscriptions, lag and halts
    /// of a project (or the global namespace).
    Status(StatusArgs),
    /// The hosts sharing this server's database and the streams each holds
    /// (`GET /v1/cluster`; admin). On SQLite: this host alone.
    Cluster(AdminArgs),
    /// The server's Prometheus metrics (`GET /metrics`; admin when tokens
    /// are configured), as text.
    Metrics(AdminArgs),
    /// Print a shell completion script: `streamhost completions bash >
    /// /etc/bash_completion.d/streamhost` (or zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub server: Server,
    /// Only streams whose path starts with this.
    #[arg(long, default_value = "/")]
    pub prefix: String,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NewCommand {
    /// A standalone processor project: a working fold, a sample of events,
    /// a README; `cargo build --release` in it builds the component.
    Processor(NewProcessorArgs),
}

#[derive(Debug, Args)]
pub(crate) struct NewProcessorArgs {
    /// The processor's name (the crate, the component): lowercase letters,
    /// digits and '-'.
    pub name: String,
    /// Where to create it [default: ./NAME]; must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Use the guest SDK at this path (a checkout's guest-sdk/) [default:
    /// the SDK of the repository this binary was built from].
    #[arg(long, conflicts_with = "sdk_git")]
    pub sdk_path: Option<PathBuf>,
    /// Use the guest SDK from this git repository.
    #[arg(long)]
    pub sdk_git: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum IngestCommand {
    /// Accept one event for a stream (`202` once durable; it reaches the
    /// stream shortly after).
    Send(IngestSendArgs),
    /// Pending events and capacity of the HTTP buffer; the JetStream
    /// bridge's stream, fence, pending messages, last error and diagnostics.
    Status(AdminArgs),
    /// Register the JetStream stream the bridge sees now (it must be empty):
    /// after a recreation, the bridge consumes nothing until this.
    Register(AdminArgs),
}

/// A server, as an administrator.
#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    /// Server URL.
    #[arg(long, env = "STREAMHOST_URL", default_value = "http://127.0.0.1:7410")]
    pub url: String,
    /// Bearer token (an admin token when tokens are configured).
    #[arg(long, env = "STREAMHOST_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct IngestSendArgs {
    #[command(flatten)]
    pub project: Project,
    /// Stream path, such as /orders/eu.
    pub stream: String,
    /// Event type.
    #[arg(long = "type")]
    pub event_type: String,
    /// Idempotency key (required: a retry with the same key is accepted once).
    #[arg(long)]
    pub key: String,
    /// Payload, a JSON object.
    #[arg(long, default_value = "{}")]
    pub payload: String,
}

/// A project on a server.
#[derive(Debug, Args)]
pub(crate) struct Project {
    /// Server URL.
    #[arg(long, env = "STREAMHOST_URL", default_value = "http://127.0.0.1:7410")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "STREAMHOST_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The project.
    #[arg(long, env = "STREAMHOST_PROJECT")]
    pub project: String,
}

/// A component of a project on a server.
#[derive(Debug, Args)]
pub(crate) struct ComponentRef {
    #[command(flatten)]
    pub project: Project,
    /// Component name.
    pub name: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum EffectsCommand {
    /// List effects, oldest first (a page; --after-id continues).
    Ls(EffectsLsArgs),
    /// One effect, with its target, attempts, last error and result.
    Show(EffectShowArgs),
    /// Run a failed or cancelled effect again (attempts reset).
    Retry(EffectArgs),
    /// Cancel a pending or failed effect.
    Cancel(EffectArgs),
}

#[derive(Debug, Args)]
pub(crate) struct EffectsLsArgs {
    #[command(flatten)]
    pub project: Project,
    /// Only effects of processors on this source stream (such as /orders).
    #[arg(long)]
    pub stream: Option<String>,
    /// Only effects of this processor component.
    #[arg(long)]
    pub component: Option<String>,
    /// Only effects in this status: pending, running, succeeded, failed, cancelled.
    #[arg(long)]
    pub status: Option<String>,
    /// Start after this effect id (the `nextAfterId` of the previous page).
    #[arg(long)]
    pub after_id: Option<u64>,
    /// Effects per page (1 to 500).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub(crate) struct EffectArgs {
    #[command(flatten)]
    pub project: Project,
    /// The effect id.
    pub id: u64,
}

#[derive(Debug, Args)]
pub(crate) struct EffectShowArgs {
    #[command(flatten)]
    pub effect: EffectArgs,
    /// Wait until the effect exists and has settled (succeeded, failed or
    /// cancelled), up to --timeout-ms.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
}

#[derive(Debug, Args)]
pub(crate) struct BackfillArgs {
    #[command(flatten)]
    pub target: Target,
    /// The processor's component name (one processor: there is no backfill of all).
    pub component: String,
    /// Fold the events after this offset.
    #[arg(long, default_value_t = 0)]
    pub after_offset: u64,
    /// ... through this offset (default: the stream's head).
    #[arg(long)]
    pub through_offset: Option<u64>,
    /// Only events of this type (repeatable).
    #[arg(long = "type")]
    pub event_types: Vec<String>,
    /// Only events for which this JSONata condition is true.
    #[arg(long = "where")]
    pub condition: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DeployArgs {
    #[command(flatten)]
    pub component: ComponentRef,
    /// The component (.wasm).
    pub file: PathBuf,
    /// Refold every processor instance of it from the new version's initial
    /// state (the old state serves reads until the new one has caught up).
    #[arg(long)]
    pub refold: bool,
    /// With --refold: store the effects the new version returns for events
    /// the old version already folded (by default they are dropped: they
    /// ran under the old version).
    #[arg(long, requires = "refold")]
    pub replay_effects: bool,
    /// Fold the new version beside the current one, which keeps serving:
    /// compare with `streamhost shadow show`, then `shadow promote` or
    /// `shadow discard` each instance.
    #[arg(long, conflicts_with = "refold")]
    pub shadow: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ShadowCommand {
    /// The shadow against the live instance: status, state diff (RFC 6902),
    /// keys diff, held effects.
    Show(ShadowArgs),
    /// Switch the instance to its shadow in one write.
    Promote(PromoteArgs),
    /// Drop the instance's shadow; the live instance is untouched.
    Discard(ShadowArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ShadowArgs {
    #[command(flatten)]
    pub target: Target,
    /// The processor's component name.
    pub component: String,
}

#[derive(Debug, Args)]
pub(crate) struct PromoteArgs {
    #[command(flatten)]
    pub shadow: ShadowArgs,
    /// Store the shadow's held effects to run (by default they are dropped).
    #[arg(long)]
    pub run_held_effects: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ComponentCommand {
    /// Download a deployed component's .wasm (to run a repro command locally).
    Get(ComponentGetArgs),
    /// The versions of a component, newest first: digest, deployedAt.
    Versions(ComponentRef),
}

#[derive(Debug, Args)]
pub(crate) struct ComponentGetArgs {
    #[command(flatten)]
    pub component: ComponentRef,
    /// Where to write it (default: NAME.wasm in the current directory).
    #[arg(long = "to", short = 'o', value_name = "FILE")]
    pub to: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    pub target: Target,
    /// The processor's component name.
    pub component: String,
}

#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    #[command(flatten)]
    pub target: Target,
    /// The processor's component name.
    pub component: String,
    /// Only this key: `{"key", "value"}`, or an error if it is absent.
    #[arg(long, conflicts_with_all = ["prefix", "after", "limit", "all"])]
    pub key: Option<String>,
    /// Keys that start with this.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Keys after this one (a page's `nextAfter`).
    #[arg(long)]
    pub after: Option<String>,
    /// Keys per page (1 to 1000; 100 by default).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Every key, a page at a time, as one `{"keys": [...]}` (what
    /// `streamhost fold --keys` reads).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub(crate) struct FoldArgs {
    /// The processor component (.wasm).
    pub component: PathBuf,
    /// Events, one JSON object per line (`type`, `payload`, optional
    /// `offset`, `metadata`, `createdAt`, `idempotencyKey`).
    #[arg(long)]
    pub events: PathBuf,
    /// Start from this state (JSON) instead of the processor's initial state.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Start from this keyed state (a processor that imports
    /// `wasi:keyvalue`): JSON as `streamhost keys --all` prints it, or an
    /// object of key to value (text, or `{"base64": "..."}`).
    #[arg(long)]
    pub keys: Option<PathBuf>,
    /// Write the keyed state after the fold to this file (the same form).
    #[arg(long)]
    pub keys_out: Option<PathBuf>,
    /// Start from a processor instance as this (SQLite) data dir holds it:
    /// its keys, and its state unless --state is given; the events are
    /// those after its checkpoint. Needs --stream (and --project, unless
    /// the stream is global); the instance is the component file's name
    /// unless --processor names it.
    #[arg(long, conflicts_with = "keys")]
    pub data_dir: Option<PathBuf>,
    /// With --data-dir: the stream path.
    #[arg(long, requires = "data_dir")]
    pub stream: Option<String>,
    /// With --data-dir: the project ("" or absent: the global namespace).
    #[arg(long, requires = "data_dir")]
    pub project: Option<String>,
    /// With --data-dir: the processor's component name.
    #[arg(long, requires = "data_dir")]
    pub processor: Option<String>,
    /// Deadline of one guest call, in ms.
    #[arg(long, default_value_t = 20_000)]
    pub timeout_ms: u64,
    /// The stream id the environment is derived from (a wake's is its
    /// stream's `streamId`): the random seed of each event depends on it.
    #[arg(long, default_value = "offline")]
    pub stream_id: String,
    /// Run every call with this wall clock (ms since the epoch), as a failing
    /// call's message states, instead of each event's `createdAt`.
    #[arg(long)]
    pub clock_ms: Option<i64>,
    /// Run every call with this random seed (64 hex digits), as a failing
    /// call's message states.
    #[arg(long, value_parser = parse_seed_arg)]
    pub seed: Option<[u8; 32]>,
}

#[derive(Debug, Args)]
pub(crate) struct TestArgs {
    /// The processor component (.wasm).
    pub component: PathBuf,
    /// Fixture events, one JSON object per line (as `fold --events`).
    #[arg(long)]
    pub events: PathBuf,
    /// The state the fold must end in (JSON).
    #[arg(long)]
    pub expect: Option<PathBuf>,
    /// Random batch cuts to try (besides one event at a time).
    #[arg(long, default_value_t = 20)]
    pub splits: usize,
    /// Seed of the cuts: a failing run names it, and repeats with it.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Deadline of one guest call, in ms.
    #[arg(long, default_value_t = 20_000)]
    pub timeout_ms: u64,
    /// The stream id the environment is derived from (as `fold`).
    #[arg(long, default_value = "offline")]
    pub stream_id: String,
}

fn parse_seed_arg(s: &str) -> Result<[u8; 32], String> {
    crate::processor::runtime::parse_seed(s)
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// TOML config file (see the README, "Using it"); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory for the database [default: ./streamhost-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7410]; port 0 picks a free one.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// "full" (fsync before every acknowledgement) or "normal".
    #[arg(long, value_parser = parse_durability)]
    pub durability: Option<Durability>,
    /// Store streams in this PostgreSQL database instead of SQLite
    /// (`postgres://user@host:port/db`; `storage` in the config).
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// Also consume the JetStream stream STREAMHOST_INGEST of this NATS
    /// server (`nats://host:port`; `[ingest] nats-url`).
    #[arg(long)]
    pub nats: Option<String>,
}

fn parse_durability(s: &str) -> Result<Durability, String> {
    match s {
        "full" => Ok(Durability::Full),
        "normal" => Ok(Durability::Normal),
        other => Err(format!(
            "durability {other:?} is not \"full\" or \"normal\""
        )),
    }
}

/// The server and namespace a client command talks to.
#[derive(Debug, Args)]
pub(crate) struct Server {
    /// Server URL.
    #[arg(long, env = "STREAMHOST_URL", default_value = "http://127.0.0.1:7410")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "STREAMHOST_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Project of the stream(s).
    #[arg(long, env = "STREAMHOST_PROJECT", conflicts_with = "global")]
    pub project: Option<String>,
    /// Use the deployment-wide namespace instead of a project.
    #[arg(long)]
    pub global: bool,
}

impl Server {
    /// The project (or the global namespace) it names.
    fn namespace(&self) -> Result<Namespace> {
        Ok(match (&self.project, self.global) {
            (Some(p), false) => Namespace::project(p)?,
            (None, true) => Namespace::Global,
            _ => bail!("name the namespace: --project NAME (or STREAMHOST_PROJECT) or --global"),
        })
    }
}

/// Where a client command sends its request: a stream.
#[derive(Debug, Args)]
pub(crate) struct Target {
    #[command(flatten)]
    pub server: Server,
    /// Stream path, such as /orders/eu.
    pub stream: String,
}

#[derive(Debug, Args)]
pub(crate) struct AppendArgs {
    #[command(flatten)]
    pub target: Target,
    /// Event type.
    #[arg(long = "type")]
    pub event_type: String,
    /// Payload as a JSON object.
    #[arg(long)]
    pub payload: Option<String>,
    /// Metadata as a JSON object.
    #[arg(long)]
    pub metadata: Option<String>,
    /// A key that makes retrying the append safe: the same key appends once.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Compare-and-append: the offset the event must get.
    #[arg(long)]
    pub offset: Option<u64>,
    /// Not stored: delivered to live connections only, with an offset.
    #[arg(long)]
    pub ephemeral: bool,
}

#[derive(Debug, Args)]
pub(crate) struct EventsArgs {
    #[command(flatten)]
    pub target: Target,
    /// Read the events after this offset.
    #[arg(long, default_value_t = 0)]
    pub after_offset: u64,
    /// Events per page (1 to 500).
    #[arg(long, default_value_t = 500)]
    pub limit: usize,
    /// Include ephemeral events still in memory.
    #[arg(long)]
    pub include_ephemeral: bool,
    /// Every page, one event per line (JSON Lines: the input of
    /// `streamhost fold --events`), instead of one page as JSON.
    #[arg(long)]
    pub jsonl: bool,
}

/// A project on a server (for commands that need no stream).
#[derive(Debug, Args)]
pub(crate) struct ProjectArgs {
    #[command(flatten)]
    pub project: Project,
}

#[derive(Debug, Args)]
pub(crate) struct HealthArgs {
    /// Server URL.
    #[arg(long, env = "STREAMHOST_URL", default_value = "http://127.0.0.1:7410")]
    pub url: String,
}

/// The receiver of a new subscription: exactly one.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct ReceiverArgs {
    /// Copy the events to this stream (a path in the same namespace).
    #[arg(long, value_name = "PATH")]
    pub copy_to: Option<String>,
    /// POST each event to this URL (http or https; project streams only).
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Call this ITX expression with each batch, as JSON
    /// (`'["components", ["get", "billing"], "process-event-batch"]'`).
    #[arg(long, value_name = "EXPRESSION")]
    pub itx: Option<String>,
    /// Wake this processor component with the events.
    #[arg(long, value_name = "COMPONENT")]
    pub wake: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SubscribeArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key (unique on the source stream).
    pub key: String,
    #[command(flatten)]
    pub receiver: ReceiverArgs,
    /// Only events of this type (repeatable).
    #[arg(long = "type")]
    pub event_types: Vec<String>,
    /// Only events for which this JSONata condition is true.
    #[arg(long = "where")]
    pub condition: Option<String>,
    /// A JSONata transform applied to each event (copy, webhook, itx).
    #[arg(long)]
    pub transform: Option<String>,
    /// Where delivery starts: `beginning` (the whole log) or `now`.
    #[arg(long, default_value = "now", value_parser = ["beginning", "now"])]
    pub start: String,
    /// What a permanently failing event does: `halt` the subscription, or
    /// `skip` it with an error-occurred line (retryable failures only).
    #[arg(long, default_value = "halt", value_parser = ["halt", "skip"])]
    pub on_failing_event: String,
    /// A description kept with the subscription.
    #[arg(long)]
    pub description: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SubscriptionArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key.
    pub key: String,
}

#[derive(Debug, Args)]
pub(crate) struct ResumeSubscriptionArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key.
    pub key: String,
    /// Resume from the events after this offset instead of where it halted.
    #[arg(long)]
    pub after_offset: Option<u64>,
}

#[derive(Debug, Args)]
pub(crate) struct SetCursorArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key.
    pub key: String,
    /// Deliver the events after this offset.
    #[arg(long)]
    pub after_offset: u64,
}

#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    #[command(flatten)]
    pub target: Target,
    /// Why (stated to every refused append: "stream paused: REASON").
    #[arg(long, default_value = "paused")]
    pub reason: String,
}

#[derive(Debug, Args)]
pub(crate) struct ProcessorArgs {
    #[command(flatten)]
    pub target: Target,
    /// The processor's component name.
    pub component: String,
    /// Wait until it has folded every committed event (its checkpoint is at
    /// the stream's head), up to --timeout-ms.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
}

#[derive(Debug, Args)]
pub(crate) struct ItxArgs {
    #[command(flatten)]
    pub project: Project,
    /// The ITX expression as JSON: `'["components", ["get", "kinds"], "add"]'`.
    pub expression: String,
    /// The arguments, each as JSON (`1 2`, `'{"a": 1}'`).
    pub args: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct StreamsArgs {
    #[command(flatten)]
    pub server: Server,
    /// Only paths that start with this (such as /orders).
    #[arg(long, default_value = "/")]
    pub prefix: String,
    /// Start after this path (the `nextAfterPath` of the previous page).
    #[arg(long)]
    pub after_path: Option<String>,
    /// Streams per page (1 to 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub(crate) struct TailArgs {
    #[command(flatten)]
    pub target: Target,
    /// Replay the events after this offset first.
    #[arg(long, alias = "after")]
    pub after_offset: Option<u64>,
    /// Stop after printing the event at this offset (or a later one).
    #[arg(long)]
    pub until_offset: Option<u64>,
    /// Stop after printing this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// Only events of this type (repeatable).
    #[arg(long = "type")]
    pub event_types: Vec<String>,
    /// Only events for which this JSONata condition is true.
    #[arg(long = "where")]
    pub condition: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct StateArgs {
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Args)]
pub(crate) struct WaitArgs {
    #[command(flatten)]
    pub target: Target,
    /// Wait for an event after this offset (default: the stream's end).
    #[arg(long, alias = "after")]
    pub after_offset: Option<u64>,
    /// Only events of this type (repeat for several).
    #[arg(long = "type")]
    pub event_types: Vec<String>,
    /// Only events for which this JSONata condition is true.
    #[arg(long = "where")]
    pub condition: Option<String>,
    /// How long to wait, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<()> {
    use std::io::IsTerminal;
    let _ = OUTPUT.set(cli.output.unwrap_or(if std::io::stdout().is_terminal() {
        Output::Pretty
    } else {
        Output::Json
    }));
    use StreamRequest as R;
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Append(a) => {
            let mut event = EventInput::new(a.event_type);
            if let Some(p) = &a.payload {
                event.payload = parse_object("--payload", p)?.as_object().cloned();
            }
            if let Some(m) = &a.metadata {
                event.metadata = parse_object("--metadata", m)?.as_object().cloned();
            }
            event.idempotency_key = a.idempotency_key;
            event.offset = a.offset;
            if a.ephemeral {
                event.ephemeral = Some(true);
            }
            request(&a.target, R::Append(AppendInput::new([event]))).await
        }
        Command::Events(a) if a.jsonl => events_jsonl(a).await,
        Command::Events(a) => {
            let query = ReadQuery {
                after_offset: a.after_offset,
                limit: a.limit,
                include_ephemeral: a.include_ephemeral,
            };
            request(&a.target, R::Events(query)).await
        }
        Command::State(a) => request(&a.target, R::State).await,
        Command::Runtime(a) => request(&a.target, R::Runtime).await,
        Command::Subscribe(a) => subscribe(a).await,
        Command::Unsubscribe(a) => {
            let removed = EventInput::new("events.iterate.com/stream/subscription-removed")
                .payload(json!({"subscriptionKey": a.key, "reason": "requested"}));
            request(&a.target, R::Append(AppendInput::new([removed]))).await
        }
        Command::ResumeSubscription(a) => {
            let resume = match a.after_offset {
                Some(after_offset) => R::SetSubscriptionCursorAndResume {
                    subscription_key: a.key,
                    after_offset,
                },
                None => R::ResumeSubscription {
                    subscription_key: a.key,
                },
            };
            request(&a.target, resume).await
        }
        Command::SetCursor(a) => {
            let set = R::SetSubscriptionCursor {
                subscription_key: a.key,
                after_offset: a.after_offset,
            };
            request(&a.target, set).await
        }
        Command::Pause(a) => {
            let paused = EventInput::new("events.iterate.com/stream/paused")
                .payload(json!({"reason": a.reason}));
            request(&a.target, R::Append(AppendInput::new([paused]))).await
        }
        Command::Resume(a) => {
            let resumed = EventInput::new("events.iterate.com/stream/resumed");
            request(&a.target, R::Append(AppendInput::new([resumed]))).await
        }
        Command::Reset(a) => request(&a.target, R::Reset).await,
        Command::Processor(a) if a.wait => processor_caught_up(a).await,
        Command::Processor(a) => {
            let component = a.component;
            request(&a.target, R::Processor { component }).await
        }
        Command::Keys(a) => keys(a).await,
        Command::Itx(a) => itx(a).await,
        Command::Components(a) => {
            print_answer(component_call(&a.project, &ComponentRequest::List).await?).await
        }
        Command::Health(a) => {
            let url = format!("{}/healthz", a.url.trim_end_matches('/'));
            let req = reqwest::Client::new().get(&url);
            print_answer(send(req, &url, None).await?).await
        }
        Command::Streams(a) => list_streams(a).await,
        Command::Tail(a) => tail(a).await,
        Command::Deploy(a) => deploy(a).await,
        Command::Component(ComponentCommand::Get(a)) => component_get(a).await,
        Command::Component(ComponentCommand::Versions(a)) => {
            let versions = ComponentRequest::Versions { name: a.name };
            print_answer(component_call(&a.project, &versions).await?).await
        }
        Command::Wait(a) => {
            let wait = WaitFor {
                after_offset: a.after_offset,
                event_types: (!a.event_types.is_empty()).then_some(a.event_types),
                jsonata_condition: a.condition,
                timeout_ms: a.timeout_ms,
            };
            request(&a.target, R::WaitForEvent(wait)).await
        }
        Command::Cluster(a) => {
            let call = mapping::render_cluster(&ClusterRequest::View);
            print_answer(api(&a.url, a.token.as_deref(), call).await?).await
        }
        Command::Metrics(a) => {
            let url = format!("{}/metrics", a.url.trim_end_matches('/'));
            let req = reqwest::Client::new().get(&url);
            let response = send(req, &url, a.token.as_deref()).await?;
            let status = response.status();
            let text = response.text().await.context("reading the metrics")?;
            if !status.is_success() {
                return Err(api_error(status, &text));
            }
            print_line(text.trim_end())
        }
        Command::Verify(a) => verify(a).await,
        Command::Shadow(c) => shadow(c).await,
        Command::Backfill(a) => backfill(a).await,
        Command::Effects(c) => effects(c).await,
        Command::Fold(a) => tokio::task::spawn_blocking(move || fold_offline(a)).await?,
        Command::Test(a) => tokio::task::spawn_blocking(move || test_offline(a)).await?,
        Command::Ingest(c) => ingest(c).await,
        Command::New(NewCommand::Processor(a)) => new_processor(a),
        Command::Status(a) => status(a).await,
        Command::Completions(a) => {
            use clap::CommandFactory;
            let mut command = Cli::command();
            clap_complete::generate(a.shell, &mut command, "streamhost", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// Sends `req` to `url` with the bearer `token`, if any. A server that
/// cannot be reached is one line naming the URL, with a hint.
async fn send(
    req: reqwest::RequestBuilder,
    url: &str,
    token: Option<&str>,
) -> Result<reqwest::Response> {
    let req = match token {
        Some(t) => req.bearer_auth(t),
        None => req,
    };
    req.send().await.map_err(|e| {
        if e.is_connect() {
            anyhow::anyhow!(
                "cannot reach the server at {url} (is it running? set --url or STREAMHOST_URL)"
            )
        } else {
            anyhow::Error::new(e).context(format!("requesting {url}"))
        }
    })
}

/// Writes one line to stdout. A closed pipe (`streamhost events ... | head`)
/// comes back as an error that `main` ends quietly on ([`is_broken_pipe`]).
fn print_line(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}

/// Whether `e` is stdout closing under us: the command ends quietly.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

async fn list_streams(a: StreamsArgs) -> Result<()> {
    let mut query = StreamsQuery::new().prefix(&a.prefix).limit(a.limit);
    query.after_path = a.after_path.clone();
    let call = mapping::render_list(&a.server.namespace()?, &query);
    print_answer(api(&a.server.url, a.server.token.as_deref(), call).await?).await
}

async fn component_get(a: ComponentGetArgs) -> Result<()> {
    let bytes = ComponentRequest::Bytes {
        name: a.component.name.clone(),
    };
    let response = component_call(&a.component.project, &bytes).await?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(api_error(status, &text));
    }
    let bytes = response.bytes().await.context("reading the component")?;
    let path =
        a.to.unwrap_or_else(|| PathBuf::from(format!("{}.wasm", a.component.name)));
    std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
    print_line(&format!(
        "wrote {} bytes to {}",
        bytes.len(),
        path.display()
    ))
}

async fn effects(command: EffectsCommand) -> Result<()> {
    use crate::host::effects::{EffectFilter, EffectStatus};
    let (project, request) = match command {
        EffectsCommand::Ls(a) => {
            let mut filter = EffectFilter::new().limit(a.limit);
            filter.stream = a.stream;
            filter.component = a.component;
            if let Some(status) = &a.status {
                let parsed = EffectStatus::parse(status).ok_or_else(|| {
                    let all: Vec<&str> = EffectStatus::ALL.iter().map(|s| s.as_str()).collect();
                    anyhow::anyhow!(
                        "--status {status:?} is not an effect status ({})",
                        all.join(", ")
                    )
                })?;
                filter.status = Some(parsed);
            }
            filter.after_id = a.after_id.unwrap_or(0) as i64;
            (a.project, EffectRequest::List(filter))
        }
        EffectsCommand::Show(a) if a.wait => return effect_settled(&a).await,
        EffectsCommand::Show(a) => (
            a.effect.project,
            EffectRequest::Get {
                id: a.effect.id as i64,
            },
        ),
        EffectsCommand::Retry(a) => (a.project, EffectRequest::Retry { id: a.id as i64 }),
        EffectsCommand::Cancel(a) => (a.project, EffectRequest::Cancel { id: a.id as i64 }),
    };
    let call = mapping::render_effect(&project.project, &request);
    print_answer(api(&project.url, project.token.as_deref(), call).await?).await
}

/// Runs `work`, showing `label` and the seconds elapsed on a terminal's
/// stderr meanwhile (nothing when stderr is not a terminal).
async fn with_progress<T>(label: &str, work: impl std::future::Future<Output = T>) -> T {
    use std::io::{IsTerminal, Write};
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let start = std::time::Instant::now();
    let mut work = std::pin::pin!(work);
    let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    let mut n = 0;
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            _ = tick.tick() => {
                n += 1;
                eprint!("\r{} {label} {:.1}s", frames[n % frames.len()], start.elapsed().as_secs_f64());
                let _ = std::io::stderr().flush();
            }
        }
    };
    eprintln!("\r✓ {label} {:.1}s", start.elapsed().as_secs_f64());
    out
}

/// `streamhost status`.
async fn status(a: StatusArgs) -> Result<()> {
    let token = a.server.token.as_deref();
    let base = a.server.url.trim_end_matches('/');
    let health = get_json(&format!("{base}/healthz"), None)
        .await?
        .and_then(|h| h["status"].as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let namespace = a.server.namespace()?;
    let mut streams = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = StreamsQuery::new()
            .prefix(&a.prefix)
            .limit(crate::host::streams::LIST_LIMIT_MAX);
        query.after_path = after.clone();
        let call = mapping::render_list(&namespace, &query);
        let page = answer_json(api(&a.server.url, token, call).await?)
            .await?
            .unwrap_or_default();
        streams.extend(page["streams"].as_array().cloned().unwrap_or_default());
        match page["nextAfterPath"].as_str() {
            Some(p) => after = Some(p.to_string()),
            None => break,
        }
    }
    let (mut subscriptions, mut lag, mut halted, mut paused) = (0u64, 0u64, Vec::new(), Vec::new());
    let mut most_behind: Option<Value> = None;
    for s in &streams {
        let path = s["path"].as_str().unwrap_or("/");
        if s["paused"] == true {
            paused.push(json!(path));
        }
        if s["subscriptions"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let Some(rt) = stream_json(&a.server, path, &StreamRequest::Runtime).await? else {
            continue;
        };
        for (key, sub) in rt["subscriptions"].as_object().into_iter().flatten() {
            subscriptions += 1;
            let l = sub["lag"].as_u64().unwrap_or(0);
            lag += l;
            if sub["halted"] == true {
                halted.push(
                    json!({"stream": path, "subscription": key, "lastError": sub["lastError"]}),
                );
            }
            if l > 0
                && most_behind
                    .as_ref()
                    .is_none_or(|m| m["lag"].as_u64() < Some(l))
            {
                most_behind = Some(json!({"stream": path, "subscription": key, "lag": l}));
            }
        }
    }
    print_line(&render(&json!({
        "health": health,
        "streams": streams.len(),
        "events": streams.iter().map(|s| s["eventCount"].as_u64().unwrap_or(0)).sum::<u64>(),
        "paused": paused,
        "subscriptions": subscriptions,
        "lag": lag,
        "mostBehind": most_behind,
        "halted": halted,
    })))
}

fn new_processor(a: NewProcessorArgs) -> Result<()> {
    use crate::scaffold::{self, Sdk};
    let sdk = match (a.sdk_path, a.sdk_git) {
        (Some(p), _) => {
            if !p.join("Cargo.toml").is_file() {
                bail!(
                    "--sdk-path {} holds no Cargo.toml: name a checkout's guest-sdk/",
                    p.display()
                );
            }
            Sdk::Path(p.canonicalize().unwrap_or(p))
        }
        (None, Some(url)) => Sdk::Git(url),
        (None, None) => Sdk::of_this_build().with_context(|| {
            "the guest SDK this binary was built with is gone: pass --sdk-path PATH \
             (a checkout's guest-sdk/) or --sdk-git URL"
        })?,
    };
    let dir = a.dir.unwrap_or_else(|| PathBuf::from(&a.name));
    let written = scaffold::write(&dir, &a.name, &sdk)?;
    for path in &written {
        eprintln!("created {}", path.display());
    }
    eprintln!(
        "\nnext:\n  cd {}\n  cargo build --release\n  streamhost fold target/wasm32-wasip2/release/{}.wasm --events events.jsonl\n(see its README.md for deploying it)",
        dir.display(),
        a.name.replace('-', "_")
    );
    Ok(())
}

async fn ingest(command: IngestCommand) -> Result<()> {
    match command {
        IngestCommand::Send(a) => {
            let payload = parse_object("--payload", &a.payload)?;
            let stream = StreamAddress::new(Namespace::project(&a.project.project)?, &a.stream)?;
            let event = EventInput::new(a.event_type)
                .payload(payload)
                .idempotency_key(a.key);
            let call = mapping::render_ingest(&IngestRequest::Accept {
                stream,
                events: vec![event],
            });
            print_answer(api(&a.project.url, a.project.token.as_deref(), call).await?).await
        }
        IngestCommand::Status(a) => {
            let call = mapping::render_ingest(&IngestRequest::Status);
            print_answer(api(&a.url, a.token.as_deref(), call).await?).await
        }
        IngestCommand::Register(a) => {
            let call = mapping::render_ingest(&IngestRequest::Register);
            print_answer(api(&a.url, a.token.as_deref(), call).await?).await
        }
    }
}

/// `--wake COMPONENT` names a deployed component that is not a processor
/// (it does not export `fold`): an error naming what it exports. One not
/// deployed yet passes (the server warns, and the wake waits for it).
async fn refuse_non_processor(server: &Server, component: &str) -> Result<()> {
    let project = match server.namespace()? {
        Namespace::Project(p) => p,
        Namespace::Global => return Ok(()),
    };
    let get = ComponentRequest::Get {
        name: component.to_string(),
    };
    let call = mapping::render_component(&project, &get);
    let Some(row) = answer_json(api(&server.url, server.token.as_deref(), call).await?).await?
    else {
        return Ok(());
    };
    let exports: Vec<&str> = row["exports"]
        .as_array()
        .map(|e| e.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if exports.contains(&"fold") {
        return Ok(());
    }
    bail!(
        "component {component:?} is not a processor: it exports {} and a wake needs fold \
         (a processor built with the guest SDK's processor! macro); call its functions with --itx",
        if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        }
    )
}

/// `streamhost subscribe`: a subscription-configured event on the source.
async fn subscribe(a: SubscribeArgs) -> Result<()> {
    use crate::subscription::Subscription;
    let r = &a.receiver;
    let mut subscription = if let Some(path) = &r.copy_to {
        Subscription::copy_to(&a.key, path)
    } else if let Some(url) = &r.webhook {
        Subscription::webhook(&a.key, url)
    } else if let Some(expression) = &r.itx {
        let expression: Value = serde_json::from_str(expression)
            .with_context(|| format!("--itx {expression:?} is not JSON"))?;
        Subscription::itx(&a.key, expression)
    } else if let Some(component) = &r.wake {
        refuse_non_processor(&a.target.server, component).await?;
        Subscription::wake(&a.key, component)
    } else {
        bail!("name the receiver: --copy-to, --webhook, --itx or --wake");
    };
    if a.start == "beginning" {
        subscription = subscription.from_beginning();
    }
    if a.on_failing_event == "skip" {
        subscription = subscription.skip_failing_events();
    }
    if let Some(t) = &a.transform {
        if r.wake.is_some() {
            bail!("--transform does not apply to a processor wake");
        }
        subscription = subscription.transform(t);
    }
    if !a.event_types.is_empty() {
        subscription = subscription.event_types(a.event_types.clone());
    }
    if let Some(c) = &a.condition {
        subscription = subscription.condition(c);
    }
    if let Some(d) = &a.description {
        subscription = subscription.description(d);
    }
    let configured = AppendInput::new([subscription.to_event()]);
    request(&a.target, StreamRequest::Append(configured)).await
}

/// GETs `url` as JSON: `None` for a 404, an error for any other failure.
async fn get_json(url: &str, token: Option<&str>) -> Result<Option<Value>> {
    answer_json(send(reqwest::Client::new().get(url), url, token).await?).await
}

/// [`get_json`] of a stream request on `stream` of `server`.
async fn stream_json(
    server: &Server,
    stream: &str,
    request: &StreamRequest,
) -> Result<Option<Value>> {
    let (req, url) = stream_http(server, stream, request)?;
    answer_json(send(req, &url, server.token.as_deref()).await?).await
}

/// A JSON answer: `None` for a 404, an error for any other failure.
async fn answer_json(response: reqwest::Response) -> Result<Option<Value>> {
    let status = response.status();
    let text = response.text().await.context("reading the answer")?;
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(api_error(status, &text));
    }
    Ok(Some(
        serde_json::from_str(&text).context("an answer that is not JSON")?,
    ))
}

/// Polls `check` every 50 ms until it answers a value, for `timeout_ms`.
async fn poll<F, Fut>(timeout_ms: u64, what: &str, mut check: F) -> Result<Value>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<std::result::Result<Value, String>>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
    loop {
        let last = match check().await? {
            Ok(v) => return Ok(v),
            Err(state) => state,
        };
        if std::time::Instant::now() >= deadline {
            bail!("{what} within {timeout_ms} ms: {last}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `streamhost processor --wait`: the processor once its checkpoint is at
/// the stream's head.
async fn processor_caught_up(a: ProcessorArgs) -> Result<()> {
    let processor = StreamRequest::Processor {
        component: a.component.clone(),
    };
    let what = format!("processor {:?} did not catch up", a.component);
    let p = poll(a.timeout_ms, &what, || async {
        let Some(p) = stream_json(&a.target.server, &a.target.stream, &processor).await? else {
            return Ok(Err("it has no instance yet".to_string()));
        };
        let checkpoint = p["checkpointOffset"].as_u64().unwrap_or(0);
        let next = StreamRequest::Events(ReadQuery {
            after_offset: checkpoint,
            limit: 1,
            include_ephemeral: false,
        });
        let page = stream_json(&a.target.server, &a.target.stream, &next)
            .await?
            .unwrap_or_default();
        Ok(match page["events"].as_array().map(Vec::len) {
            Some(0) => Ok(p),
            _ => Err(format!("its checkpoint is at offset {checkpoint}")),
        })
    })
    .await?;
    print_line(&render(&p))
}

/// `streamhost keys`: a processor's keys, every key, or one.
async fn keys(a: KeysArgs) -> Result<()> {
    use crate::host::processors::{KeysQuery, KEYS_LIMIT_MAX};
    let component = a.component.clone();
    if let Some(key) = a.key {
        return request(&a.target, StreamRequest::ProcessorKey { component, key }).await;
    }
    let page = |after: Option<String>| {
        let mut query = KeysQuery::new();
        if let Some(p) = &a.prefix {
            query = query.prefix(p);
        }
        query.after = after;
        match a.limit {
            Some(l) => query.limit = l,
            None if a.all => query.limit = KEYS_LIMIT_MAX,
            None => {}
        }
        StreamRequest::ProcessorKeys {
            component: component.clone(),
            query,
        }
    };
    if !a.all {
        return request(&a.target, page(a.after.clone())).await;
    }
    let mut all = Vec::new();
    let mut after = a.after.clone();
    loop {
        let response = stream_call(&a.target, &page(after.clone())).await?;
        let status = response.status();
        let page: Value = response.json().await.context("reading the answer")?;
        if !status.is_success() {
            return Err(api_error(status, &page.to_string()));
        }
        all.extend(page["keys"].as_array().cloned().unwrap_or_default());
        match page["nextAfter"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
    }
    print_line(&render(&serde_json::json!({ "keys": all })))
}

/// `streamhost effects show --wait`: the effect once it has settled.
async fn effect_settled(a: &EffectShowArgs) -> Result<()> {
    let project = &a.effect.project;
    let get = EffectRequest::Get {
        id: a.effect.id as i64,
    };
    let what = format!("effect {} did not settle", a.effect.id);
    let e = poll(a.timeout_ms, &what, || async {
        let call = mapping::render_effect(&project.project, &get);
        let answer = api(&project.url, project.token.as_deref(), call).await?;
        Ok(match answer_json(answer).await? {
            None => Err("it does not exist yet".to_string()),
            Some(e)
                if ["succeeded", "failed", "cancelled"]
                    .contains(&e["status"].as_str().unwrap_or("")) =>
            {
                Ok(e)
            }
            Some(e) => Err(format!("it is {}", e["status"])),
        })
    })
    .await?;
    print_line(&render(&e))
}

/// `streamhost itx`: `POST /v1/projects/{p}/itx`.
async fn itx(a: ItxArgs) -> Result<()> {
    let expression: Value = serde_json::from_str(&a.expression)
        .with_context(|| format!("the expression {:?} is not JSON", a.expression))?;
    let args = a
        .args
        .iter()
        .enumerate()
        .map(|(i, text)| {
            serde_json::from_str::<Value>(text)
                .with_context(|| format!("argument {} {text:?} is not JSON", i + 1))
        })
        .collect::<Result<Vec<_>>>()?;
    let call = mapping::render_itx(&a.project.project, &ItxRequest { expression, args });
    print_answer(api(&a.project.url, a.project.token.as_deref(), call).await?).await
}

/// `streamhost events --jsonl`: every page after the offset, one event a line.
async fn events_jsonl(a: EventsArgs) -> Result<()> {
    let mut after = a.after_offset;
    loop {
        let page = StreamRequest::Events(ReadQuery {
            after_offset: after,
            limit: a.limit,
            include_ephemeral: a.include_ephemeral,
        });
        let response = stream_call(&a.target, &page).await?;
        let status = response.status();
        let text = response.text().await.context("reading the answer")?;
        if !status.is_success() {
            return Err(api_error(status, &text));
        }
        let page: Value = serde_json::from_str(&text).context("an answer that is not JSON")?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        let Some(last) = events.last().and_then(|e| e["offset"].as_u64()) else {
            return Ok(());
        };
        for e in &events {
            print_line(&e.to_string())?;
        }
        after = last;
    }
}

/// `streamhost backfill`: streams the server's progress lines and draws
/// them as a bar on a terminal (or prints them as lines otherwise).
async fn backfill(a: BackfillArgs) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let backfill = StreamRequest::BackfillProcessor(Backfill {
        component: a.component,
        after_offset: a.after_offset,
        through_offset: a.through_offset,
        event_types: (!a.event_types.is_empty()).then_some(a.event_types),
        jsonata_condition: a.condition,
    });
    let (req, url) = stream_http(&a.target.server, &a.target.stream, &backfill)?;
    let req = req.header("accept", "application/x-ndjson");
    let mut response = send(req, &url, a.target.server.token.as_deref()).await?;
    if !response.status().is_success() {
        return print_answer(response).await;
    }
    let terminal = std::io::stderr().is_terminal();
    let mut buffer = String::new();
    while let Some(chunk) = response.chunk().await.context("reading the answer")? {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find('\n') {
            let line: String = buffer.drain(..=end).collect();
            let v: Value = serde_json::from_str(line.trim()).context("a line that is not JSON")?;
            if let Some(p) = v.get("progress") {
                let text = progress_text(p);
                let mut err = std::io::stderr().lock();
                if terminal {
                    write!(err, "\r{text}")?;
                } else {
                    writeln!(err, "{text}")?;
                }
                err.flush()?;
            } else if let Some(result) = v.get("result") {
                if terminal {
                    eprintln!();
                }
                return print_line(&render(result));
            } else if let Some(error) = v.get("error") {
                if terminal {
                    eprintln!();
                }
                bail!(
                    "backfill failed ({}): {}",
                    error["code"].as_str().unwrap_or("error"),
                    error["message"].as_str().unwrap_or_default()
                );
            }
        }
    }
    bail!("the server ended the answer before the backfill's result")
}

/// One progress line: a bar of the offsets scanned, and the counts.
fn progress_text(p: &Value) -> String {
    let through = p["throughOffset"].as_u64().unwrap_or(0);
    let head = p["headOffset"].as_u64().unwrap_or(0).max(1);
    let width = 30;
    let filled = ((through.min(head) * width) / head) as usize;
    format!(
        "[{}{}] offset {through}/{head}, {} folded, {} effects created",
        "#".repeat(filled),
        ".".repeat(width as usize - filled),
        p["folded"],
        p["effectsCreated"]
    )
}

async fn verify(a: VerifyArgs) -> Result<()> {
    let verify = StreamRequest::VerifyProcessor {
        component: a.component.clone(),
    };
    let (req, url) = stream_http(&a.target.server, &a.target.stream, &verify)?;
    let label = format!("verifying {} (refolding from offset 0)", a.component);
    let response = with_progress(&label, send(req, &url, a.target.server.token.as_deref())).await?;
    let status = response.status();
    let v: Value = response.json().await.context("reading the answer")?;
    if !status.is_success() {
        return Err(api_error(status, &v.to_string()));
    }
    print_line(&render(&v))?;
    if v["matches"] != true {
        bail!("the stored state differs from the refold");
    }
    Ok(())
}

async fn shadow(c: ShadowCommand) -> Result<()> {
    match c {
        ShadowCommand::Show(a) => {
            let component = a.component;
            request(&a.target, StreamRequest::Shadow { component }).await
        }
        ShadowCommand::Promote(a) => {
            let promote = crate::host::shadows::Promote {
                component: a.shadow.component,
                run_held_effects: a.run_held_effects,
            };
            request(&a.shadow.target, StreamRequest::PromoteShadow(promote)).await
        }
        ShadowCommand::Discard(a) => {
            let component = a.component;
            request(&a.target, StreamRequest::DiscardShadow { component }).await
        }
    }
}

async fn deploy(a: DeployArgs) -> Result<()> {
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let label = format!(
        "deploying {} ({} KiB; the server compiles it)",
        a.component.name,
        bytes.len() / 1024
    );
    let deploy = ComponentRequest::Deploy {
        name: a.component.name.clone(),
        bytes,
        refold: a.refold,
        replay_effects: a.replay_effects,
        shadow: a.shadow,
    };
    let response = with_progress(&label, component_call(&a.component.project, &deploy)).await?;
    print_answer(response).await
}

/// Events from a JSONL file (`type`, `payload`, optional `offset`,
/// `metadata`, `createdAt`, `idempotencyKey`), those of `consumes` (empty:
/// all).
fn read_events(path: &std::path::Path, consumes: &[String]) -> Result<Vec<crate::stream::Event>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut events: Vec<crate::stream::Event> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{} line {}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let event_type = v["type"]
            .as_str()
            .with_context(|| format!("{}: no \"type\"", at()))?
            .to_string();
        if !consumes.is_empty() && !consumes.contains(&event_type) {
            continue;
        }
        let object = |field: &str| -> Result<Option<serde_json::Map<String, Value>>> {
            match v.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Object(m)) => Ok(Some(m.clone())),
                Some(other) => bail!("{}: {field} must be a JSON object, got {other}", at()),
            }
        };
        events.push(crate::stream::Event {
            offset: v["offset"].as_u64().unwrap_or(i as u64 + 1),
            event_type,
            payload: object("payload")?.unwrap_or_default(),
            metadata: object("metadata")?,
            idempotency_key: v["idempotencyKey"].as_str().map(str::to_string),
            created_at: v["createdAt"]
                .as_str()
                .unwrap_or("1970-01-01T00:00:00.000Z")
                .to_string(),
            source: None,
            ephemeral: false,
        });
    }
    Ok(events)
}

/// A processor component from a file, compiled for an offline fold: the
/// runtime, the component, its name (the file's stem) and announcement.
struct OfflineProcessor {
    runtime: std::sync::Arc<crate::processor::runtime::Runtime>,
    prepared: std::sync::Arc<crate::processor::runtime::Prepared>,
    name: String,
    announcement: crate::processor::runtime::Announcement,
}

fn offline_processor(component: &std::path::Path, timeout_ms: u64) -> Result<OfflineProcessor> {
    use crate::processor::runtime::Runtime;
    let bytes =
        std::fs::read(component).with_context(|| format!("reading {}", component.display()))?;
    let runtime = Runtime::new(std::env::temp_dir().join("streamhost-fold-cache"))?;
    let (_, is_processor) = runtime.validate(&bytes).map_err(anyhow::Error::msg)?;
    if !is_processor {
        bail!(
            "{} is not a processor: it does not export {}",
            component.display(),
            crate::processor::runtime::PROCESSOR_INTERFACE
        );
    }
    let digest = crate::processor::runtime::digest(&bytes);
    let prepared = runtime.prepare(&digest, || Ok(bytes.clone()))?;
    let name = component
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "processor".into());
    let announcement = runtime
        .describe(&name, &prepared, timeout_ms)
        .map_err(|e| anyhow::anyhow!("describe: {e}"))?;
    Ok(OfflineProcessor {
        runtime,
        prepared,
        name,
        announcement,
    })
}

/// `streamhost test`: a processor over fixture events, checked for the
/// properties every fold must have (`processor::check`).
fn test_offline(a: TestArgs) -> Result<()> {
    let p = offline_processor(&a.component, a.timeout_ms)?;
    let events = read_events(&a.events, &p.announcement.consumes)?;
    if events.is_empty() {
        bail!(
            "{} holds no event the processor consumes ({:?})",
            a.events.display(),
            p.announcement.consumes
        );
    }
    let expected = match &a.expect {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Some(
                serde_json::from_str::<Value>(&text)
                    .with_context(|| format!("{}: not JSON", path.display()))?,
            )
        }
        None => None,
    };
    let check = crate::processor::check::Check {
        guest: crate::processor::wake::Guest {
            runtime: &p.runtime,
            prepared: &p.prepared,
            component: &p.name,
            timeout_ms: a.timeout_ms,
        },
        component_path: &a.component.display().to_string(),
        stream: crate::processor::runtime::StreamInfo {
            project_id: None,
            path: "/test".into(),
            stream_id: a.stream_id.clone(),
            stream_created_at: "1970-01-01T00:00:00.000Z".into(),
            max_offset: events.last().map_or(0, |e| e.offset),
        },
        events: &events,
        expected,
        splits: a.splits,
        seed: a.seed,
    };
    match check.run(|line| println!("ok: {line}")) {
        Ok(()) => Ok(()),
        Err(counterexample) => bail!("{counterexample}"),
    }
}

/// `streamhost fold`: folds a component over a JSONL file, offline.
fn fold_offline(a: FoldArgs) -> Result<()> {
    use crate::processor::runtime::{Batch, Determinism, StreamInfo};
    let OfflineProcessor {
        runtime,
        prepared,
        name,
        announcement,
    } = offline_processor(&a.component, a.timeout_ms)?;
    let mut state = match &a.state {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => runtime
            .initial_state(&name, &prepared, a.timeout_ms)
            .map_err(|e| anyhow::anyhow!("initial-state: {e}"))?,
    };
    let offline = match &a.data_dir {
        Some(dir) => {
            let stream = a
                .stream
                .as_deref()
                .context("--data-dir needs --stream: the processor's source stream")?;
            let instance = crate::storage::read_offline(
                dir,
                a.project.as_deref().unwrap_or(""),
                stream,
                a.processor.as_deref().unwrap_or(&name),
            )?;
            eprintln!(
                "from {}: checkpoint at offset {}, {} keys",
                dir.display(),
                instance.checkpoint_offset,
                instance.keys.len()
            );
            Some(instance)
        }
        None => None,
    };
    if let (Some(o), None) = (&offline, &a.state) {
        state = o.state.clone();
    }
    let keys = match (&a.keys, offline) {
        (_, Some(o)) => o.keys,
        (Some(p), None) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let v: Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not JSON", p.display()))?;
            crate::processor::keyed::keys_from_json(&v)
                .map_err(|m| anyhow::anyhow!("{}: {m}", p.display()))?
        }
        (None, None) => Default::default(),
    };
    // Kept for --keys-out: the keys given, under the fold's writes.
    let given = std::sync::Arc::new(crate::processor::keyed::Memory(keys));
    let mut bucket = crate::processor::keyed::Bucket::new(given.clone());
    let events = read_events(&a.events, &announcement.consumes)?;
    let stream = StreamInfo {
        project_id: None,
        path: "/offline".into(),
        stream_id: a.stream_id.clone(),
        stream_created_at: "1970-01-01T00:00:00.000Z".into(),
        max_offset: events.last().map_or(0, |e| e.offset),
    };
    let guest = crate::processor::wake::Guest {
        runtime: &runtime,
        prepared: &prepared,
        component: &name,
        timeout_ms: a.timeout_ms,
    };
    let path = a.component.display().to_string();
    for chunk in events.chunks(1000) {
        let through = chunk[chunk.len() - 1].offset;
        let folded = if a.clock_ms.is_some() || a.seed.is_some() {
            // One given environment for every call: replays a stated call.
            let first = Determinism::for_event(
                &a.stream_id,
                chunk[0].offset,
                crate::processor::wake::created_ms(&chunk[0].created_at),
            );
            let env = Determinism::fixed(
                &a.stream_id,
                a.clock_ms.unwrap_or(first.wall_clock_ms),
                a.seed.unwrap_or(first.seed),
            );
            let batch = Batch {
                stream: stream.clone(),
                events: crate::processor::wake::batch_events(chunk),
                scanned_through_offset: through,
            };
            let (folded, session) = runtime.fold(
                &name,
                &prepared,
                &state,
                &batch,
                env,
                a.timeout_ms,
                bucket.session(),
            );
            match folded {
                Ok(f) => Ok((f.state, session.keep())),
                Err(e) => {
                    let (_, read) = session.failed();
                    Err(anyhow::anyhow!(
                        "fold failed: {e}\nreproduce with: {}",
                        crate::processor::wave::fold_command(
                            &path,
                            &state,
                            &batch,
                            prepared.keyed().then_some(&read[..])
                        )
                    ))
                }
            }
        } else {
            crate::processor::wake::fold_events(&guest, &stream, &state, chunk, through, bucket)
                .map(|(s, _, b)| (s, b))
                .map_err(|f| {
                    let command = f.detail.as_deref().map(|d| {
                        d.strip_suffix(&format!("{name}.wasm"))
                            .map(|head| format!("{head}{path}"))
                            .unwrap_or_else(|| d.to_string())
                    });
                    anyhow::anyhow!(
                        "fold failed: {}\nreproduce with: {}",
                        f.message,
                        command.unwrap_or_default()
                    )
                })
        };
        (state, bucket) = folded?;
    }
    if let Some(out) = &a.keys_out {
        let mut all = given.0.clone();
        for (k, v) in bucket.writes() {
            match v {
                Some(v) => all.insert(k.clone(), v.clone()),
                None => all.remove(k),
            };
        }
        let json = crate::processor::keyed::keys_to_json(all.iter());
        std::fs::write(out, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
    }
    let shown = serde_json::from_str::<Value>(&state)
        .map(|v| render(&v))
        .unwrap_or(state);
    print_line(&shown)
}

async fn tail(a: TailArgs) -> Result<()> {
    let mut connect = Connect::new().events_only();
    if let Some(after) = a.after_offset {
        connect = connect.after(after);
    }
    if !a.event_types.is_empty() {
        connect = connect.event_types(a.event_types.clone());
    }
    if let Some(c) = &a.condition {
        connect = connect.condition(c);
    }
    let response = stream_call(&a.target, &StreamRequest::Connect(connect)).await?;
    if !response.status().is_success() {
        let status = response.status();
        bail!("{status}: {}", response.text().await.unwrap_or_default());
    }
    use eventsource_stream::Eventsource;
    use futures_util::StreamExt;
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut printed: u64 = 0;
    if a.count == Some(0) {
        return Ok(());
    }
    let mut messages = response.bytes_stream().eventsource();
    while let Some(message) = messages.next().await {
        let message = message.context("reading the stream")?;
        if message.data.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&message.data).context("a message that is not JSON")?;
        if message.event == "closed" {
            bail!("the server closed the connection: {v}");
        }
        let mut out = stdout.lock();
        for e in v["events"].as_array().into_iter().flatten() {
            writeln!(out, "{e}")?;
            printed += 1;
            let offset = e["offset"].as_u64().unwrap_or(0);
            if a.count.is_some_and(|c| printed >= c) || a.until_offset.is_some_and(|u| offset >= u)
            {
                out.flush()?;
                return Ok(());
            }
        }
        out.flush()?;
    }
    Ok(())
}

fn parse_object(flag: &str, text: &str) -> Result<Value> {
    let v: Value =
        serde_json::from_str(text).with_context(|| format!("{flag} {text:?} is not JSON"))?;
    if !v.is_object() {
        bail!("{flag} {text:?} is not a JSON object");
    }
    Ok(v)
}

async fn serve(args: ServeArgs) -> Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if let Some(d) = args.durability {
        config.durability = d;
    }
    if let Some(url) = args.nats {
        config.ingest.nats_url = Some(url);
    }
    if let Some(url) = args.postgres {
        config.storage = Some(url);
    }
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let addr = listener.local_addr()?;
    if config.cluster.advertise_url.is_none() {
        config.cluster.advertise_url = Some(format!("http://{addr}"));
    }
    let storage = match config.postgres_url()? {
        Some(url) => crate::storage::sql::redact(url),
        None => "sqlite".to_string(),
    };
    tracing::info!(data_dir = %config.data_dir.display(), durability = ?config.durability, %storage, "starting");
    let host = Host::open(config)?;
    // Tests and scripts read this line to find the port.
    println!("streamhost listening on http://{addr}");
    host.serve(listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}

/// The request's HTTP call on stream `stream` of `server`: the server's own
/// mapping ([`crate::http::mapping::render`]) writes its method, name,
/// query and body.
fn stream_http(
    server: &Server,
    stream: &str,
    request: &StreamRequest,
) -> Result<(reqwest::RequestBuilder, String)> {
    if !stream.starts_with('/') {
        bail!("stream path {stream:?} must start with \"/\"");
    }
    let call = mapping::render_stream(&server.namespace()?, stream, request);
    let mut url = format!("{}{}", server.url.trim_end_matches('/'), call.path);
    if !call.query.is_empty() {
        url.push('?');
        url.push_str(&call.query);
    }
    let mut req = reqwest::Client::new().request(call.method, &url);
    if let mapping::ApiBody::Json(body) = &call.body {
        req = req.json(body);
    }
    Ok((req, url))
}

/// Sends `call` (a request as the server's mapping renders it) to the
/// server at `url`.
async fn api(url: &str, token: Option<&str>, call: mapping::ApiCall) -> Result<reqwest::Response> {
    let mut target = format!("{}{}", url.trim_end_matches('/'), call.path);
    if !call.query.is_empty() {
        target.push('?');
        target.push_str(&call.query);
    }
    let mut req = reqwest::Client::new().request(call.method, &target);
    match call.body {
        mapping::ApiBody::Empty => {}
        mapping::ApiBody::Json(body) => req = req.json(&body),
        mapping::ApiBody::Bytes(bytes) => {
            req = req.header("content-type", mapping::WASM).body(bytes)
        }
    }
    if let Some(accept) = call.accept {
        req = req.header("accept", accept);
    }
    send(req, &target, token).await
}

/// Sends a component request to the project's server.
async fn component_call(
    project: &Project,
    request: &ComponentRequest,
) -> Result<reqwest::Response> {
    let call = mapping::render_component(&project.project, request);
    api(&project.url, project.token.as_deref(), call).await
}

/// Sends `request` on the target's stream.
async fn stream_call(target: &Target, request: &StreamRequest) -> Result<reqwest::Response> {
    let (req, url) = stream_http(&target.server, &target.stream, request)?;
    send(req, &url, target.server.token.as_deref()).await
}

/// Sends `request` on the target's stream and prints the answer.
async fn request(target: &Target, request: StreamRequest) -> Result<()> {
    print_answer(stream_call(target, &request).await?).await
}

/// Prints a JSON answer pretty; a failure status is the command's error.
async fn print_answer(response: reqwest::Response) -> Result<()> {
    let status = response.status();
    let text = response.text().await.context("reading the answer")?;
    let parsed = serde_json::from_str::<Value>(&text).ok();
    if !status.is_success() {
        return Err(api_error(status, &text));
    }
    // Warnings go to stderr, so a piped answer stays the answer alone.
    for w in parsed
        .as_ref()
        .and_then(|v| v["warnings"].as_array())
        .into_iter()
        .flatten()
    {
        eprintln!(
            "warning: {}",
            w.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| w.to_string())
        );
    }
    print_line(&parsed.as_ref().map(render).unwrap_or(text))
}

/// A failure answer as the command's error, one readable line: the error's
/// code and message and the HTTP status (`stream-not-found: stream "/x"
/// does not exist in project "acme" (404)`), then its hint, once, on a
/// line of its own. An answer that is not the API's error shape is quoted
/// (its first 500 bytes).
fn api_error(status: reqwest::StatusCode, text: &str) -> anyhow::Error {
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    let error = parsed.as_ref().map(|v| &v["error"]);
    match error.and_then(|e| Some((e["code"].as_str()?, e["message"].as_str()?))) {
        Some((code, message)) => {
            let hint = error
                .and_then(|e| e["hint"].as_str())
                .filter(|h| !message.contains(h))
                .map(|h| format!("\nhint: {h}"))
                .unwrap_or_default();
            anyhow::anyhow!("{code}: {message} ({}){hint}", status.as_u16())
        }
        None => {
            let mut end = text.len().min(500);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let text = text[..end].trim();
            let reason = status.canonical_reason().unwrap_or("");
            anyhow::anyhow!("the server answered {} {reason}: {text}", status.as_u16())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_lists_rows_under_their_field_and_plain_fields_first() {
        let answer = json!({
            "streams": [
                {"path": "/orders", "maxOffset": 12, "paused": false},
                {"path": "/a-much-longer/path", "maxOffset": 3, "note": "x".repeat(100)}
            ],
            "nextAfterPath": null,
        });
        let text = table(&answer);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "nextAfterPath");
        assert_eq!(lines[2], "streams:");
        assert_eq!(lines[3], "path                 maxOffset  paused  note");
        assert_eq!(lines[4], "/orders              12         false");
        assert!(
            lines[5].starts_with("/a-much-longer/path  3                  xxx"),
            "{text}"
        );
        // The 100-character note is cut to 60 (59 and the mark).
        assert!(
            lines[5].ends_with('…') && lines[5].chars().count() == 21 + 11 + 8 + 60,
            "{text}"
        );
        // A map of objects is a row per key; a lone object is one row.
        let runtime = table(&json!({"subscriptions": {"h": {"lag": 2, "halted": true}}}));
        assert_eq!(runtime, "subscriptions:\nkey  lag  halted\nh    2    true");
        assert_eq!(table(&json!({"event": {"offset": 2}})), "event:\noffset\n2");
        assert_eq!(table(&json!("plain")), "plain");
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_and_argument_has_help() {
        use clap::CommandFactory;
        fn check(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        check(&Cli::command(), "streamhost", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:?}");
    }
}
