//! Commands on processor instances: show, keys, verify, backfill, shadows.

use super::*;

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

/// `streamhost processor --wait`: the processor once its checkpoint is at
/// the stream's head.
pub(super) async fn processor_caught_up(a: ProcessorArgs) -> Result<()> {
    let processor = StreamRequest::Processor {
        component: a.component.clone(),
    };
    let what = format!("processor {:?} did not catch up", a.component);
    let p = poll(a.timeout_ms, &what, || async {
        let Some(p) = stream_json(&a.target.server, &a.target.stream, &processor).await? else {
            return Ok(Err("it has no instance yet".to_string()));
        };
        let checkpoint = p["checkpointOffset"].as_u64().unwrap_or(0);
        // A halted processor folds nothing until someone acts: waiting is
        // pointless, the reason is the answer.
        if p["status"] == "halted" {
            anyhow::bail!(
                "processor {:?} is halted at offset {checkpoint}: {}\nhint: fix the cause, then \
                 streamhost resume-subscription {} <key> (or deploy a new version)",
                a.component,
                p["lastError"].as_str().unwrap_or("(no error recorded)"),
                a.target.stream
            );
        }
        let failing = match (&p["status"], p["lastError"].as_str()) {
            (s, Some(e)) if s == "failing" => format!("; it is failing: {e}"),
            _ => String::new(),
        };
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
            _ => Err(format!("its checkpoint is at offset {checkpoint}{failing}")),
        })
    })
    .await?;
    print_line(&render(&p))
}

/// `streamhost keys`: a processor's keys, every key, or one.
pub(super) async fn keys(a: KeysArgs) -> Result<()> {
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

/// `streamhost backfill`: streams the server's progress lines and draws
/// them as a bar on a terminal (or prints them as lines otherwise).
pub(super) async fn backfill(a: BackfillArgs) -> Result<()> {
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
pub(super) fn progress_text(p: &Value) -> String {
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

pub(super) async fn verify(a: VerifyArgs) -> Result<()> {
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

pub(super) async fn shadow(c: ShadowCommand) -> Result<()> {
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
