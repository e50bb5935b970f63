//! The effector: returns whatever effects its events ask for. A tool for
//! trying the outbox by hand and for the tests: each
//! `events.example/effects-requested` event's payload is
//! `{"effects": [{"key": K, "append": {"streamPath", "type", "payload"}}
//! | {"key": K, "webhook": {"url", "body"}}
//! | {"key": K, "itx": {"expression", "args"}}
//! | {"key": K, "cancel": KEY}]}` (a cancel's own key is `cancel:KEY`), each optionally with `"afterMs"` (not
//! before that long after the event), `"notBefore"` (ms since the epoch),
//! `"type"`, `"metadata"` and `"group"`.
//! The state counts the events folded.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use streamhost_guest::{Context, Event, Failure, Processor};

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Seen {
    pub events: u64,
    pub effects: u64,
}

#[derive(Deserialize)]
struct Requested {
    effects: Vec<Request>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    key: String,
    append: Option<AppendRequest>,
    webhook: Option<WebhookRequest>,
    itx: Option<ItxRequest>,
    cancel: Option<String>,
    after_ms: Option<u64>,
    not_before: Option<u64>,
    #[serde(rename = "type")]
    effect_type: Option<String>,
    metadata: Option<Value>,
    group: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AppendRequest {
    stream_path: String,
    #[serde(rename = "type")]
    event_type: String,
    #[serde(default)]
    payload: Value,
}

#[derive(Deserialize)]
struct WebhookRequest {
    url: String,
    #[serde(default)]
    body: Value,
}

#[derive(Deserialize)]
struct ItxRequest {
    expression: Value,
    #[serde(default)]
    args: Vec<Value>,
}

pub struct Effector;

impl Processor for Effector {
    type State = Seen;
    const SLUG: &'static str = "effector";
    const VERSION: &'static str = "1.0.0";
    const CONSUMES: &'static [&'static str] = &["events.example/effects-requested"];

    fn fold(state: &mut Seen, event: &Event, ctx: &mut Context) -> Result<(), Failure> {
        state.events += 1;
        let requested: Requested = event.payload_as()?;
        for r in requested.effects {
            state.effects += 1;
            let mut asked = if let Some(a) = r.append {
                ctx.append(r.key, &a.stream_path, &a.event_type, &a.payload)
            } else if let Some(w) = r.webhook {
                ctx.webhook(r.key, &w.url, &w.body)
            } else if let Some(i) = r.itx {
                ctx.itx(r.key, &i.expression, &i.args)
            } else if let Some(key) = r.cancel {
                ctx.cancel(key)
            } else {
                return Err(Failure::fatal(format!(
                    "effect {:?} names no target (append, webhook, itx or cancel)",
                    r.key
                )));
            };
            if let Some(ms) = r.after_ms {
                asked = asked.after(std::time::Duration::from_millis(ms));
            }
            if let Some(ms) = r.not_before {
                asked = asked.at(ms);
            }
            if let Some(t) = r.effect_type {
                asked = asked.typed(t);
            }
            if let Some(m) = r.metadata {
                asked = asked.metadata(&m);
            }
            if let Some(g) = r.group {
                asked.group(g);
            }
        }
        Ok(())
    }
}

streamhost_guest::processor!(Effector);
