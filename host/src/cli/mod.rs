//! The `streamhost` command line: `streamhost serve`, and client commands
//! (`append`, `events`, `state`, ...) that talk to a running server over
//! HTTP. The binary is [`Cli::parse`](clap::Parser::parse) then [`run`];
//! `streamhost --help` lists the commands.
//!
//! This module holds the command enum, [`run`]'s dispatch and what every
//! client command shares (the server's address and token, sending a typed
//! request through `http/mapping.rs`, printing answers and errors); one
//! module per family holds its arguments and its commands: `streams`,
//! `subscriptions`, `processors`, `components`, `effects`, `ingest`,
//! `offline` (`fold`, `test`), `serve`, `new`, and `output` (answers as
//! JSON or tables).

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

mod backup;
mod components;
mod effects;
mod ingest;
mod new;
mod offline;
mod output;
mod processors;
mod secrets;
mod serve;
mod streams;
mod subscriptions;
use backup::*;
use components::*;
use effects::*;
use ingest::*;
use new::*;
use offline::*;
use output::*;
use processors::*;
use secrets::*;
use serve::*;
use streams::*;
use subscriptions::*;

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
    /// The story of one event: where it came from and what it caused
    /// (copies, deliveries, wakes, effects, the events they appended), as a
    /// tree (`--output json`: the answer as is).
    Trace(TraceArgs),
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
    /// Erase one event's payload and metadata (a GDPR erasure, a leaked
    /// secret): its offset, type and key stay, an event-redacted line
    /// records it.
    Redact(RedactArgs),
    /// Set a stream's retention bounds (neither: remove them): older
    /// events and the oldest beyond the count leave the front of its log,
    /// never past a subscription's cursor or a processor's checkpoint.
    Retention(RetentionArgs),
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
    /// The secret that signs a project's webhooks (admin): rotate, retire
    /// the previous.
    #[command(subcommand)]
    WebhookSecret(WebhookSecretCommand),
    /// Fold a processor component over a JSONL file of events, offline.
    Fold(FoldArgs),
    /// Check a processor over fixture events: no trap, the same state on a
    /// second run and whatever the batch cuts, and the expected state.
    Test(TestArgs),
    /// Ingest with broker acceptance: accept events, the buffer's and the
    /// JetStream bridge's status, register a JetStream stream.
    #[command(subcommand)]
    Ingest(IngestCommand),
    /// Scaffold a processor project: `streamhost new NAME --lang
    /// rust|ts|js|python`.
    New(NewArgs),
    /// The server at a glance: health, streams, subscriptions, lag and halts
    /// of a project (or the global namespace).
    Status(StatusArgs),
    /// The hosts sharing this server's database and the streams each holds
    /// (`GET /v1/cluster`; admin). On SQLite: this host alone.
    Cluster(AdminArgs),
    /// The server's Prometheus metrics (`GET /metrics`; admin when tokens
    /// are configured), as text.
    Metrics(AdminArgs),
    /// Download a consistent copy of a running server's SQLite database
    /// (admin) while writes go on; kept only once whole and checked.
    Backup(BackupArgs),
    /// Make a backup the database of a new data dir (offline), which
    /// `streamhost serve --data-dir DIR` then starts from.
    Restore(RestoreArgs),
    /// Print a shell completion script: `streamhost completions bash >
    /// /etc/bash_completion.d/streamhost` (or zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
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

/// A project on a server (for commands that need no stream).
#[derive(Debug, Args)]
pub(crate) struct ProjectArgs {
    #[command(flatten)]
    pub project: Project,
}

#[derive(Debug, Args)]
pub(crate) struct StateArgs {
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    #[command(flatten)]
    pub target: Target,
    /// The event's offset.
    pub offset: u64,
    /// Also send the story to the server's OTLP endpoint as a trace.
    #[arg(long)]
    pub export: bool,
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
        Command::Trace(a) => {
            let call = R::EventTrace {
                offset: a.offset,
                export: a.export,
            };
            let response = stream_call(&a.target, &call).await?;
            let status = response.status();
            let text = response.text().await.context("reading the answer")?;
            if !status.is_success() {
                return Err(api_error(status, &text));
            }
            match OUTPUT.get().copied().unwrap_or(Output::Json) {
                Output::Json => print_line(&text),
                Output::Pretty | Output::Table => {
                    let told: crate::host::trace::EventTrace =
                        serde_json::from_str(&text).context("reading the trace")?;
                    print_line(&told.to_text())
                }
            }
        }
        Command::Subscribe(a) => subscribe(a).await,
        Command::Unsubscribe(a) => {
            let removed = crate::subscription::Subscription::removed(a.key);
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
        Command::Retention(a) => {
            let retention = R::ConfigureRetention {
                max_age_ms: a.max_age_ms,
                max_events: a.max_events,
            };
            request(&a.target, retention).await
        }
        Command::Redact(a) => {
            let redact = R::Redact {
                offset: a.offset,
                reason: a.reason,
            };
            request(&a.target, redact).await
        }
        Command::SetCursor(a) => {
            let set = R::SetSubscriptionCursor {
                subscription_key: a.key,
                after_offset: a.after_offset,
            };
            request(&a.target, set).await
        }
        Command::Pause(a) => {
            let paused = EventInput::paused(a.reason);
            request(&a.target, R::Append(AppendInput::new([paused]))).await
        }
        Command::Resume(a) => {
            request(
                &a.target,
                R::Append(AppendInput::new([EventInput::resumed()])),
            )
            .await
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
        Command::Backup(a) => backup(a).await,
        Command::Restore(a) => restore(a),
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
        Command::WebhookSecret(c) => webhook_secret(c).await,
        Command::Fold(a) => tokio::task::spawn_blocking(move || fold_offline(a)).await?,
        Command::Test(a) => tokio::task::spawn_blocking(move || test_offline(a)).await?,
        Command::Ingest(c) => ingest(c).await,
        Command::New(a) => new_project(a),
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

fn parse_object(flag: &str, text: &str) -> Result<Value> {
    let v: Value =
        serde_json::from_str(text).with_context(|| format!("{flag} {text:?} is not JSON"))?;
    if !v.is_object() {
        bail!("{flag} {text:?} is not a JSON object");
    }
    Ok(v)
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
