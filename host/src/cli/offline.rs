//! Processors without a server: `fold` and `test` over JSONL fixtures.

use super::*;

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
    /// Where compiled components are kept (default: the system's temp dir,
    /// `streamhost-fold-cache`); a server's `--compile-cache-dir` may be
    /// shared.
    #[arg(long, value_name = "DIR", env = "STREAMHOST_COMPILE_CACHE_DIR")]
    pub compile_cache_dir: Option<PathBuf>,
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
    /// Fold the same events through this component too (a port to another
    /// language, a new version) and name the first offset whose state or
    /// keyed state differs, instead of the checks above.
    #[arg(long, conflicts_with_all = ["expect", "splits"])]
    pub against: Option<PathBuf>,
    /// Where compiled components are kept (default: the system's temp dir,
    /// `streamhost-fold-cache`); a server's `--compile-cache-dir` may be
    /// shared.
    #[arg(long, value_name = "DIR", env = "STREAMHOST_COMPILE_CACHE_DIR")]
    pub compile_cache_dir: Option<PathBuf>,
}

pub(super) fn parse_seed_arg(s: &str) -> Result<[u8; 32], String> {
    crate::processor::runtime::parse_seed(s)
}

/// Events from a JSONL file (`type`, `payload`, optional `offset`,
/// `metadata`, `createdAt`, `idempotencyKey`), those of `consumes` (empty:
/// all).
pub(super) fn read_events(
    path: &std::path::Path,
    consumes: &[String],
) -> Result<Vec<crate::stream::Event>> {
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
            trace: None,
            redacted: None,
        });
    }
    Ok(events)
}

/// A processor component from a file, compiled for an offline fold: the
/// runtime, the component, its name (the file's stem) and announcement.
pub(super) struct OfflineProcessor {
    runtime: std::sync::Arc<crate::processor::runtime::Runtime>,
    prepared: std::sync::Arc<crate::processor::runtime::Prepared>,
    name: String,
    announcement: crate::processor::runtime::Announcement,
}

pub(super) fn offline_processor(
    component: &std::path::Path,
    timeout_ms: u64,
    cache_dir: Option<&std::path::Path>,
) -> Result<OfflineProcessor> {
    use crate::processor::runtime::Runtime;
    let bytes =
        std::fs::read(component).with_context(|| format!("reading {}", component.display()))?;
    let cache_dir = cache_dir
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| std::env::temp_dir().join("streamhost-fold-cache"));
    let runtime = Runtime::new(cache_dir)?;
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
pub(super) fn test_offline(a: TestArgs) -> Result<()> {
    let p = offline_processor(&a.component, a.timeout_ms, a.compile_cache_dir.as_deref())?;
    if let Some(other) = &a.against {
        return test_against(&a, &p, other);
    }
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
            output: None,
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

/// `streamhost test A --against B`: both over the same events, compared
/// offset by offset (`processor::check::Against`).
fn test_against(a: &TestArgs, p: &OfflineProcessor, other: &std::path::Path) -> Result<()> {
    use crate::processor::check::{Against, Side};
    use crate::processor::wake::Guest;
    let q = offline_processor(other, a.timeout_ms, a.compile_cache_dir.as_deref())?;
    let a_events = read_events(&a.events, &p.announcement.consumes)?;
    let b_events = read_events(&a.events, &q.announcement.consumes)?;
    if a_events.is_empty() && b_events.is_empty() {
        bail!(
            "{} holds no event either processor consumes ({:?}, {:?})",
            a.events.display(),
            p.announcement.consumes,
            q.announcement.consumes
        );
    }
    let (a_path, b_path) = (
        a.component.display().to_string(),
        other.display().to_string(),
    );
    fn side(o: &OfflineProcessor, timeout_ms: u64) -> Guest<'_> {
        Guest {
            runtime: &o.runtime,
            prepared: &o.prepared,
            component: &o.name,
            timeout_ms,
            output: None,
        }
    }
    let against = Against {
        a: Side {
            guest: side(p, a.timeout_ms),
            path: &a_path,
            events: &a_events,
        },
        b: Side {
            guest: side(&q, a.timeout_ms),
            path: &b_path,
            events: &b_events,
        },
        stream: crate::processor::runtime::StreamInfo {
            project_id: None,
            path: "/test".into(),
            stream_id: a.stream_id.clone(),
            stream_created_at: "1970-01-01T00:00:00.000Z".into(),
            max_offset: a_events
                .iter()
                .chain(&b_events)
                .map(|e| e.offset)
                .max()
                .unwrap_or(0),
        },
    };
    match against.run() {
        Ok(n) => {
            println!(
                "ok: {a_path} and {b_path} end in the same state and keyed state after each of {n} offsets"
            );
            Ok(())
        }
        Err(counterexample) => bail!("{counterexample}"),
    }
}

/// `streamhost fold`: folds a component over a JSONL file, offline.
pub(super) fn fold_offline(a: FoldArgs) -> Result<()> {
    use crate::processor::runtime::{Batch, Determinism, StreamInfo};
    let OfflineProcessor {
        runtime,
        prepared,
        name,
        announcement,
    } = offline_processor(&a.component, a.timeout_ms, a.compile_cache_dir.as_deref())?;
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
        output: None,
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
                None,
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
