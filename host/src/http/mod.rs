//! The HTTP API: routing of `{stream}:method` URLs, auth, JSON
//! bodies and errors. Domain rules live in `stream`; this layer only parses,
//! authorizes and renders.

mod backfill;
pub mod backup;
mod components;
mod connections;
mod durable;
mod effects;
pub mod error;
mod forward;
mod guard;
mod ingest;
mod itx;
pub mod listener;
pub mod mapping;
mod query;
mod secrets;
mod serve;

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, MethodRouter};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;

use crate::auth::Caller;
use crate::error::{Error, ErrorKind};
use crate::host::request::{StreamAnswer, StreamRequest};
use crate::host::Host;
use crate::stream::{validate_project, Namespace, StreamAddress};
use error::ApiError;

/// One route of the router: its path, what serves it, and the operations
/// (method, documented path) it serves, which `/openapi.json` must describe.
struct Route {
    path: &'static str,
    handler: MethodRouter<Arc<Host>>,
    // Read by `operations`, which only the end-to-end tests call.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    operations: Vec<(&'static str, String)>,
}

fn route(
    path: &'static str,
    handler: MethodRouter<Arc<Host>>,
    ops: &[(&'static str, &str)],
) -> Route {
    Route {
        path,
        handler,
        operations: ops.iter().map(|(m, p)| (*m, p.to_string())).collect(),
    }
}

/// The documented operations of a stream route: every stream method.
fn stream_operations(prefix: &str) -> Vec<(&'static str, String)> {
    mapping::STREAM_METHODS
        .iter()
        .map(|(method, name)| (*method, format!("{prefix}/{{path}}:{name}")))
        .collect()
}

/// Every route of the API (the router is built from this table).
fn routes() -> Vec<Route> {
    use axum::routing::{post, put};
    const P: &str = "/v1/projects/{project}";
    let effect = format!("{P}/effects/{{id}}");
    vec![
        route("/healthz", get(healthz), &[("GET", "/healthz")]),
        route("/metrics", get(metrics), &[("GET", "/metrics")]),
        route("/openapi.json", get(openapi), &[("GET", "/openapi.json")]),
        route("/console", get(console), &[("GET", "/console")]),
        Route {
            path: "/v1/projects/{project}/streams/{*rest}",
            handler: any(stream_route),
            operations: stream_operations(&format!("{P}/streams")),
        },
        Route {
            path: "/v1/global/streams/{*rest}",
            handler: any(stream_route),
            operations: stream_operations("/v1/global/streams"),
        },
        route(
            "/v1/projects/{project}/streams",
            get(list_project_streams),
            &[("GET", &format!("{P}/streams"))],
        ),
        route(
            "/v1/global/streams",
            get(list_global_streams),
            &[("GET", "/v1/global/streams")],
        ),
        route(
            "/v1/projects/{project}/components",
            get(components::list),
            &[("GET", &format!("{P}/components"))],
        ),
        route(
            "/v1/projects/{project}/components/{name}",
            put(components::one).get(components::one),
            &[
                ("PUT", &format!("{P}/components/{{name}}")),
                ("GET", &format!("{P}/components/{{name}}")),
            ],
        ),
        route(
            "/v1/projects/{project}/components/{name}/versions",
            get(components::versions),
            &[("GET", &format!("{P}/components/{{name}}/versions"))],
        ),
        route(
            "/v1/projects/{project}/itx",
            post(itx::call),
            &[("POST", &format!("{P}/itx"))],
        ),
        route(
            "/v1/projects/{project}/effects",
            get(effects::list),
            &[("GET", &format!("{P}/effects"))],
        ),
        route(
            "/v1/projects/{project}/effects/{id}",
            any(effects::route),
            &[
                ("GET", &effect),
                ("POST", &format!("{effect}:retry")),
                ("POST", &format!("{effect}:cancel")),
            ],
        ),
        route(
            "/v1/projects/{project}/secrets/{name}",
            any(secrets::route),
            &[
                ("PUT", &format!("{P}/secrets/webhooks")),
                ("POST", &format!("{P}/secrets/webhooks:retirePrevious")),
            ],
        ),
        route(
            "/v1/projects/{project}/ingest",
            post(ingest::accept_root),
            &[("POST", &format!("{P}/ingest"))],
        ),
        route(
            "/v1/projects/{project}/ingest/{*rest}",
            any(ingest::path_route),
            &[
                ("POST", &format!("{P}/ingest/{{path}}")),
                ("GET", &format!("{P}/ingest/parked")),
                ("POST", &format!("{P}/ingest/parked/{{id}}:redrive")),
                ("POST", &format!("{P}/ingest/parked/{{id}}:discard")),
            ],
        ),
        route("/v1/ingest", get(ingest::status), &[("GET", "/v1/ingest")]),
        // The Durable Streams protocol over the project's streams.
        route(
            "/ds/{project}/{*rest}",
            any(durable::route),
            &[
                ("PUT", "/ds/{project}/{path}"),
                ("POST", "/ds/{project}/{path}"),
                ("GET", "/ds/{project}/{path}"),
                ("HEAD", "/ds/{project}/{path}"),
                ("DELETE", "/ds/{project}/{path}"),
            ],
        ),
        route("/v1/cluster", get(cluster), &[("GET", "/v1/cluster")]),
        route("/v1/backup", get(backup::backup), &[("GET", "/v1/backup")]),
        route(
            "/v1/ingest:register",
            post(ingest::register),
            &[("POST", "/v1/ingest:register")],
        ),
    ]
}

/// Every operation the router serves, as (method, documented path): the
/// paths and methods `/openapi.json` describes, no more and no fewer.
#[cfg(feature = "internals")]
pub fn operations() -> Vec<(&'static str, String)> {
    routes().into_iter().flat_map(|r| r.operations).collect()
}

/// Builds the router of the whole API.
pub fn router(host: Host) -> Router {
    // One reference count per request for the middleware and one for the
    // handler, not a clone of every part of the host.
    let host = Arc::new(host);
    routes()
        .into_iter()
        .fold(Router::new(), |router, r| router.route(r.path, r.handler))
        // The console's script and style (the page is `GET /console`).
        .route("/console/console.js", get(console_js))
        .route("/console/console.css", get(console_css))
        // Host to host (several hosts); not part of the public API.
        .route(
            crate::actor::remote::PATH,
            axum::routing::post(internal_call),
        )
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            host.clone(),
            forward::layer,
        ))
        .with_state(host)
}

/// The OpenAPI 3.1 document of this API (kept by hand in
/// `docs/openapi.json`; a test checks it against [`operations`]).
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// The web console: one page, its script and its style served by this
/// host (no external assets); it calls the API with the token the user
/// enters.
const CONSOLE: &str = include_str!("console.html");
const CONSOLE_JS: &str = include_str!("console.js");
const CONSOLE_CSS: &str = include_str!("console.css");

/// The console's content security policy: nothing inline, nothing from
/// elsewhere, never framed.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn console_file(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONSOLE_CSP),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// The console's page. Nested under a prefix in another application
/// ([`Host::router`]), its assets' paths carry the prefix (the script
/// finds the API the same way, from the page's path).
async fn console(axum::extract::OriginalUri(original): axum::extract::OriginalUri) -> Response {
    let prefix = original.path().strip_suffix("/console").unwrap_or("");
    let plain = prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b));
    if prefix.is_empty() || !plain {
        return console_file("text/html; charset=utf-8", CONSOLE);
    }
    let page = CONSOLE.replace("\"/console/", &format!("\"{prefix}/console/"));
    let mut response = console_file("text/html; charset=utf-8", "");
    *response.body_mut() = Body::from(page);
    response
}

async fn console_js() -> Response {
    console_file("text/javascript; charset=utf-8", CONSOLE_JS)
}

async fn console_css() -> Response {
    console_file("text/css; charset=utf-8", CONSOLE_CSS)
}

async fn openapi() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

fn ok_json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("serializing the answer failed: {e}")).into_response(),
    }
}

/// `200 {"status": "ok"}`, or `503 storage-unavailable` naming why this
/// host cannot write (it then acknowledges no write). `?detail=true` (a
/// token when tokens are configured) adds what needs an operator in the
/// projects the caller may use, first: `{"attention": "N halted, M failing", "halted": [...],
/// "failing": [...], "truncated", "status": "ok"}`.
async fn healthz(
    State(host): State<Arc<Host>>,
    headers: HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let detail = match query.as_deref().unwrap_or("") {
        "" | "detail=false" => false,
        "detail=true" => true,
        other => {
            return ApiError::invalid(format!(
                "unknown query {other:?}: GET /healthz takes only detail=true or detail=false"
            ))
            .into_response()
        }
    };
    if let Some(why) = host.unable_to_write() {
        return ApiError::unavailable(
            "storage-unavailable",
            format!("this host cannot write: {why}"),
            1,
        )
        .into_response();
    }
    if !detail {
        return ok_json(&json!({"status": "ok"}));
    }
    // It names streams: those of the projects the caller may use.
    let caller = match authenticate(&host, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    match host.needing_attention_of(&caller).await {
        Ok(a) => ok_json(&json!({
            "attention": if a.is_clear() {
                "none".to_string()
            } else {
                format!("{} halted, {} failing", a.halted.len(), a.failing.len())
            },
            "halted": a.halted,
            "failing": a.failing,
            "truncated": a.truncated,
            "status": "ok",
        })),
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn metrics(State(host): State<Arc<Host>>, headers: HeaderMap) -> Response {
    let caller = match authenticate(&host, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = caller.require_admin("GET /metrics") {
        return ApiError::from(e).into_response();
    }
    host.metrics
        .set_sqlite_memory(crate::storage::Storage::memory_used());
    let wasm = host.streams.wasm_runtime();
    let (components, bytes) = wasm.compiled_in_memory();
    host.metrics.set_compiled(components, bytes);
    host.metrics
        .set_guest_memory_max(wasm.largest_guest_memory());
    let (parked, served) = wasm.instances_made_ahead();
    host.metrics.set_made_ahead(parked, served);
    host.metrics.set_lags(host.streams.lags().await);
    host.metrics
        .set_ingest_blocked(host.ingest.blocked_streams());
    if host.streams.stored().max().is_some() {
        host.metrics
            .set_project_stored(&host.streams.stored().all());
    }
    // What only storage knows, read now (off the async workers).
    let storage = host.streams.storage().clone();
    let now_ms = host.streams.now_ms();
    let counts = tokio::task::spawn_blocking(move || {
        (
            storage.effect_counts(now_ms),
            storage.ingest_pending_by_project(),
            storage.ingest_parked_by_project(),
        )
    })
    .await;
    match counts {
        Ok((Ok(effects), Ok(ingest), Ok(parked))) => {
            host.metrics.set_effects(&effects);
            host.metrics.set_ingest_pending(&ingest);
            host.metrics.set_ingest_parked(&parked);
        }
        Ok((effects, ingest, parked)) => {
            let e = effects
                .err()
                .or(ingest.err())
                .or(parked.err().map(|e| e.context("parked")));
            tracing::warn!(error = ?e, "reading the outbox and ingest counts for /metrics failed");
        }
        Err(e) => tracing::warn!(error = %e, "reading the counts for /metrics failed"),
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        host.metrics.render(),
    )
        .into_response()
}

/// Checks that the request may use `project`; answers who it acts as.
fn authorize_project(host: &Host, headers: &HeaderMap, project: &str) -> Result<Caller, ApiError> {
    let caller = authenticate(host, headers)?;
    caller.may_use(&Namespace::project(project)?)?;
    Ok(caller)
}

/// A JSON answer or an error.
fn answer<T: Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(v) => ok_json(&v),
        Err(e) => e.into_response(),
    }
}

async fn list_project_streams(
    State(host): State<Arc<Host>>,
    axum::extract::Path(project): axum::extract::Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let namespace = Namespace::project(&project)?;
        list_streams(&host, &headers, &uri, namespace).await
    }
    .await;
    answer(result)
}

/// Largest body of a host-to-host call (a copy batch of large events).
const INTERNAL_BODY_BYTES_MAX: usize = 256 * 1024 * 1024;

/// `POST /internal/v1/call`: a call on a stream this host owns, sent by
/// another host of the cluster (`actor/remote.rs`); served here, never
/// forwarded again.
async fn internal_call(State(host): State<Arc<Host>>, headers: HeaderMap, body: Body) -> Response {
    use crate::actor::remote::{self, Call, RemoteCall};
    let result = async {
        let storage = host.streams.storage().clone();
        let me = storage
            .cluster()
            .ok_or_else(|| Error::not_found("not-found", "this host is not in a cluster"))?;
        let given = headers
            .get(remote::SECRET_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !remote::secret_matches(given, &me.secret) {
            return Err(Error::unauthorized(
                "a host-to-host call needs the cluster secret",
            ));
        }
        let bytes = read_body(&host, body, INTERNAL_BODY_BYTES_MAX, "host-to-host call").await?;
        let call: RemoteCall = parse_json(&bytes)?;
        let address = call.address()?;
        let answer = match call.call {
            Call::Append { input, authority } => {
                remote::to_value(host.streams.append_here(&address, input, authority).await)
            }
            Call::Deliver { batch } => {
                remote::to_value(host.streams.deliver_here(&address, batch).await)
            }
            Call::Request { request } => {
                let request: crate::host::request::StreamRequest = serde_json::from_value(request)
                    .map_err(|e| {
                        Error::invalid(format!("a forwarded request is unreadable: {e}"))
                    })?;
                remote::to_value(host.apply_here(&address, request).await)
            }
            Call::Retry { key, component } => {
                remote::to_value(host.streams.retry_here(&address, key, component).await)
            }
            Call::Refold {
                component,
                digest,
                timeout_ms,
            } => remote::to_value(
                crate::rollout::refold::refold_here(
                    &host.streams,
                    &address,
                    &component,
                    &digest,
                    timeout_ms,
                )
                .await
                .map_err(|f| {
                    if f.retryable {
                        Error::unavailable("refold-failed", f.message, 1)
                    } else {
                        Error::unprocessable("refold-failed", f.message)
                    }
                }),
            ),
        };
        // The lease moved on again: the caller retries (no second hop).
        answer.map_err(|mut e| {
            e.owner_url = None;
            e
        })
    }
    .await;
    // The answer's envelope carries the error's kind: the caller rebuilds
    // the error as the owner had it, with no HTTP status in between.
    ok_json(&remote::Answer::from(result))
}

/// `GET /v1/cluster`: this host and every host sharing its database.
async fn cluster(State(host): State<Arc<Host>>, headers: HeaderMap) -> Response {
    let result = async {
        authenticate(&host, &headers)?.require_admin("GET /v1/cluster")?;
        Ok(host
            .apply_cluster(crate::host::request::ClusterRequest::View)
            .await?)
    }
    .await;
    answer(result)
}

async fn list_global_streams(
    State(host): State<Arc<Host>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    answer(list_streams(&host, &headers, &uri, Namespace::Global).await)
}

async fn list_streams(
    host: &Host,
    headers: &HeaderMap,
    uri: &Uri,
    namespace: Namespace,
) -> Result<crate::host::streams::StreamsPage, ApiError> {
    let caller = authenticate(host, headers)?;
    caller.may_use(&namespace)?;
    let q = query::list_query(uri.query())?;
    Ok(host.list_streams(&namespace, q).await?)
}

async fn fallback(method: Method, uri: Uri) -> Response {
    ApiError::not_found("not-found", format!("no route for {method} {}", uri.path()))
        .into_response()
}

fn authenticate(host: &Host, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let header =
        match headers.get(header::AUTHORIZATION) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| {
                ApiError::unauthorized("the Authorization header is not valid text")
            })?),
        };
    Ok(host.auth.authenticate(header)?)
}

/// A parsed `{stream}:method` URL.
#[derive(Debug, PartialEq, Eq)]
struct StreamTarget {
    address: StreamAddress,
    method: String,
}

/// Splits `/v1/projects/{p}/streams{path}:{method}` (or the global form).
fn parse_stream_url(raw: &str) -> Result<StreamTarget, ApiError> {
    let (namespace, rest) = if let Some(rest) = raw.strip_prefix("/v1/projects/") {
        let (project, rest) = rest.split_once('/').unwrap_or((rest, ""));
        validate_project(project)?;
        let rest = rest.strip_prefix("streams").unwrap_or(rest);
        (Namespace::Project(project.to_string()), rest)
    } else if let Some(rest) = raw.strip_prefix("/v1/global/streams") {
        (Namespace::Global, rest)
    } else {
        return Err(ApiError::not_found(
            "not-found",
            format!("no route for {raw}"),
        ));
    };
    let Some((path, method)) = rest.rsplit_once(':') else {
        return Err(ApiError::invalid(format!(
            "{raw:?} names no method: append :append, :events, :state, :runtime or :reset to the stream path"
        )));
    };
    let path = if path.is_empty() { "/" } else { path };
    Ok(StreamTarget {
        address: StreamAddress::new(namespace, path)?,
        method: method.to_string(),
    })
}

async fn stream_route(
    State(host): State<Arc<Host>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match stream_call(&host, method, &uri, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn stream_call(
    host: &Host,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = authenticate(host, headers)?;
    let target = parse_stream_url(uri.path())?;
    caller.may_use(&target.address.namespace)?;
    let address = &target.address;
    let mut request = stream_request(host, &target.method, &method, uri.query(), body).await?;
    if let StreamRequest::Append(input) = &mut request {
        carry_trace(&mut input.events, headers);
    }
    if request.admin_only() {
        caller.require_admin(&format!("resetting stream {:?}", address.path))?;
    }
    if let Some(what) = request.configures() {
        caller.require_configure(&format!("{what} on stream {:?}", address.path))?;
    }
    // A backfill asked for as NDJSON streams its progress as it goes.
    let ndjson = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/x-ndjson"));
    match request {
        StreamRequest::BackfillProcessor(b) if ndjson => {
            Ok(backfill::streamed(host.clone(), address.clone(), b))
        }
        request => Ok(render(host.apply(address, request).await?)),
    }
}

/// The W3C trace context of a request's `traceparent` and `tracestate`
/// headers; a malformed one is ignored (`None`), never an error.
pub(crate) fn header_trace(headers: &HeaderMap) -> Option<crate::trace::Trace> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    crate::trace::Trace::parse(text("traceparent")?, text("tracestate"))
}

/// Gives every event without a trace context of its own the request's.
pub(crate) fn carry_trace(events: &mut [crate::stream::EventInput], headers: &HeaderMap) {
    if let Some(trace) = header_trace(headers) {
        for e in events.iter_mut().filter(|e| e.trace.is_none()) {
            e.trace = Some(trace.clone());
        }
    }
}

/// The `{stream}:method` call's typed request: its body read (bounded)
/// when it is a `POST`, then [`mapping::parse`].
async fn stream_request(
    host: &Host,
    name: &str,
    method: &Method,
    query: Option<&str>,
    body: Body,
) -> Result<StreamRequest, ApiError> {
    let body = if method == Method::POST {
        read_body(host, body, host.config.max_body_bytes, "request body").await?
    } else {
        axum::body::Bytes::new()
    };
    if body.len() <= PARSE_HERE_BYTES {
        return mapping::parse(name, method, query, &body);
    }
    // A large body is parsed on a blocking thread: the async worker goes on
    // serving everyone else's requests meanwhile.
    let (name, method, query) = (name.to_string(), method.clone(), query.map(str::to_string));
    tokio::task::spawn_blocking(move || mapping::parse(&name, &method, query.as_deref(), &body))
        .await
        .map_err(|e| ApiError::internal(format!("parsing the request body panicked: {e}")))?
}

/// Request bodies up to this size are parsed on the async worker; larger
/// ones on a blocking thread (a 7 MB body takes tens of milliseconds).
const PARSE_HERE_BYTES: usize = 256 * 1024;

/// A stream request's answer as HTTP: JSON, or server-sent events for a
/// live connection.
fn render(answer: StreamAnswer) -> Response {
    match answer {
        StreamAnswer::Live(live) => connections::sse(live),
        // The events' text as stored, copied rather than serialized again.
        StreamAnswer::Appended { output, warnings } => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            output.to_json(&warnings),
        )
            .into_response(),
        answer => ok_json(&answer),
    }
}

/// A request body of at most `limit` bytes, whole within `[http]
/// body-timeout-ms` (`408 timeout` after that: a client that trickles a body
/// holds no handler).
pub(crate) async fn read_body(
    host: &Host,
    body: Body,
    limit: usize,
    what: &str,
) -> Result<axum::body::Bytes, Error> {
    let timeout_ms = host.config.http.body_timeout_ms;
    let within = std::time::Duration::from_millis(timeout_ms);
    match tokio::time::timeout(within, to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(Error::too_large(format!(
            "the {what} is over the limit of {limit} bytes"
        ))),
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            "timeout",
            format!("the {what} did not arrive within {timeout_ms} ms ([http] body-timeout-ms)"),
        )),
    }
}

/// Parses a JSON body into `T`; errors name the offending field's path.
///
/// A body that parses is parsed once, untracked; only a body that fails is
/// parsed again with its path tracked (which costs an allocation per field
/// name), to name where it failed.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::invalid("request body is empty: send a JSON object"));
    }
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        // A syntax error is about the text (its line and column say where),
        // not about a field: the path there may be half-read (`events[0].?`).
        let syntax = !matches!(e.inner().classify(), serde_json::error::Category::Data);
        if path == "." || syntax {
            Error::invalid(format!("invalid JSON body: {}", e.inner()))
        } else {
            Error::invalid(format!("invalid JSON body at {path}: {}", e.inner()))
        }
    })?;
    de.end()
        .map_err(|e| Error::invalid(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::AppendInput;

    #[test]
    fn syntax_errors_give_line_and_column_and_no_half_read_path() {
        let e =
            parse_json::<serde_json::Value>(b"{\"events\": [{\"type\": \"x.y/a\",}]}").unwrap_err();
        assert_eq!(
            e.message,
            "invalid JSON body: trailing comma at line 1 column 30"
        );
        let e = parse_json::<serde_json::Value>(b"{\"a\": 1,\n}").unwrap_err();
        assert_eq!(
            e.message,
            "invalid JSON body: trailing comma at line 2 column 1"
        );
        // A data error still names its field.
        let e =
            parse_json::<crate::stream::AppendInput>(b"{\"events\": [{\"type\": 7}]}").unwrap_err();
        assert!(
            e.message
                .starts_with("invalid JSON body at events[0].type: "),
            "{}",
            e.message
        );
    }

    #[test]
    fn stream_urls() {
        let t = parse_stream_url("/v1/projects/acme/streams/orders/eu:append").unwrap();
        assert_eq!(t.address.path, "/orders/eu");
        assert_eq!(t.method, "append");
        let t = parse_stream_url("/v1/projects/acme/streams/:append").unwrap();
        assert_eq!(t.address.path, "/");
        let t = parse_stream_url("/v1/global/streams/a/./b/../c:events").unwrap();
        assert_eq!(
            (t.address.namespace, t.address.path.as_str()),
            (Namespace::Global, "/a/c")
        );
        let e = parse_stream_url("/v1/projects/acme/streams/a:b/c:append").unwrap_err();
        assert!(e.message.contains("a:b"), "{}", e.message);
        let e = parse_stream_url("/v1/projects/Acme/streams/a:append").unwrap_err();
        assert!(e.message.contains("Acme"), "{}", e.message);
        assert!(parse_stream_url("/v1/projects/acme/streams/a").is_err());
    }

    #[test]
    fn json_errors_name_the_field() {
        let e =
            parse_json::<AppendInput>(br#"{"events": [{"type": "a", "offset": -1}]}"#).unwrap_err();
        assert!(e.message.contains("events[0].offset"), "{}", e.message);
        let e = parse_json::<AppendInput>(br#"{"events": [], "bogus": 1}"#).unwrap_err();
        assert!(e.message.contains("bogus"), "{}", e.message);
        let e = parse_json::<AppendInput>(br#"{"events": [{"type": 5}]}"#).unwrap_err();
        assert!(e.message.contains("events[0].type"), "{}", e.message);
        assert!(parse_json::<AppendInput>(b"{").is_err());
        assert!(parse_json::<AppendInput>(b"").is_err());
    }
}
