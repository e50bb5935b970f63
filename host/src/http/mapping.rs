//! The one mapping between the typed requests
//! ([`crate::host::request`]) and HTTP: the `parse` functions read what a
//! client sent (the server's handlers), the `render` functions write what a
//! client sends (the command line). Stream method names, HTTP methods,
//! paths, query parameters and bodies are decided here and nowhere else;
//! unit tests hold the two directions to each other.

use axum::http::Method;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ApiError;
use super::{parse_json, query};
use crate::host::request::{
    ClusterRequest, ComponentRequest, EffectRequest, IngestRequest, ItxRequest, StreamRequest,
};
use crate::host::streams::StreamsQuery;
use crate::stream::{EventInput, Namespace, StreamAddress};

/// A stream request as HTTP carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpCall {
    /// `GET` or `POST`.
    pub method: Method,
    /// The stream method: what follows the stream path's `:`
    /// (`append`, `processors/counter/keys/a%2Fb`).
    pub name: String,
    /// The query string, without its `?` (empty: none).
    pub query: String,
    /// The JSON body of a `POST`.
    pub body: Option<Value>,
}

/// The body of `:unsubscribeFromEvents`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UnsubscribeInput {
    source_stream_path: String,
    subscription_key: String,
}

/// The body of `:setSubscriptionCursor` and
/// `:setSubscriptionCursorAndResume`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CursorInput {
    subscription_key: String,
    #[serde(deserialize_with = "crate::stream::bounded::offset")]
    after_offset: u64,
}

/// The body of `:redact`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RedactInput {
    #[serde(deserialize_with = "crate::stream::bounded::offset")]
    offset: u64,
    #[serde(default)]
    reason: String,
}

/// The body of `:configureRetention` (each bound checked by
/// `Retention::from_payload`, which names a bad value).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RetentionInput {
    max_age_ms: Option<u64>,
    max_events: Option<u64>,
}

/// The body of `:resumeSubscription`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct KeyInput {
    subscription_key: String,
}

/// The body of `:verifyProcessor` and `:discardShadow`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VerifyInput {
    component: String,
}

/// The one mapping from a `{stream}:method` call (its method name, HTTP
/// method, query and body) to the typed request; `405` for a known method
/// with another HTTP method, `404 method-not-found` for an unknown one.
pub fn parse(
    name: &str,
    method: &Method,
    query: Option<&str>,
    body: &[u8],
) -> Result<StreamRequest, ApiError> {
    use StreamRequest as R;
    Ok(match (name, method) {
        ("append", &Method::POST) => R::Append(parse_json(body)?),
        ("events", &Method::GET) => R::Events(query::read_query(query)?),
        ("state", &Method::GET) => {
            query::no_query(query)?;
            R::State
        }
        ("runtime", &Method::GET) => {
            query::no_query(query)?;
            R::Runtime
        }
        ("reset", &Method::POST) => R::Reset,
        ("connect", &Method::GET) => R::Connect(query::connect_query(query)?),
        ("waitForEvent", &Method::POST) => R::WaitForEvent(parse_json(body)?),
        (m, &Method::GET) if m.starts_with("processors/") => {
            return parse_processor_read(m, query);
        }
        (m, &Method::GET) if m.starts_with("events/") => {
            let segments: Vec<&str> = m.split('/').collect();
            let ["events", offset, "trace"] = segments[..] else {
                return Err(ApiError::not_found(
                    "not-found",
                    format!("no route for :{m} (events or events/{{offset}}/trace)"),
                ));
            };
            let offset = offset.parse::<u64>().map_err(|_| {
                ApiError::invalid(format!(
                    "offset {offset:?} in :events/{{offset}}/trace is not a whole number"
                ))
            })?;
            R::EventTrace {
                offset,
                export: query::export_query(query)?,
            }
        }
        ("backfillReactor", &Method::POST) => R::BackfillReactor(parse_json(body)?),
        ("promoteShadow", &Method::POST) => R::PromoteShadow(parse_json(body)?),
        ("discardShadow", &Method::POST) => {
            let input: VerifyInput = parse_json(body)?;
            R::DiscardShadow {
                component: input.component,
            }
        }
        ("backfillProcessor", &Method::POST) => R::BackfillProcessor(parse_json(body)?),
        ("verifyProcessor", &Method::POST) => {
            let input: VerifyInput = parse_json(body)?;
            R::VerifyProcessor {
                component: input.component,
            }
        }
        ("subscribeToEventsFrom", &Method::POST) => R::SubscribeToEventsFrom(parse_json(body)?),
        ("unsubscribeFromEvents", &Method::POST) => {
            let input: UnsubscribeInput = parse_json(body)?;
            R::UnsubscribeFromEvents {
                source_stream_path: input.source_stream_path,
                subscription_key: input.subscription_key,
            }
        }
        ("setSubscriptionCursor", &Method::POST) => {
            let input: CursorInput = parse_json(body)?;
            R::SetSubscriptionCursor {
                subscription_key: input.subscription_key,
                after_offset: input.after_offset,
            }
        }
        ("resumeSubscription", &Method::POST) => {
            let input: KeyInput = parse_json(body)?;
            R::ResumeSubscription {
                subscription_key: input.subscription_key,
            }
        }
        ("redact", &Method::POST) => {
            let input: RedactInput = parse_json(body)?;
            R::Redact {
                offset: input.offset,
                reason: input.reason,
            }
        }
        ("configureRetention", &Method::POST) => {
            let input: serde_json::Map<String, Value> = parse_json(body)?;
            match crate::stream::retention::Retention::from_payload("body", &input)? {
                Some(r) => R::ConfigureRetention {
                    max_age_ms: r.max_age_ms,
                    max_events: r.max_events,
                },
                None => R::ConfigureRetention {
                    max_age_ms: None,
                    max_events: None,
                },
            }
        }
        ("setSubscriptionCursorAndResume", &Method::POST) => {
            let input: CursorInput = parse_json(body)?;
            R::SetSubscriptionCursorAndResume {
                subscription_key: input.subscription_key,
                after_offset: input.after_offset,
            }
        }
        (name, _) if STREAM_METHODS.iter().any(|(_, m)| *m == name) => {
            return Err(ApiError::new(
                405,
                "method-not-allowed",
                format!("{method} is not allowed on :{name}"),
            ))
        }
        (other, _) => {
            return Err(ApiError::not_found(
                "method-not-found",
                unknown_method_message(other),
            ))
        }
    })
}

/// A `GET {stream}:processors/...` read, matched on its path segments: a
/// component may be named like any route word (`keys`, `at`, `shadow`), and
/// a key is everything after `keys/` (percent-decoded; a `/` in it arrives
/// encoded from our clients, or as is from others).
fn parse_processor_read(name: &str, query: Option<&str>) -> Result<StreamRequest, ApiError> {
    use StreamRequest as R;
    let segments: Vec<&str> = name.split('/').collect();
    let no_route = || {
        ApiError::not_found(
            "not-found",
            format!(
                "no route for :{name} (processors/{{component}}, processors/{{component}}/keys, \
                 processors/{{component}}/keys/{{key}}, processors/{{component}}/at/{{offset}} \
                 or processors/{{component}}/shadow)"
            ),
        )
    };
    let component = match segments.get(1) {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => return Err(no_route()),
    };
    Ok(match &segments[2..] {
        [] => R::Processor { component },
        ["keys"] => R::ProcessorKeys {
            component,
            query: query::keys_query(query)?,
        },
        ["keys", key @ ..] if key.iter().any(|s| !s.is_empty()) => {
            query::no_query(query)?;
            let key = key.join("/");
            let key = percent_encoding::percent_decode_str(&key)
                .decode_utf8()
                .map_err(|_| ApiError::invalid(format!("key {key:?} is not UTF-8 once decoded")))?
                .into_owned();
            R::ProcessorKey { component, key }
        }
        ["at", offset] => {
            let offset = offset.parse::<u64>().map_err(|_| {
                ApiError::invalid(format!(
                    "offset {offset:?} in :processors/{component}/at/{{offset}} is not a whole number"
                ))
            })?;
            R::ProcessorAt {
                component,
                offset,
                keys: query::at_query(query)?,
            }
        }
        ["shadow"] => {
            query::no_query(query)?;
            R::Shadow { component }
        }
        _ => return Err(no_route()),
    })
}

/// Characters a key keeps as they are in a URL path segment.
const KEY_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The HTTP call that [`parse`] reads back as `request`.
pub fn render(request: &StreamRequest) -> HttpCall {
    use StreamRequest as R;
    let (method, name, query, body): (Method, String, String, Option<Value>) = match request {
        R::Append(input) => (Method::POST, "append".into(), String::new(), json(input)),
        R::Events(q) => (Method::GET, "events".into(), query::render_read(q), None),
        R::State => (Method::GET, "state".into(), String::new(), None),
        R::Runtime => (Method::GET, "runtime".into(), String::new(), None),
        R::Reset => (Method::POST, "reset".into(), String::new(), None),
        R::Connect(c) => (
            Method::GET,
            "connect".into(),
            query::render_connect(c),
            None,
        ),
        R::WaitForEvent(w) => (Method::POST, "waitForEvent".into(), String::new(), json(w)),
        R::SubscribeToEventsFrom(from) => (
            Method::POST,
            "subscribeToEventsFrom".into(),
            String::new(),
            json(from),
        ),
        R::UnsubscribeFromEvents {
            source_stream_path,
            subscription_key,
        } => (
            Method::POST,
            "unsubscribeFromEvents".into(),
            String::new(),
            json(&UnsubscribeInput {
                source_stream_path: source_stream_path.clone(),
                subscription_key: subscription_key.clone(),
            }),
        ),
        R::SetSubscriptionCursor {
            subscription_key,
            after_offset,
        } => (
            Method::POST,
            "setSubscriptionCursor".into(),
            String::new(),
            json(&CursorInput {
                subscription_key: subscription_key.clone(),
                after_offset: *after_offset,
            }),
        ),
        R::ResumeSubscription { subscription_key } => (
            Method::POST,
            "resumeSubscription".into(),
            String::new(),
            json(&KeyInput {
                subscription_key: subscription_key.clone(),
            }),
        ),
        R::Redact { offset, reason } => (
            Method::POST,
            "redact".into(),
            String::new(),
            json(&RedactInput {
                offset: *offset,
                reason: reason.clone(),
            }),
        ),
        R::ConfigureRetention {
            max_age_ms,
            max_events,
        } => (
            Method::POST,
            "configureRetention".into(),
            String::new(),
            json(&RetentionInput {
                max_age_ms: *max_age_ms,
                max_events: *max_events,
            }),
        ),
        R::SetSubscriptionCursorAndResume {
            subscription_key,
            after_offset,
        } => (
            Method::POST,
            "setSubscriptionCursorAndResume".into(),
            String::new(),
            json(&CursorInput {
                subscription_key: subscription_key.clone(),
                after_offset: *after_offset,
            }),
        ),
        R::Processor { component } => (
            Method::GET,
            format!("processors/{component}"),
            String::new(),
            None,
        ),
        R::ProcessorKeys { component, query } => (
            Method::GET,
            format!("processors/{component}/keys"),
            query::render_keys(query),
            None,
        ),
        R::EventTrace { offset, export } => (
            Method::GET,
            format!("events/{offset}/trace"),
            if *export {
                "export=true".into()
            } else {
                String::new()
            },
            None,
        ),
        R::ProcessorAt {
            component,
            offset,
            keys,
        } => (
            Method::GET,
            format!("processors/{component}/at/{offset}"),
            keys.as_ref()
                .map(|k| format!("keys={}", utf8_percent_encode(k, KEY_SEGMENT)))
                .unwrap_or_default(),
            None,
        ),
        R::ProcessorKey { component, key } => (
            Method::GET,
            format!(
                "processors/{component}/keys/{}",
                utf8_percent_encode(key, KEY_SEGMENT)
            ),
            String::new(),
            None,
        ),
        R::VerifyProcessor { component } => (
            Method::POST,
            "verifyProcessor".into(),
            String::new(),
            json(&VerifyInput {
                component: component.clone(),
            }),
        ),
        R::BackfillProcessor(b) => (
            Method::POST,
            "backfillProcessor".into(),
            String::new(),
            json(b),
        ),
        R::BackfillReactor(b) => (
            Method::POST,
            "backfillReactor".into(),
            String::new(),
            json(b),
        ),
        R::Shadow { component } => (
            Method::GET,
            format!("processors/{component}/shadow"),
            String::new(),
            None,
        ),
        R::PromoteShadow(p) => (Method::POST, "promoteShadow".into(), String::new(), json(p)),
        R::DiscardShadow { component } => (
            Method::POST,
            "discardShadow".into(),
            String::new(),
            json(&VerifyInput {
                component: component.clone(),
            }),
        ),
    };
    HttpCall {
        method,
        name,
        query,
        body,
    }
}

/// A body as JSON (every body is plain data: serializing it does not fail).
fn json<T: Serialize>(body: &T) -> Option<Value> {
    serde_json::to_value(body).ok()
}

/// A request's HTTP call from the API's root.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiCall {
    /// The HTTP method.
    pub method: Method,
    /// The path, from `/v1` (percent-encoded where it names a stream).
    pub path: String,
    /// The query string, without its `?` (empty: none).
    pub query: String,
    /// The body.
    pub body: ApiBody,
    /// The answer's media type when it is not JSON.
    pub accept: Option<&'static str>,
}

/// A request's body.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiBody {
    /// None.
    Empty,
    /// JSON.
    Json(Value),
    /// Bytes (a component).
    Bytes(Vec<u8>),
}

/// The media type of a component's bytes.
pub const WASM: &str = "application/wasm";

fn call(method: Method, path: String, query: String, body: ApiBody) -> ApiCall {
    ApiCall {
        method,
        path,
        query,
        body,
        accept: None,
    }
}

/// The HTTP call of a component request in `project`.
pub fn render_component(project: &str, request: &ComponentRequest) -> ApiCall {
    use ComponentRequest as R;
    let base = format!("/v1/projects/{project}/components");
    match request {
        R::Deploy { name, bytes, mode } => call(
            Method::PUT,
            format!("{base}/{name}"),
            mode.query().to_string(),
            ApiBody::Bytes(bytes.clone()),
        ),
        R::List => call(Method::GET, base, String::new(), ApiBody::Empty),
        R::Get { name } => call(
            Method::GET,
            format!("{base}/{name}"),
            String::new(),
            ApiBody::Empty,
        ),
        R::Bytes { name } => ApiCall {
            accept: Some(WASM),
            ..call(
                Method::GET,
                format!("{base}/{name}"),
                String::new(),
                ApiBody::Empty,
            )
        },
        R::Versions { name } => call(
            Method::GET,
            format!("{base}/{name}/versions"),
            String::new(),
            ApiBody::Empty,
        ),
    }
}

/// The component request of `PUT`/`GET .../components[/{name}[/versions]]`
/// (`accept`: the request's `accept` header).
pub fn parse_component(
    method: &Method,
    name: Option<&str>,
    versions: bool,
    query: Option<&str>,
    accept: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<ComponentRequest, ApiError> {
    use ComponentRequest as R;
    let named = |n: Option<&str>| n.map(str::to_string);
    Ok(match (method, named(name), versions) {
        (&Method::GET, None, _) => R::List,
        (&Method::GET, Some(name), true) => R::Versions { name },
        (&Method::GET, Some(name), false) if accept.is_some_and(|a| a.contains(WASM)) => {
            R::Bytes { name }
        }
        (&Method::GET, Some(name), false) => R::Get { name },
        (&Method::PUT, Some(name), false) => R::Deploy {
            name,
            bytes: body.unwrap_or_default(),
            mode: query::deploy_query(query)?,
        },
        _ => {
            return Err(ApiError::new(
                405,
                "method-not-allowed",
                format!("{method} is not allowed on components"),
            ))
        }
    })
}

/// The HTTP call of an effect request in `project`.
pub fn render_effect(project: &str, request: &EffectRequest) -> ApiCall {
    use EffectRequest as R;
    let base = format!("/v1/projects/{project}/effects");
    match request {
        R::List(filter) => call(
            Method::GET,
            base,
            query::render_effects(filter),
            ApiBody::Empty,
        ),
        R::Get { id } => call(
            Method::GET,
            format!("{base}/{id}"),
            String::new(),
            ApiBody::Empty,
        ),
        R::Retry { id } => call(
            Method::POST,
            format!("{base}/{id}:retry"),
            String::new(),
            ApiBody::Empty,
        ),
        R::Cancel { id } => call(
            Method::POST,
            format!("{base}/{id}:cancel"),
            String::new(),
            ApiBody::Empty,
        ),
    }
}

/// The effect request of `GET .../effects` (`id`: `None`) or
/// `GET .../effects/{id}`, `POST .../effects/{id}:retry|cancel`.
pub fn parse_effect(
    method: &Method,
    id: Option<&str>,
    query: Option<&str>,
) -> Result<EffectRequest, ApiError> {
    use EffectRequest as R;
    let parse_id = |raw: &str| {
        raw.parse::<i64>().ok().filter(|id| *id > 0).ok_or_else(|| {
            ApiError::invalid(format!("effect id {raw:?} is not a positive integer"))
        })
    };
    let Some(id) = id else {
        return Ok(R::List(query::effect_query(query)?));
    };
    Ok(match (id.split_once(':'), method) {
        (None, &Method::GET) => R::Get { id: parse_id(id)? },
        (Some((id, "retry")), &Method::POST) => R::Retry { id: parse_id(id)? },
        (Some((id, "cancel")), &Method::POST) => R::Cancel { id: parse_id(id)? },
        (Some((id, other)), &Method::POST) => {
            parse_id(id)?;
            return Err(ApiError::not_found(
                "method-not-found",
                format!("unknown effect method {other:?}: use :retry or :cancel"),
            ));
        }
        _ => {
            return Err(ApiError::new(
                405,
                "method-not-allowed",
                format!("{method} is not allowed here: GET an effect, POST its :retry or :cancel"),
            ))
        }
    })
}

/// The HTTP call of an ITX call in `project`.
pub fn render_itx(project: &str, request: &ItxRequest) -> ApiCall {
    call(
        Method::POST,
        format!("/v1/projects/{project}/itx"),
        String::new(),
        ApiBody::Json(json(request).unwrap_or_default()),
    )
}

/// The ITX call of `POST .../itx`.
pub fn parse_itx(body: &[u8]) -> Result<ItxRequest, ApiError> {
    Ok(parse_json(body)?)
}

/// The body of an ingest request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IngestInput {
    events: Vec<EventInput>,
}

/// The HTTP call of an ingest request.
pub fn render_ingest(request: &IngestRequest) -> ApiCall {
    match request {
        IngestRequest::Accept { stream, events } => {
            let project = stream.namespace.project_id().unwrap_or_default();
            let path = if stream.path == "/" {
                ""
            } else {
                stream.path.as_str()
            };
            let path = path
                .split('/')
                .map(|s| utf8_percent_encode(s, KEY_SEGMENT).to_string())
                .collect::<Vec<_>>()
                .join("/");
            call(
                Method::POST,
                format!("/v1/projects/{project}/ingest{path}"),
                String::new(),
                ApiBody::Json(
                    json(&IngestInput {
                        events: events.clone(),
                    })
                    .unwrap_or_default(),
                ),
            )
        }
        IngestRequest::Status => call(
            Method::GET,
            "/v1/ingest".into(),
            String::new(),
            ApiBody::Empty,
        ),
        IngestRequest::Register => call(
            Method::POST,
            "/v1/ingest:register".into(),
            String::new(),
            ApiBody::Empty,
        ),
        IngestRequest::Parked { project, query } => call(
            Method::GET,
            format!("/v1/projects/{project}/ingest/parked"),
            query::render_parked(query),
            ApiBody::Empty,
        ),
        IngestRequest::Redrive { project, id } => call(
            Method::POST,
            format!("/v1/projects/{project}/ingest/parked/{id}:redrive"),
            String::new(),
            ApiBody::Empty,
        ),
        IngestRequest::Discard { project, id } => call(
            Method::POST,
            format!("/v1/projects/{project}/ingest/parked/{id}:discard"),
            String::new(),
            ApiBody::Empty,
        ),
    }
}

/// The parked-event request of `rest` under `/v1/projects/{project}/ingest/`
/// (`parked`, `parked/{id}:redrive`, `parked/{id}:discard`), or `None`:
/// `rest` is a stream path to accept events for (a path has no `:`).
pub fn parse_parked(
    project: &str,
    method: &Method,
    rest: &str,
    query: Option<&str>,
) -> Option<Result<IngestRequest, ApiError>> {
    let segments: Vec<&str> = rest.split('/').collect();
    let project = project.to_string();
    let parse_id = |raw: &str| {
        raw.parse::<i64>().ok().filter(|id| *id > 0).ok_or_else(|| {
            ApiError::invalid(format!("parked event id {raw:?} is not a positive integer"))
        })
    };
    Some(match (segments.as_slice(), method) {
        (["parked"], &Method::GET) => {
            query::parked_query(query).map(|query| IngestRequest::Parked { project, query })
        }
        (["parked", one], &Method::POST) if one.contains(':') => {
            let (id, verb) = one.split_once(':').unwrap_or((one, ""));
            match verb {
                "redrive" => parse_id(id).map(|id| IngestRequest::Redrive { project, id }),
                "discard" => parse_id(id).map(|id| IngestRequest::Discard { project, id }),
                other => Err(ApiError::not_found(
                    "method-not-found",
                    format!("unknown parked event method {other:?}: use :redrive or :discard"),
                )),
            }
        }
        // POST: events for a stream named `parked`.
        (["parked"], m) if m != Method::POST => Err(ApiError::new(
            405,
            "method-not-allowed",
            format!("{method} is not allowed here: GET the parked events"),
        )),
        (["parked", one], _) if one.contains(':') => Err(ApiError::new(
            405,
            "method-not-allowed",
            format!("{method} is not allowed here: POST a parked event's :redrive or :discard"),
        )),
        _ => return None,
    })
}

/// The ingest request of `POST /v1/projects/{project}/ingest{path}`.
pub fn parse_ingest(project: &str, path: &str, body: &[u8]) -> Result<IngestRequest, ApiError> {
    let stream = StreamAddress::new(Namespace::project(project)?, path)?;
    let input: IngestInput = parse_json(body)?;
    Ok(IngestRequest::Accept {
        stream,
        events: input.events,
    })
}

/// The HTTP call of a cluster request.
pub fn render_cluster(request: &ClusterRequest) -> ApiCall {
    match request {
        ClusterRequest::View => call(
            Method::GET,
            "/v1/cluster".into(),
            String::new(),
            ApiBody::Empty,
        ),
    }
}

/// The HTTP call of `request` on stream `path` of `namespace`.
pub fn render_stream(namespace: &Namespace, path: &str, request: &StreamRequest) -> ApiCall {
    let HttpCall {
        method,
        name,
        query,
        body,
    } = render(request);
    let path = if path == "/" { "" } else { path };
    call(
        method,
        format!("{}{path}:{name}", streams_path(namespace)),
        query,
        body.map_or(ApiBody::Empty, ApiBody::Json),
    )
}

/// `/v1/projects/{p}/streams` or `/v1/global/streams`.
fn streams_path(namespace: &Namespace) -> String {
    match namespace.project_id() {
        Some(p) => format!("/v1/projects/{p}/streams"),
        None => "/v1/global/streams".into(),
    }
}

/// The HTTP call of listing `namespace`'s streams.
pub fn render_list(namespace: &Namespace, query: &StreamsQuery) -> ApiCall {
    call(
        Method::GET,
        streams_path(namespace),
        query::render_list(query),
        ApiBody::Empty,
    )
}

/// Every stream method with its HTTP method.
pub const STREAM_METHODS: &[(&str, &str)] = &[
    ("POST", "append"),
    ("GET", "events"),
    ("GET", "state"),
    ("GET", "runtime"),
    ("GET", "connect"),
    ("POST", "waitForEvent"),
    ("POST", "reset"),
    ("POST", "subscribeToEventsFrom"),
    ("POST", "unsubscribeFromEvents"),
    ("POST", "setSubscriptionCursor"),
    ("POST", "resumeSubscription"),
    ("POST", "setSubscriptionCursorAndResume"),
    ("POST", "redact"),
    ("POST", "configureRetention"),
    ("GET", "processors/{component}"),
    ("GET", "processors/{component}/keys"),
    ("GET", "processors/{component}/keys/{key}"),
    ("GET", "processors/{component}/at/{offset}"),
    ("GET", "events/{offset}/trace"),
    ("GET", "processors/{component}/shadow"),
    ("POST", "promoteShadow"),
    ("POST", "discardShadow"),
    ("POST", "verifyProcessor"),
    ("POST", "backfillProcessor"),
    ("POST", "backfillReactor"),
];

/// "unknown stream method", the closest method when one is close, and the
/// whole list.
fn unknown_method_message(method: &str) -> String {
    let closest = STREAM_METHODS
        .iter()
        .map(|(_, m)| {
            (
                strsim::levenshtein(&method.to_lowercase(), &m.to_lowercase()),
                m,
            )
        })
        .min_by_key(|(d, _)| *d)
        .filter(|(d, m)| *d <= 2.max(m.len() / 4));
    let hint = match closest {
        Some((_, m)) => format!(" (did you mean :{m}?)"),
        None => String::new(),
    };
    let all: Vec<String> = STREAM_METHODS
        .iter()
        .map(|(_, m)| format!(":{m}"))
        .collect();
    format!(
        "unknown stream method {:?}{hint}; stream methods: {}",
        format!(":{method}"),
        all.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_render_writes_parse_reads_back_as_the_same_request() {
        let requests = crate::host::request::every_request();
        for request in &requests {
            let call = render(request);
            let body = call
                .body
                .as_ref()
                .map(|b| serde_json::to_vec(b).unwrap())
                .unwrap_or_default();
            let query = (!call.query.is_empty()).then_some(call.query.as_str());
            let back = parse(&call.name, &call.method, query, &body)
                .unwrap_or_else(|e| panic!("{call:?} does not parse: {e:?}"));
            assert_eq!(&back, request, "{call:?}");
        }
        // Every stream method is written by some request.
        for (method, name) in STREAM_METHODS {
            assert!(
                requests
                    .iter()
                    .map(render)
                    .any(|c| c.method.as_str() == *method
                        && (c.name == *name
                            || name.contains('{')
                                && c.name.split('/').count() == name.split('/').count()
                                && c.name.starts_with("processors/"))),
                "no request renders {method} :{name}"
            );
        }
    }

    /// Round trips and totality over generated names (proptest).
    mod generated {
        use super::*;
        use proptest::prelude::*;

        /// A component name, route words among them.
        fn component_name() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(vec![
                    "shadow",
                    "keys",
                    "at",
                    "versions",
                    "processors",
                    "append",
                    "state",
                    "0",
                    "7",
                ])
                .prop_map(String::from),
                "[a-z0-9][a-z0-9-]{0,62}",
            ]
        }

        /// A processor key: route words, slashes, escapes, any text.
        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(vec![
                    "keys", "at/3", "shadow", "/", "a/keys/b", "%2F", "%zz"
                ])
                .prop_map(String::from),
                // Any text but NUL, which queries refuse by design.
                "[^\\x00]{1,24}",
            ]
        }

        proptest! {
            #[test]
            fn every_request_round_trips_over_any_component_name_and_key(
                name in component_name(),
                key in key(),
            ) {
                for request in crate::host::request::every_request_named(&name, &key) {
                    let call = render(&request);
                    let body = call.body.as_ref().map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default();
                    let query = (!call.query.is_empty()).then_some(call.query.as_str());
                    let back = parse(&call.name, &call.method, query, &body);
                    prop_assert_eq!(back.as_ref().ok(), Some(&request), "{:?} gave {:?}", call, back);
                }
            }

            #[test]
            fn no_stream_method_name_panics_the_parser(
                name in prop_oneof![
                    "processors(/[a-z%0-9]{0,6}|/keys|/at|/shadow|/){0,5}",
                    "[a-zA-Z/%:.]{0,30}",
                    ".{0,40}",
                ],
                post in any::<bool>(),
                query in prop::option::of("[a-z=&%]{0,20}"),
            ) {
                let method = if post { Method::POST } else { Method::GET };
                let _ = parse(&name, &method, query.as_deref(), b"{}");
            }
        }
    }

    #[test]
    fn a_component_named_like_a_route_word_is_that_component() {
        for name in ["shadow", "keys", "at", "versions"] {
            let r = parse(&format!("processors/{name}"), &Method::GET, None, b"").unwrap();
            assert_eq!(
                r,
                StreamRequest::Processor {
                    component: name.into()
                }
            );
            let r = parse(
                &format!("processors/{name}/shadow"),
                &Method::GET,
                None,
                b"",
            )
            .unwrap();
            assert_eq!(
                r,
                StreamRequest::Shadow {
                    component: name.into()
                }
            );
        }
        for bad in [
            "processors/",
            "processors//keys",
            "processors/c/keys/",
            "processors/c/at",
            "processors/c/x",
        ] {
            let e = parse(bad, &Method::GET, None, b"").unwrap_err();
            assert_eq!((e.status, e.code), (404, "not-found"), "{bad}");
            assert!(e.message.contains(bad), "{bad}: {}", e.message);
        }
    }

    /// The JSON or bytes of a body, as sent.
    fn sent(body: &ApiBody) -> Vec<u8> {
        match body {
            ApiBody::Empty => Vec::new(),
            ApiBody::Json(v) => serde_json::to_vec(v).unwrap(),
            ApiBody::Bytes(b) => b.clone(),
        }
    }

    fn query_of(call: &ApiCall) -> Option<&str> {
        (!call.query.is_empty()).then_some(call.query.as_str())
    }

    #[test]
    fn every_family_reads_back_what_it_renders() {
        use crate::host::effects::{EffectFilter, EffectStatus};
        use ComponentRequest as C;
        use EffectRequest as E;

        for request in [
            C::Deploy {
                name: "counter".into(),
                bytes: b"\0asm".to_vec(),
                mode: crate::component::DeployMode::Refold {
                    replay_effects: false,
                },
            },
            C::Deploy {
                name: "counter".into(),
                bytes: b"\0asm".to_vec(),
                mode: crate::component::DeployMode::Shadow,
            },
            C::Deploy {
                name: "counter".into(),
                bytes: b"\0asm".to_vec(),
                mode: crate::component::DeployMode::Refold {
                    replay_effects: true,
                },
            },
            C::Deploy {
                name: "counter".into(),
                bytes: Vec::new(),
                mode: crate::component::DeployMode::Continue,
            },
            C::List,
            C::Get {
                name: "counter".into(),
            },
            C::Bytes {
                name: "counter".into(),
            },
            C::Versions {
                name: "counter".into(),
            },
        ] {
            let call = render_component("acme", &request);
            let rest = call
                .path
                .strip_prefix("/v1/projects/acme/components")
                .unwrap();
            let (name, versions) = match rest.strip_prefix('/') {
                None => (None, false),
                Some(r) => match r.strip_suffix("/versions") {
                    Some(n) => (Some(n), true),
                    None => (Some(r), false),
                },
            };
            let body = (call.method == Method::PUT).then(|| sent(&call.body));
            let back = parse_component(
                &call.method,
                name,
                versions,
                query_of(&call),
                call.accept,
                body,
            )
            .unwrap();
            assert_eq!(back, request, "{call:?}");
        }

        for request in [
            E::List(EffectFilter::new()),
            E::List(
                EffectFilter::new()
                    .stream("/jobs/a-b")
                    .component("effector")
                    .status(EffectStatus::Failed)
                    .after_id(41)
                    .limit(7),
            ),
            E::Get { id: 3 },
            E::Retry { id: 3 },
            E::Cancel { id: 3 },
        ] {
            let call = render_effect("acme", &request);
            let rest = call.path.strip_prefix("/v1/projects/acme/effects").unwrap();
            let id = rest.strip_prefix('/');
            let back = parse_effect(&call.method, id, query_of(&call)).unwrap();
            assert_eq!(back, request, "{call:?}");
        }

        let itx = ItxRequest {
            expression: serde_json::json!(["components", ["get", "kinds"], "add"]),
            args: vec![serde_json::json!(2), serde_json::json!(3)],
        };
        let call = render_itx("acme", &itx);
        assert_eq!(
            (call.method.as_str(), call.path.as_str()),
            ("POST", "/v1/projects/acme/itx")
        );
        assert_eq!(parse_itx(&sent(&call.body)).unwrap(), itx);

        for path in ["/", "/orders/eu", "/a.b/c~d_e"] {
            let stream = StreamAddress::new(Namespace::project("acme").unwrap(), path).unwrap();
            let request = IngestRequest::Accept {
                stream: stream.clone(),
                events: vec![EventInput::new("events.example/x").idempotency_key("k")],
            };
            let call = render_ingest(&request);
            let rest = call.path.strip_prefix("/v1/projects/acme/ingest").unwrap();
            let decoded = percent_encoding::percent_decode_str(rest)
                .decode_utf8()
                .unwrap();
            let decoded = if decoded.is_empty() {
                "/".into()
            } else {
                decoded
            };
            let back = parse_ingest("acme", &decoded, &sent(&call.body)).unwrap();
            assert_eq!(back, request, "{call:?}");
        }
        for request in [
            IngestRequest::Parked {
                project: "acme".into(),
                query: crate::ingest::ParkedQuery::default(),
            },
            IngestRequest::Parked {
                project: "acme".into(),
                query: crate::ingest::ParkedQuery {
                    path: Some("/orders/eu".into()),
                    after_id: 41,
                    limit: 7,
                },
            },
            IngestRequest::Redrive {
                project: "acme".into(),
                id: 3,
            },
            IngestRequest::Discard {
                project: "acme".into(),
                id: 4,
            },
        ] {
            let call = render_ingest(&request);
            let rest = call.path.strip_prefix("/v1/projects/acme/ingest/").unwrap();
            let back = parse_parked("acme", &call.method, rest, query_of(&call)).unwrap();
            assert_eq!(back.unwrap(), request, "{call:?}");
        }
        // A stream path is not a parked-event route, `parked` included.
        for rest in ["orders", "parked/3", "a/parked"] {
            assert!(
                parse_parked("acme", &Method::POST, rest, None).is_none(),
                "{rest}"
            );
        }
        assert!(parse_parked("acme", &Method::POST, "parked", None).is_none());
        assert_eq!(render_ingest(&IngestRequest::Status).path, "/v1/ingest");
        assert_eq!(
            render_ingest(&IngestRequest::Register).path,
            "/v1/ingest:register"
        );
        assert_eq!(render_cluster(&ClusterRequest::View).path, "/v1/cluster");
    }

    #[test]
    fn a_known_method_with_another_http_method_is_405_and_an_unknown_one_404() {
        let e = parse("append", &Method::GET, None, b"").unwrap_err();
        assert_eq!((e.status, e.code), (405, "method-not-allowed"));
        let e = parse("state", &Method::POST, None, b"").unwrap_err();
        assert_eq!((e.status, e.code), (405, "method-not-allowed"));
        let e = parse("apend", &Method::POST, None, b"{}").unwrap_err();
        assert_eq!((e.status, e.code), (404, "method-not-found"));
        assert!(e.message.contains(":append"), "{}", e.message);
    }

    #[test]
    fn an_unknown_method_names_the_closest_and_lists_all() {
        let m = unknown_method_message("apend");
        assert!(
            m.starts_with("unknown stream method \":apend\" (did you mean :append?)"),
            "{m}"
        );
        assert!(m.contains(":waitForEvent") && m.contains(":connect"), "{m}");
        let m = unknown_method_message("waitforevent");
        assert!(m.contains("did you mean :waitForEvent?"), "{m}");
        let m = unknown_method_message("frobnicate");
        assert!(!m.contains("did you mean"), "{m}");
    }
}
