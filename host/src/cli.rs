//! The command line: `streamhost serve`, and client commands (`append`,
//! `events`, `state`) that talk to a running server over HTTP.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use crate::config::{Config, Durability};
use crate::host::Host;

/// Durable event streams with sandboxed WebAssembly processors.
#[derive(Debug, Parser)]
#[command(name = "streamhost", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (SQLite under the data dir).
    Serve(ServeArgs),
    /// Append one event to a stream.
    Append(AppendArgs),
    /// Read a page of a stream's events.
    Events(EventsArgs),
    /// Print a stream's reduced core state.
    State(StateArgs),
    /// Print a stream's events as they arrive, one JSON line each.
    Tail(TailArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (see API.md); flags override it.
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

/// Where a client command sends its request.
#[derive(Debug, Args)]
pub struct Target {
    /// Server URL.
    #[arg(long, env = "STREAMHOST_URL", default_value = "http://127.0.0.1:7410")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "STREAMHOST_TOKEN")]
    pub token: Option<String>,
    /// Project of the stream.
    #[arg(long, env = "STREAMHOST_PROJECT", conflicts_with = "global")]
    pub project: Option<String>,
    /// Use the deployment-wide namespace instead of a project.
    #[arg(long)]
    pub global: bool,
    /// Stream path, such as /orders/eu.
    pub stream: String,
}

#[derive(Debug, Args)]
pub struct AppendArgs {
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
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Compare-and-append: the offset the event must get.
    #[arg(long)]
    pub offset: Option<u64>,
    #[arg(long)]
    pub ephemeral: bool,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub target: Target,
    #[arg(long, default_value_t = 0)]
    pub after_offset: u64,
    #[arg(long, default_value_t = 500)]
    pub limit: usize,
    #[arg(long)]
    pub include_ephemeral: bool,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub target: Target,
    /// Replay the events after this offset first.
    #[arg(long)]
    pub after: Option<u64>,
    /// Only events of this type (repeatable).
    #[arg(long = "type")]
    pub event_types: Vec<String>,
    /// Only events for which this JSONata condition is true.
    #[arg(long = "where")]
    pub condition: Option<String>,
}

#[derive(Debug, Args)]
pub struct StateArgs {
    #[command(flatten)]
    pub target: Target,
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Append(a) => {
            let mut event = json!({"type": a.event_type});
            if let Some(p) = &a.payload {
                event["payload"] = parse_object("--payload", p)?;
            }
            if let Some(m) = &a.metadata {
                event["metadata"] = parse_object("--metadata", m)?;
            }
            if let Some(k) = a.idempotency_key {
                event["idempotencyKey"] = json!(k);
            }
            if let Some(o) = a.offset {
                event["offset"] = json!(o);
            }
            if a.ephemeral {
                event["ephemeral"] = json!(true);
            }
            let body = json!({ "events": [event] });
            request(&a.target, reqwest::Method::POST, "append", "", Some(body)).await
        }
        Command::Events(a) => {
            let query = format!(
                "?afterOffset={}&limit={}&includeEphemeral={}",
                a.after_offset, a.limit, a.include_ephemeral
            );
            request(&a.target, reqwest::Method::GET, "events", &query, None).await
        }
        Command::State(a) => request(&a.target, reqwest::Method::GET, "state", "", None).await,
        Command::Tail(a) => tail(a).await,
    }
}

async fn tail(a: TailArgs) -> Result<()> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("state", "false");
    if let Some(after) = a.after {
        query.append_pair("replayAfterOffset", &after.to_string());
    }
    if !a.event_types.is_empty() {
        query.append_pair("eventTypes", &a.event_types.join(","));
    }
    if let Some(c) = &a.condition {
        query.append_pair("jsonataCondition", c);
    }
    let url = stream_url(&a.target, "connect", &format!("?{}", query.finish()))?;
    let mut req = reqwest::Client::new().get(&url);
    if let Some(t) = &a.target.token {
        req = req.bearer_auth(t);
    }
    let mut response = req
        .send()
        .await
        .with_context(|| format!("connecting to {url}"))?;
    if !response.status().is_success() {
        let status = response.status();
        bail!("{status}: {}", response.text().await.unwrap_or_default());
    }
    let mut buffer = String::new();
    use std::io::Write;
    let stdout = std::io::stdout();
    while let Some(chunk) = response.chunk().await.context("reading the stream")? {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let message: String = buffer.drain(..end + 2).collect();
            let mut event = "message";
            let mut data = String::new();
            for line in message.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = if v.trim() == "closed" {
                        "closed"
                    } else {
                        "batch"
                    };
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if data.is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&data).context("a message that is not JSON")?;
            if event == "closed" {
                bail!("the server closed the connection: {v}");
            }
            let mut out = stdout.lock();
            for e in v["events"].as_array().into_iter().flatten() {
                writeln!(out, "{e}")?;
            }
            out.flush()?;
        }
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
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(data_dir = %config.data_dir.display(), durability = ?config.durability, "starting");
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

fn stream_url(target: &Target, stream_method: &str, query: &str) -> Result<String> {
    let namespace = match (&target.project, target.global) {
        (Some(p), false) => format!("projects/{p}"),
        (None, true) => "global".to_string(),
        _ => {
            bail!("name the stream's namespace: --project NAME (or STREAMHOST_PROJECT) or --global")
        }
    };
    if !target.stream.starts_with('/') {
        bail!("stream path {:?} must start with \"/\"", target.stream);
    }
    let path = if target.stream == "/" {
        ""
    } else {
        &target.stream
    };
    Ok(format!(
        "{}/v1/{namespace}/streams{path}:{stream_method}{query}",
        target.url.trim_end_matches('/')
    ))
}

async fn request(
    target: &Target,
    method: reqwest::Method,
    stream_method: &str,
    query: &str,
    body: Option<Value>,
) -> Result<()> {
    let namespace = match (&target.project, target.global) {
        (Some(p), false) => format!("projects/{p}"),
        (None, true) => "global".to_string(),
        _ => {
            bail!("name the stream's namespace: --project NAME (or STREAMHOST_PROJECT) or --global")
        }
    };
    if !target.stream.starts_with('/') {
        bail!("stream path {:?} must start with \"/\"", target.stream);
    }
    let path = if target.stream == "/" {
        ""
    } else {
        &target.stream
    };
    let url = format!(
        "{}/v1/{namespace}/streams{path}:{stream_method}{query}",
        target.url.trim_end_matches('/')
    );
    let client = reqwest::Client::new();
    let mut req = client.request(method, &url);
    if let Some(t) = &target.token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let response = req
        .send()
        .await
        .with_context(|| format!("requesting {url}"))?;
    let status = response.status();
    let text = response.text().await.context("reading the answer")?;
    let pretty = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text);
    if status.is_success() {
        println!("{pretty}");
        Ok(())
    } else {
        bail!("{status}: {pretty}")
    }
}
