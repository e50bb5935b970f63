//! Several hosts: any host accepts any request. One for a stream that
//! another host owns is carried out by that host: `Host::apply` forwards
//! the typed request and reads back the typed answer, so HTTP knows nothing
//! of it. What this layer relays is what is not one answer but a body that
//! flows as long as it lasts: a live connection (`:connect`, server-sent
//! events) and a backfill's progress (`:backfillProcessor` as NDJSON).
//!
//! The stream's actor answers `503 stream-owned-elsewhere` with the owner's
//! URL in the [`OWNER`] header; this layer replays such a request there
//! with [`FORWARDED`] set. A forwarded request is never forwarded again
//! (the lease may be moving): its `503` reaches the client, whose retry
//! finds the new owner. With SQLite storage the layer does nothing.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use super::error::ApiError;
use crate::host::Host;

/// The owner's URL on a `stream-owned-elsewhere` answer.
pub const OWNER: HeaderName = HeaderName::from_static("streamhost-owner");
/// Set on a request one host forwards to another.
pub const FORWARDED: HeaderName = HeaderName::from_static("streamhost-forwarded");

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "host",
];

/// The middleware (see the module). Open mode's checks (`guard.rs`) run
/// first, for every request: one layer, not two, on every request's path.
pub async fn layer(State(host): State<Arc<Host>>, request: Request, next: Next) -> Response {
    if request
        .extensions()
        .get::<super::listener::Reserved>()
        .is_some()
        && super::authenticate(&host, request.headers()).is_err()
    {
        let reserved = host.config.http.reserved();
        let mut response = ApiError::unavailable(
            "connections-reserved",
            format!(
                "every connection open to anyone is taken; the last {reserved} are kept for \
                 requests with a valid token ([http] reserved-connections = {reserved})"
            ),
            1,
        )
        .into_response();
        // This connection holds a reserved place: it ends with this answer.
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            HeaderValue::from_static("close"),
        );
        return response;
    }
    if host.auth.is_open() {
        let (method, path, headers) = (request.method(), request.uri().path(), request.headers());
        let allowed = &host.config.http.allowed_hosts;
        if let Err(e) = super::guard::open_mode(method, path, headers, allowed) {
            return e.into_response();
        }
    }
    let Some(me) = host.streams.storage().cluster().cloned() else {
        return next.run(request).await;
    };
    // Only requests on a stream meet another owner (the host's own calls
    // on streams go through `actor/remote.rs`); the rest pass untouched,
    // bodies and their own limits included. A Durable Streams request
    // (`/ds/...`) is served whole by the stream's owner: its writes check
    // and append in one step there.
    let path = request.uri().path();
    let durable = path.starts_with("/ds/");
    if !durable
        && (!(path.starts_with("/v1/projects/") || path.starts_with("/v1/global/"))
            || !path.contains("/streams/"))
    {
        return next.run(request).await;
    }
    // The token is checked before the body is read, here as in the
    // handlers: an unauthorized caller never makes this host buffer a body.
    // A bad URL is the handler's to answer, before any body is read.
    let target = if durable {
        super::durable::address(request.uri()).map_err(|_| ())
    } else {
        super::parse_stream_url(path)
            .map(|t| t.address)
            .map_err(|_| ())
    };
    let Ok(address) = target else {
        return next.run(request).await;
    };
    // Everything else is one answer, which `Host::apply` gets from the
    // owner.
    let flows = durable
        || path.ends_with(":connect")
        || (path.ends_with(":backfillProcessor")
            && request
                .headers()
                .get(axum::http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("application/x-ndjson")));
    if !flows {
        return next.run(request).await;
    }
    let allowed = super::authenticate(&host, request.headers())
        .and_then(|caller| Ok(caller.may_use(&address.namespace)?));
    if let Err(e) = allowed {
        return e.into_response();
    }
    // A long-poll answers once data comes or its wait ends.
    let long_poll = durable
        && request
            .uri()
            .query()
            .is_some_and(|q| q.contains("live=long-poll"));
    // An owner this host learned lately: straight there, without asking
    // this host's own handler first (which would answer that owner).
    let known = host
        .streams
        .storage()
        .known_owner(address.namespace.storage_key(), &address.path);
    let (parts, body) = request.into_parts();
    // Kept to be sent again: bounded as every body is.
    let limit = host.config.max_body_bytes;
    let bytes = match super::read_body(&host, body, limit, "request body").await {
        Ok(b) => b,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let forwarded = parts.headers.contains_key(&FORWARDED);
    let owner = match known {
        Some(owner) if !forwarded && owner != me.url => owner,
        _ => {
            let mut response = next
                .run(Request::from_parts(
                    parts.clone(),
                    Body::from(bytes.clone()),
                ))
                .await;
            let Some(owner) = response.headers_mut().remove(&OWNER) else {
                return response;
            };
            let Ok(owner) = owner.to_str().map(str::to_string) else {
                return response;
            };
            if forwarded || owner.is_empty() || owner == me.url {
                return response;
            }
            owner
        }
    };
    let target = format!(
        "{}{}",
        owner.trim_end_matches('/'),
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut out = host
        .forwarder()
        .request(parts.method.clone(), &target)
        .header(&FORWARDED, HeaderValue::from_static("1"))
        .body(bytes);
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) && name != axum::http::header::CONTENT_LENGTH {
            out = out.header(name, value);
        }
    }
    // Until the owner's answer starts (its body then flows as long as it
    // lasts): a hung owner must not hold the request longer than it takes
    // its lease to expire, after which a retry finds a live owner.
    let mut wait = std::time::Duration::from_millis(me.lease_ms.max(1000) as u64);
    if long_poll {
        wait += std::time::Duration::from_millis(host.config.http.long_poll_ms);
    }
    let answered = tokio::time::timeout(wait, out.send())
        .await
        .map_err(|_| format!("no answer within {} ms", wait.as_millis()))
        .and_then(|r| r.map_err(|e| e.to_string()));
    // The owner moved on, or cannot serve now (any 503: owned elsewhere,
    // lease lost, ...): ask the database next time.
    let stale = match &answered {
        Ok(answer) => answer.status() == axum::http::StatusCode::SERVICE_UNAVAILABLE,
        Err(_) => true,
    };
    if stale {
        host.streams.storage().forget_owner(&owner);
    }
    match answered {
        Ok(answer) => {
            let mut back = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                if !HOP_BY_HOP.contains(&name.as_str()) {
                    back = back.header(name, value);
                }
            }
            back.body(Body::from_stream(answer.bytes_stream()))
                .unwrap_or_else(|e| {
                    ApiError::internal(format!("relaying the owner's answer failed: {e}"))
                        .into_response()
                })
        }
        Err(e) => {
            tracing::warn!(owner = %owner, error = %e, "forwarding to the stream's owner failed");
            ApiError::unavailable(
                "stream-owned-elsewhere",
                format!("the stream's owner at {owner} did not answer ({e}); retry: the stream moves to a live host once the owner's lease expires"),
                1,
            )
            .into_response()
        }
    }
}
