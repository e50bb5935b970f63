//! Commands on streams: append, read, list, tail, wait, pause, status.

use super::*;

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub server: Server,
    /// Only streams whose path starts with this.
    #[arg(long, default_value = "/")]
    pub prefix: String,
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

#[derive(Debug, Args)]
pub(crate) struct HealthArgs {
    /// Server URL.
    #[arg(long, env = "STREAMHOST_URL", default_value = "http://127.0.0.1:7410")]
    pub url: String,
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

pub(super) async fn list_streams(a: StreamsArgs) -> Result<()> {
    let mut query = StreamsQuery::new().prefix(&a.prefix).limit(a.limit);
    query.after_path = a.after_path.clone();
    let call = mapping::render_list(&a.server.namespace()?, &query);
    print_answer(api(&a.server.url, a.server.token.as_deref(), call).await?).await
}

/// `streamhost status`.
pub(super) async fn status(a: StatusArgs) -> Result<()> {
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
    let mut failing = Vec::new();
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
            // A processor's wake is a subscription: name the processor.
            let mut problem = json!({"stream": path, "subscription": key});
            if let Some(p) = sub["processor"].as_str() {
                problem["processor"] = json!(p);
            }
            problem["lastError"] = sub["lastError"].clone();
            if sub["halted"] == true {
                halted.push(problem);
            } else if sub["attempt"].as_u64().unwrap_or(0) > 0 {
                problem["attempt"] = sub["attempt"].clone();
                failing.push(problem);
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
    // What needs someone comes first: the server may be fine while a
    // processor is halted.
    let summary = match (health.as_str(), halted.len(), failing.len()) {
        ("ok", 0, 0) => "ok".to_string(),
        ("ok", h, f) => format!("attention: {h} halted, {f} failing"),
        (other, _, _) => other.to_string(),
    };
    print_line(&render(&json!({
        "health": summary,
        "halted": halted,
        "failing": failing,
        "server": health,
        "streams": streams.len(),
        "events": streams.iter().map(|s| s["eventCount"].as_u64().unwrap_or(0)).sum::<u64>(),
        "paused": paused,
        "subscriptions": subscriptions,
        "lag": lag,
        "mostBehind": most_behind,
    })))
}

/// `streamhost events --jsonl`: every page after the offset, one event a line.
pub(super) async fn events_jsonl(a: EventsArgs) -> Result<()> {
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

pub(super) async fn tail(a: TailArgs) -> Result<()> {
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

#[derive(Debug, Args)]
pub(crate) struct RetentionArgs {
    #[command(flatten)]
    pub target: Target,
    /// Events older than this many milliseconds go.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_age_ms: Option<u64>,
    /// Beyond this many stored events, the oldest go.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_events: Option<u64>,
}

#[derive(Debug, Args)]
pub(crate) struct RedactArgs {
    #[command(flatten)]
    pub target: Target,
    /// The event's offset.
    pub offset: u64,
    /// Why (kept with the event and in its `event-redacted` line).
    #[arg(long, default_value = "")]
    pub reason: String,
}
