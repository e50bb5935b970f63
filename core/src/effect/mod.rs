//! Effects: the processor outbox, pure half. A fold returns effects; they
//! are checked here (`parse`), committed with the checkpoint that produced
//! them, and run after the commit by `executor::effect`, which leases them,
//! executes their target and settles them with [`settle`]. An effect's
//! identity is (project, source path, component, key): a second effect with
//! the same identity is ignored by the store.

use serde_json::{json, Map, Value};

use crate::delivery::wait_ms;
use crate::delivery::DeliveryConfig;
use crate::stream::canonicalize_path;
use crate::trace::Trace;

/// Largest effect key, in bytes.
pub const KEY_BYTES_MAX: usize = 512;
/// Largest `lastError` kept, in bytes.
pub const ERROR_TEXT_BYTES_MAX: usize = 4096;
/// Largest envelope `type` and `group`, in bytes.
pub const ENVELOPE_TEXT_BYTES_MAX: usize = 256;
/// How far after the event that asks it an effect's `not-before` may be:
/// ten years (of 365.25 days), in milliseconds.
pub const NOT_BEFORE_AHEAD_MS_MAX: i64 = 10 * 36_525 * 86_400_000 / 100;

/// What an effect does.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Append one event to `stream_path` in the processor's namespace.
    Append {
        stream_path: String,
        event_type: String,
        payload: Map<String, Value>,
        metadata: Option<Map<String, Value>>,
    },
    /// POST `body` to `url`.
    Webhook { url: String, body: Value },
    /// Call an ITX expression with arguments.
    Itx { expression: Value, args: Vec<Value> },
    /// Cancel the same consumer's pending effect with this key (applied in
    /// the commit that stores it).
    Cancel { key: String },
}

impl Target {
    /// The stored and served form: `{"append": {...}}` and so on, fields in
    /// camelCase, JSON fields parsed.
    pub fn to_json(&self) -> Value {
        match self {
            Target::Append {
                stream_path,
                event_type,
                payload,
                metadata,
            } => json!({"append": {"streamPath": stream_path, "type": event_type,
                "payload": payload, "metadata": metadata}}),
            Target::Webhook { url, body } => json!({"webhook": {"url": url, "body": body}}),
            Target::Itx { expression, args } => {
                json!({"itx": {"expression": expression, "args": args}})
            }
            Target::Cancel { key } => json!({"cancel": {"key": key}}),
        }
    }

    /// Reads the stored form back.
    pub fn from_json(v: &Value) -> Result<Target, String> {
        let object = |v: &Value, at: &str| -> Result<Map<String, Value>, String> {
            v.as_object()
                .cloned()
                .ok_or_else(|| format!("{at} must be a JSON object, got {v}"))
        };
        if let Some(a) = v.get("append") {
            return Ok(Target::Append {
                stream_path: a["streamPath"].as_str().unwrap_or_default().to_string(),
                event_type: a["type"].as_str().unwrap_or_default().to_string(),
                payload: object(&a["payload"], "append.payload")?,
                metadata: match &a["metadata"] {
                    Value::Null => None,
                    m => Some(object(m, "append.metadata")?),
                },
            });
        }
        if let Some(w) = v.get("webhook") {
            return Ok(Target::Webhook {
                url: w["url"].as_str().unwrap_or_default().to_string(),
                body: w["body"].clone(),
            });
        }
        if let Some(i) = v.get("itx") {
            return Ok(Target::Itx {
                expression: i["expression"].clone(),
                args: i["args"].as_array().cloned().unwrap_or_default(),
            });
        }
        if let Some(key) = v.get("cancel").and_then(|c| c["key"].as_str()) {
            return Ok(Target::Cancel {
                key: key.to_string(),
            });
        }
        Err(format!("unknown effect target {v}"))
    }
}

/// An effect as a fold returned it, its JSON fields still text.
#[derive(Debug, Clone)]
pub enum Returned<'a> {
    Append {
        stream_path: &'a str,
        event_type: &'a str,
        payload: &'a str,
        metadata: Option<&'a str>,
    },
    Webhook {
        url: &'a str,
        body: &'a str,
    },
    Itx {
        expression: &'a str,
        args: &'a str,
    },
    Cancel {
        key: &'a str,
    },
}

/// An effect as a fold or a reactor returned it: its target and envelope,
/// its JSON fields still text.
#[derive(Debug, Clone)]
pub struct ReturnedEffect<'a> {
    pub key: &'a str,
    pub target: Returned<'a>,
    /// Milliseconds since the epoch.
    pub not_before: Option<u64>,
    pub effect_type: Option<&'a str>,
    pub metadata: Option<&'a str>,
    pub group: Option<&'a str>,
}

/// An effect checked, in the outbox's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub key: String,
    /// The stored target: [`Target::to_json`] with the envelope beside it
    /// (`type`, `metadata`, `group`).
    pub stored: Value,
    /// Not attempted before this time (ms since the epoch).
    pub not_before_ms: Option<i64>,
    /// The key of the effect it cancels, for a `cancel` target.
    pub cancels: Option<String>,
    /// Its ordering group: effects of one consumer and group run one at a
    /// time, in commit order.
    pub group: Option<String>,
    /// A webhook's destination (its host name, whose places it takes).
    pub destination: Option<String>,
}

/// Checks an effect and its envelope (`at` names it: `effects[2]`);
/// `clock_ms` is the time of the event that asked it (the fold's or the
/// reactor's clock): `not-before` may be at most
/// [`NOT_BEFORE_AHEAD_MS_MAX`] after it.
pub fn check(at: &str, returned: ReturnedEffect<'_>, clock_ms: i64) -> Result<Checked, String> {
    let target = parse(at, returned.key, returned.target)?;
    let mut stored = target.to_json();
    for (field, text) in [("type", returned.effect_type), ("group", returned.group)] {
        if let Some(t) = text {
            if t.trim().is_empty()
                || t.len() > ENVELOPE_TEXT_BYTES_MAX
                || t.contains(char::is_control)
            {
                return Err(format!(
                    "{at}.{field} {t:?} must be 1 to {ENVELOPE_TEXT_BYTES_MAX} bytes without control characters"
                ));
            }
            stored[field] = Value::String(t.to_string());
        }
    }
    if let Some(m) = returned.metadata {
        match serde_json::from_str::<Value>(m) {
            Ok(v @ Value::Object(_)) => stored["metadata"] = v,
            _ => {
                return Err(format!(
                    "{at}.metadata must be a JSON object, got {}",
                    preview(m)
                ))
            }
        }
    }
    let not_before_ms = match returned.not_before {
        None => None,
        Some(ms) => {
            let latest = clock_ms.saturating_add(NOT_BEFORE_AHEAD_MS_MAX);
            match i64::try_from(ms) {
                Ok(ms) if ms <= latest => Some(ms),
                _ => {
                    return Err(format!(
                        "{at}.not-before {ms} is more than 10 years after the event that asks it \
                         ({}): it must be at most {latest} (ms since the epoch)",
                        crate::clock::format_timestamp(clock_ms)
                    ))
                }
            }
        }
    };
    let cancels = match &target {
        Target::Cancel { key } => Some(key.clone()),
        _ => None,
    };
    let destination = match &target {
        Target::Webhook { url, .. } => crate::delivery::webhook::destination(url),
        _ => None,
    };
    Ok(Checked {
        key: returned.key.to_string(),
        stored,
        not_before_ms,
        cancels,
        group: returned.group.map(str::to_string),
        destination,
    })
}

impl Checked {
    /// Records what caused it beside its stored target: the offsets of the
    /// events folded by the call that returned it (one event for a reactor
    /// or a fold of one event) and the trace context it carries on (that of
    /// the latest of them that had one), so a trace of any age can be told
    /// from storage.
    pub fn caused_by(mut self, from_offset: u64, to_offset: u64, trace: Option<&Trace>) -> Checked {
        if let Value::Object(m) = &mut self.stored {
            m.insert(
                "cause".into(),
                json!({"fromOffset": from_offset, "toOffset": to_offset}),
            );
            if let Some(t) = trace {
                m.insert("trace".into(), json!(t));
            }
        }
        self
    }
}

/// The offsets of the events that caused a stored effect (see
/// [`Checked::caused_by`]); `None` for one stored before causes were kept.
pub fn stored_cause(stored: &Value) -> Option<(u64, u64)> {
    let c = stored.get("cause")?;
    Some((c["fromOffset"].as_u64()?, c["toOffset"].as_u64()?))
}

/// The trace context a stored effect carries on, if any.
pub fn stored_trace(stored: &Value) -> Option<Trace> {
    serde_json::from_value::<Trace>(stored.get("trace")?.clone())
        .ok()
        .and_then(Trace::checked)
}

/// Checks an effect a fold returned (`at` names it: `effects[2]`), so a bad
/// one fails the fold with its value named instead of failing later.
pub fn parse(at: &str, key: &str, returned: Returned<'_>) -> Result<Target, String> {
    if key.trim().is_empty() {
        return Err(format!("{at}.key is empty"));
    }
    if key.contains('\0') {
        return Err(format!("{at}.key {key:?} contains a NUL byte"));
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(format!(
            "{at}.key is {} bytes, over the {KEY_BYTES_MAX}-byte limit",
            key.len()
        ));
    }
    let json_of = |field: &str, text: &str| -> Result<Value, String> {
        serde_json::from_str(text)
            .map_err(|e| format!("{at}.{field} is not JSON ({e}): {}", preview(text)))
    };
    let object_of = |field: &str, text: &str| -> Result<Map<String, Value>, String> {
        match json_of(field, text)? {
            Value::Object(m) => Ok(m),
            other => Err(format!("{at}.{field} must be a JSON object, got {other}")),
        }
    };
    match returned {
        Returned::Append {
            stream_path,
            event_type,
            payload,
            metadata,
        } => {
            let path = canonicalize_path(stream_path)
                .map_err(|e| format!("{at}.stream-path {stream_path:?}: {}", e.message))?;
            if event_type.trim().is_empty() {
                return Err(format!("{at}.type is empty"));
            }
            Ok(Target::Append {
                stream_path: path,
                event_type: event_type.to_string(),
                payload: object_of("payload", payload)?,
                metadata: metadata.map(|m| object_of("metadata", m)).transpose()?,
            })
        }
        Returned::Webhook { url, body } => {
            let parsed = url::Url::parse(url).map_err(|e| format!("{at}.url {url:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("{at}.url {url:?} must be http or https"));
            }
            Ok(Target::Webhook {
                url: url.to_string(),
                body: json_of("body", body)?,
            })
        }
        Returned::Itx { expression, args } => {
            let expression = json_of("expression", expression)?;
            crate::itx::resolve(&expression)
                .map_err(|e| format!("{at}.expression {expression}: {e}"))?;
            let args = match json_of("args", args)? {
                Value::Array(a) => a,
                other => return Err(format!("{at}.args must be a JSON array, got {other}")),
            };
            Ok(Target::Itx { expression, args })
        }
        Returned::Cancel { key: cancelled } => {
            if cancelled.is_empty() || cancelled.len() > KEY_BYTES_MAX || cancelled.contains('\0') {
                return Err(format!(
                    "{at}.cancel {} must be an effect key: 1 to {KEY_BYTES_MAX} bytes without NUL",
                    preview(cancelled)
                ));
            }
            Ok(Target::Cancel {
                key: cancelled.to_string(),
            })
        }
    }
}

fn preview(text: &str) -> String {
    let mut end = text.len().min(80);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end < text.len() {
        format!("{:?}…", &text[..end])
    } else {
        format!("{text:?}")
    }
}

/// The outbox's `component` of a reactor's effects: `reactor:<name>`
/// (component names never hold a `:`, so the two never share an identity).
pub const EFFECT_COMPONENT_PREFIX: &str = "reactor:";

/// The outbox component of reactor `name`'s effects.
pub fn effect_component(name: &str) -> String {
    format!("{EFFECT_COMPONENT_PREFIX}{name}")
}

/// The reactor whose effect this outbox component is, if a reactor's.
pub fn reactor_of(component: &str) -> Option<&str> {
    component.strip_prefix(EFFECT_COMPONENT_PREFIX)
}

/// Who produced an effect: the processor's component, or the reactor's
/// name (its outbox component is `reactor:<name>`).
pub fn consumer(component: &str) -> (&'static str, &str) {
    match reactor_of(component) {
        Some(name) => ("reactor", name),
        None => ("processor", component),
    }
}

/// The headers of a webhook effect's POST: `idempotency-key` (the effect
/// id), and its envelope: `streamhost-effect-consumer` (`processor:<component>`
/// or `reactor:<name>`), `streamhost-effect-key`, and when the effect has
/// them `streamhost-effect-type` and `streamhost-effect-metadata` (JSON,
/// non-ASCII escaped).
/// `id`, `component`, `key` and `target` are the stored effect's.
pub fn webhook_headers(
    id: i64,
    component: &str,
    key: &str,
    target: &Value,
) -> Vec<(&'static str, String)> {
    let (kind, name) = consumer(component);
    let mut headers = vec![
        ("idempotency-key", id.to_string()),
        ("streamhost-effect-consumer", format!("{kind}:{name}")),
        ("streamhost-effect-key", ascii(key)),
    ];
    if let Some(t) = target.get("type").and_then(Value::as_str) {
        headers.push(("streamhost-effect-type", ascii(t)));
    }
    if let Some(m) = target.get("metadata").filter(|m| m.is_object()) {
        headers.push(("streamhost-effect-metadata", ascii(&m.to_string())));
    }
    headers
}

/// The `traceparent` and `tracestate` headers of a request that carries
/// `trace` on (none without one).
pub fn trace_headers(trace: Option<&Trace>) -> Vec<(&'static str, String)> {
    let Some(t) = trace else {
        return Vec::new();
    };
    let mut headers = vec![("traceparent", t.traceparent.clone())];
    if let Some(s) = &t.tracestate {
        headers.push(("tracestate", s.clone()));
    }
    headers
}

/// A header value: printable ASCII kept, anything else escaped as `\uXXXX`
/// (JSON's escape, so JSON stays JSON).
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if (' '..='~').contains(&c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// The idempotency key of an `append` effect's event.
pub fn append_idempotency_key(component: &str, source_path: &str, key: &str) -> String {
    format!("effect:{component}:{source_path}:{key}")
}

/// The idempotency key of the `error-occurred` line of a failed effect: one
/// line per failure, whatever the number of times settling it is repeated.
pub fn error_line_key(id: i64, retries: u32) -> String {
    format!("effect-failed:{id}:{retries}")
}

/// Where an effect is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for its (next) attempt.
    Pending,
    /// An attempt is running.
    Running,
    /// Done.
    Succeeded,
    /// Failed for good, until retried.
    Failed,
    /// Cancelled, until retried.
    Cancelled,
}

impl Status {
    /// Every status.
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Running,
        Status::Succeeded,
        Status::Failed,
        Status::Cancelled,
    ];

    /// The status as stored and served (`pending`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status named `s`.
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// `:retry` applies.
    pub fn retryable(self) -> bool {
        matches!(self, Status::Failed | Status::Cancelled)
    }

    /// `:cancel` applies.
    pub fn cancellable(self) -> bool {
        matches!(self, Status::Pending | Status::Failed)
    }
}

/// What one execution came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done; an ITX call's result is kept.
    Succeeded { result: Option<Value> },
    /// Not done; `retryable: false` fails the effect at once;
    /// `retry_after_ms`: the receiver asked for no attempt before this long
    /// (`429`/`503` with `retry-after`).
    Failed {
        message: String,
        retryable: bool,
        retry_after_ms: Option<u64>,
    },
}

/// How an effect is settled after an execution.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    Succeeded {
        result: Option<Value>,
    },
    /// Pending again, not before `at_ms`.
    Retry {
        at_ms: i64,
        error: String,
    },
    /// Terminal: the error line goes to the source stream.
    Failed {
        error: String,
    },
}

/// Decides the settlement of an execution that was attempt number
/// `attempts` (1-based). `jitter` is uniform in `[-1, 1]`.
pub fn settle(
    outcome: Outcome,
    attempts: u32,
    max_attempts: u32,
    backoff: &DeliveryConfig,
    now_ms: i64,
    jitter: f64,
) -> Settlement {
    match outcome {
        Outcome::Succeeded { result } => Settlement::Succeeded { result },
        Outcome::Failed {
            message,
            retryable,
            retry_after_ms,
        } => {
            let error = cap(&message);
            if retryable && attempts < max_attempts {
                Settlement::Retry {
                    at_ms: now_ms + wait_ms(backoff, attempts, jitter, retry_after_ms) as i64,
                    error,
                }
            } else {
                Settlement::Failed { error }
            }
        }
    }
}

/// `message` cut to [`ERROR_TEXT_BYTES_MAX`] at a character boundary.
pub fn cap(message: &str) -> String {
    if message.len() <= ERROR_TEXT_BYTES_MAX {
        return message.to_string();
    }
    let mut end = ERROR_TEXT_BYTES_MAX - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// The payload of the `error-occurred` line a failed effect appends to its
/// processor's source stream.
pub fn error_line(
    id: i64,
    component: &str,
    key: &str,
    attempts: u32,
    error: &str,
) -> Map<String, Value> {
    let mut line = Map::new();
    let (kind, name) = consumer(component);
    line.insert(
        "message".into(),
        Value::String(format!(
            "effect {key:?} of {kind} {name:?} failed after {attempts} attempt(s): {error}"
        )),
    );
    line.insert(
        "effect".into(),
        json!({"id": id, "component": component, "key": key}),
    );
    line
}

/// Whether a webhook effect that got `status` (none: no answer, a network
/// error or the timeout) may succeed if tried again: 408, 429 and 5xx may;
/// any other answer fails the effect at once.
pub fn webhook_retryable(status: Option<u16>) -> bool {
    match status {
        None => true,
        Some(s) => s == 408 || s == 429 || (500..600).contains(&s),
    }
}

impl Settlement {
    /// For metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Settlement::Succeeded { .. } => "succeeded",
            Settlement::Retry { .. } => "retry",
            Settlement::Failed { .. } => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> DeliveryConfig {
        DeliveryConfig {
            max_attempts: 15,
            backoff_base_ms: 1000,
            backoff_max_ms: 60_000,
            timeout_ms: 1000,
            ..DeliveryConfig::default()
        }
    }

    #[test]
    fn a_retryable_failure_backs_off_until_the_last_attempt_fails_it() {
        let failed = || Outcome::Failed {
            message: "503".into(),
            retryable: true,
            retry_after_ms: None,
        };
        assert_eq!(
            settle(failed(), 1, 3, &policy(), 10_000, 0.0),
            Settlement::Retry {
                at_ms: 11_000,
                error: "503".into()
            }
        );
        assert_eq!(
            settle(failed(), 2, 3, &policy(), 10_000, 0.0),
            Settlement::Retry {
                at_ms: 12_000,
                error: "503".into()
            }
        );
        assert_eq!(
            settle(failed(), 3, 3, &policy(), 10_000, 0.0),
            Settlement::Failed {
                error: "503".into()
            }
        );
        // A receiver's retry-after (a 429) is waited for when longer.
        let asked = Outcome::Failed {
            message: "429".into(),
            retryable: true,
            retry_after_ms: Some(5_000),
        };
        assert_eq!(
            settle(asked, 1, 3, &policy(), 10_000, 0.0),
            Settlement::Retry {
                at_ms: 15_000,
                error: "429".into()
            }
        );
    }

    #[test]
    fn a_non_retryable_failure_fails_at_once_and_success_keeps_the_result() {
        let outcome = Outcome::Failed {
            message: "404 Not Found".into(),
            retryable: false,
            retry_after_ms: None,
        };
        assert_eq!(
            settle(outcome, 1, 15, &policy(), 0, 0.0),
            Settlement::Failed {
                error: "404 Not Found".into()
            }
        );
        let ok = Outcome::Succeeded {
            result: Some(json!({"ok": 1})),
        };
        assert_eq!(
            settle(ok, 7, 15, &policy(), 0, 0.0),
            Settlement::Succeeded {
                result: Some(json!({"ok": 1}))
            }
        );
    }

    #[test]
    fn returned_effects_are_checked_naming_the_bad_value() {
        let bad_path = parse(
            "effects[0]",
            "k",
            Returned::Append {
                stream_path: "/a/b c",
                event_type: "x.y/z",
                payload: "{}",
                metadata: None,
            },
        )
        .unwrap_err();
        assert!(
            bad_path.starts_with("effects[0].stream-path \"/a/b c\""),
            "{bad_path}"
        );
        let bad_payload = parse(
            "effects[1]",
            "k",
            Returned::Append {
                stream_path: "/out",
                event_type: "x.y/z",
                payload: "[1]",
                metadata: None,
            },
        )
        .unwrap_err();
        assert_eq!(
            bad_payload,
            "effects[1].payload must be a JSON object, got [1]"
        );
        let bad_url = parse(
            "effects[2]",
            "k",
            Returned::Webhook {
                url: "ftp://x",
                body: "{}",
            },
        )
        .unwrap_err();
        assert_eq!(bad_url, "effects[2].url \"ftp://x\" must be http or https");
        let bad_itx = parse(
            "effects[3]",
            "k",
            Returned::Itx {
                expression: "[\"components\"]",
                args: "[]",
            },
        )
        .unwrap_err();
        assert!(bad_itx.starts_with("effects[3].expression"), "{bad_itx}");
        let empty_key = parse(
            "effects[4]",
            " ",
            Returned::Webhook {
                url: "http://x",
                body: "{}",
            },
        )
        .unwrap_err();
        assert_eq!(empty_key, "effects[4].key is empty");
    }

    #[test]
    fn a_target_survives_its_stored_form() {
        let target = parse(
            "e",
            "k",
            Returned::Append {
                stream_path: "/out/./x",
                event_type: "x.y/z",
                payload: "{\"n\":1}",
                metadata: Some("{\"m\":true}"),
            },
        )
        .unwrap();
        let stored = target.to_json();
        assert_eq!(stored["append"]["streamPath"], "/out/x");
        assert_eq!(Target::from_json(&stored).unwrap(), target);
        let itx = parse(
            "e",
            "k",
            Returned::Itx {
                expression: "[\"components\", [\"get\", \"c\"], \"f\"]",
                args: "[1, \"two\"]",
            },
        )
        .unwrap();
        assert_eq!(Target::from_json(&itx.to_json()).unwrap(), itx);
    }

    fn asked<'a>(target: Returned<'a>, not_before: Option<u64>) -> ReturnedEffect<'a> {
        ReturnedEffect {
            key: "k",
            target,
            not_before,
            effect_type: None,
            metadata: None,
            group: None,
        }
    }

    #[test]
    fn a_time_is_kept_up_to_ten_years_after_the_event_and_refused_beyond_naming_the_field() {
        let hook = || Returned::Webhook {
            url: "http://x",
            body: "{}",
        };
        let clock = 1_796_428_801_000;
        let latest = clock + NOT_BEFORE_AHEAD_MS_MAX;
        let ok = check("effects[0]", asked(hook(), Some(latest as u64)), clock).unwrap();
        assert_eq!(ok.not_before_ms, Some(latest));
        assert_eq!(ok.cancels, None);
        let past = check("effects[0]", asked(hook(), Some(0)), clock).unwrap();
        assert_eq!(
            past.not_before_ms,
            Some(0),
            "the past is kept: it runs at once"
        );
        for too_far in [latest as u64 + 1, u64::MAX] {
            let e = check("effects[3]", asked(hook(), Some(too_far)), clock).unwrap_err();
            assert!(
                e.starts_with(&format!(
                    "effects[3].not-before {too_far} is more than 10 years after the event"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn the_envelope_is_stored_beside_the_target_and_a_cancel_names_its_key() {
        let mut e = asked(
            Returned::Append {
                stream_path: "/out",
                event_type: "x.y/z",
                payload: "{}",
                metadata: None,
            },
            None,
        );
        e.effect_type = Some("Remind");
        e.metadata = Some("{\"m\":1}");
        e.group = Some("order-1");
        let checked = check("effects[0]", e.clone(), 0).unwrap();
        assert_eq!(checked.stored["type"], "Remind");
        assert_eq!(checked.stored["metadata"], json!({"m": 1}));
        assert_eq!(checked.stored["group"], "order-1");
        assert_eq!(
            Target::from_json(&checked.stored).unwrap(),
            parse("e", "k", e.target.clone()).unwrap()
        );
        for (field, bad) in [("type", ""), ("group", "a\nb")] {
            let mut e = e.clone();
            if field == "type" {
                e.effect_type = Some(bad);
            } else {
                e.group = Some(bad);
            }
            let message = check("effects[1]", e, 0).unwrap_err();
            assert!(
                message.starts_with(&format!("effects[1].{field} ")),
                "{message}"
            );
        }
        let mut bad_metadata = e.clone();
        bad_metadata.metadata = Some("[1]");
        assert!(check("effects[2]", bad_metadata, 0)
            .unwrap_err()
            .starts_with("effects[2].metadata must be a JSON object"));
        let cancel = check(
            "effects[0]",
            asked(Returned::Cancel { key: "reminder:1" }, None),
            0,
        )
        .unwrap();
        assert_eq!(cancel.cancels.as_deref(), Some("reminder:1"));
        assert_eq!(cancel.stored, json!({"cancel": {"key": "reminder:1"}}));
        assert_eq!(
            Target::from_json(&cancel.stored).unwrap(),
            Target::Cancel {
                key: "reminder:1".into()
            }
        );
        let empty = check("effects[4]", asked(Returned::Cancel { key: "" }, None), 0).unwrap_err();
        assert!(
            empty.starts_with("effects[4].cancel \"\" must be an effect key"),
            "{empty}"
        );
    }

    #[test]
    fn webhook_statuses_that_may_pass_later_are_retried() {
        for retried in [None, Some(408), Some(429), Some(500), Some(503), Some(599)] {
            assert!(webhook_retryable(retried), "{retried:?}");
        }
        for failed in [
            Some(301),
            Some(400),
            Some(401),
            Some(404),
            Some(409),
            Some(422),
        ] {
            assert!(!webhook_retryable(failed), "{failed:?}");
        }
    }

    #[test]
    fn the_error_line_names_the_effect() {
        let line = error_line(7, "order-totals", "ship-1", 3, "webhook responded 404");
        assert_eq!(
            line["message"],
            "effect \"ship-1\" of processor \"order-totals\" failed after 3 attempt(s): webhook responded 404"
        );
        assert_eq!(
            line["effect"],
            json!({"id": 7, "component": "order-totals", "key": "ship-1"})
        );
    }

    #[test]
    fn long_errors_are_capped_at_a_character_boundary() {
        let long = "é".repeat(ERROR_TEXT_BYTES_MAX);
        let capped = cap(&long);
        assert!(capped.len() <= ERROR_TEXT_BYTES_MAX);
        assert!(capped.ends_with("..."));
    }
}
