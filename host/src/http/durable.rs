//! `/ds/{project}{path}`: the Durable Streams protocol 1.0 over ordinary
//! streams. This layer parses the protocol's headers and query, calls the
//! host's typed operations ([`crate::host::durable`]) and renders their
//! answers as the protocol's statuses and headers; the rules are the
//! core's (`stream::durable`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{json, Value};

use super::error::ApiError;
use crate::host::durable::{
    next_arrival, Appended, DurableAppend, DurableCreate, DurablePage, ForkRequest, News,
};
use crate::host::Host;
use crate::stream::durable::{self, ProducerRefusal, ProducerStamp, ReadFrom};
use crate::stream::{Namespace, StreamAddress};

/// How long an SSE response lasts before the server ends it (the client
/// reconnects from the last control event's offset).
const SSE_LIFETIME: Duration = Duration::from_secs(60);

const NEXT_OFFSET: &str = "stream-next-offset";
const UP_TO_DATE: &str = "stream-up-to-date";
const CLOSED: &str = "stream-closed";
const CURSOR: &str = "stream-cursor";
const PRODUCER_EPOCH: &str = "producer-epoch";
const PRODUCER_SEQ: &str = "producer-seq";

const ALLOW_HEADERS: &str = "content-type, authorization, if-none-match, stream-seq, stream-ttl, \
     stream-expires-at, stream-closed, producer-id, producer-epoch, producer-seq, traceparent, tracestate";
const EXPOSE_HEADERS: &str =
    "stream-next-offset, stream-cursor, stream-up-to-date, stream-closed, \
     stream-ttl, stream-expires-at, producer-epoch, producer-seq, producer-expected-seq, \
     producer-received-seq, stream-sse-data-encoding, etag, location, content-type, retry-after";

/// Serves every method of `/ds/{project}{path}`.
pub async fn route(
    State(host): State<Arc<Host>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut response = if method == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else {
        match serve(&host, &method, &uri, &headers, body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        }
    };
    let h = response.headers_mut();
    let set = |h: &mut HeaderMap, name: &'static str, value: &'static str| {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    };
    set(h, "access-control-allow-origin", "*");
    set(
        h,
        "access-control-allow-methods",
        "GET, POST, PUT, DELETE, HEAD, OPTIONS",
    );
    set(h, "access-control-allow-headers", ALLOW_HEADERS);
    set(h, "access-control-expose-headers", EXPOSE_HEADERS);
    set(h, "x-content-type-options", "nosniff");
    set(h, "cross-origin-resource-policy", "cross-origin");
    response
}

/// The stream a `/ds/` URL names.
pub(super) fn address(uri: &Uri) -> Result<StreamAddress, ApiError> {
    let rest = uri.path().strip_prefix("/ds/").unwrap_or("");
    let (project, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| ApiError::invalid(format!("the path {path:?} is not UTF-8")))?;
    Ok(StreamAddress::new(
        Namespace::project(project)?,
        &format!("/{path}"),
    )?)
}

async fn serve(
    host: &Host,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = super::authenticate(host, headers)?;
    let stream = address(uri)?;
    caller.may_use(&stream.namespace)?;
    match *method {
        Method::PUT => {
            caller.require_configure(&format!("creating stream {:?}", stream.path))?;
            create(host, &stream, uri, headers, body).await
        }
        Method::POST => append(host, &stream, headers, body).await,
        Method::HEAD => head(host, &stream).await,
        Method::GET => read(host, &stream, uri, headers).await,
        Method::DELETE => {
            caller.require_configure(&format!("deleting stream {:?}", stream.path))?;
            host.durable_delete(&stream).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        _ => Err(ApiError::new(
            405,
            "method-not-allowed",
            format!("{method} is not a Durable Streams method: use PUT, POST, GET, HEAD or DELETE"),
        )),
    }
}

/// A header's text, if present; not text is `400` naming it.
fn text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::invalid(format!("the {name} header is not valid text"))),
    }
}

fn flag(headers: &HeaderMap, name: &str) -> Result<bool, ApiError> {
    Ok(text(headers, name)?.is_some_and(|v| v.eq_ignore_ascii_case("true")))
}

/// A body read whole, at most `max-body-bytes`. One over the limit is
/// still read to its end (up to [`DRAIN_FACTOR`] times the limit) before
/// the `413`, so that a client still sending it reads the answer instead
/// of a reset connection; within `[http] body-timeout-ms` either way.
async fn body_bytes(host: &Host, body: Body) -> Result<Bytes, ApiError> {
    use futures_util::StreamExt as _;
    let limit = host.config.max_body_bytes;
    let timeout_ms = host.config.http.body_timeout_ms;
    let read = async {
        let mut frames = body.into_data_stream();
        let mut kept = Vec::new();
        let mut total = 0usize;
        while let Some(frame) = frames.next().await {
            let frame =
                frame.map_err(|e| ApiError::invalid(format!("the request body broke off: {e}")))?;
            total = total.saturating_add(frame.len());
            if total <= limit {
                kept.extend_from_slice(&frame);
            } else if total > limit.saturating_mul(DRAIN_FACTOR) {
                break;
            }
        }
        Ok::<_, ApiError>((kept, total))
    };
    match tokio::time::timeout(Duration::from_millis(timeout_ms), read).await {
        Ok(Ok((kept, total))) if total <= limit => Ok(Bytes::from(kept)),
        Ok(Ok(_)) => Err(crate::error::Error::too_large(format!(
            "the request body is over the limit of {limit} bytes"
        ))
        .into()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(crate::error::Error::new(
            crate::error::ErrorKind::Timeout,
            "timeout",
            format!(
                "the request body did not arrive within {timeout_ms} ms ([http] body-timeout-ms)"
            ),
        )
        .into()),
    }
}

/// How far past `max-body-bytes` a body is read (and dropped) before its
/// `413`.
const DRAIN_FACTOR: usize = 4;

fn set(response: &mut Response, name: &'static str, value: impl ToString) {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(name), v);
    }
}

fn content_type(response: &mut Response, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        response.headers_mut().insert(header::CONTENT_TYPE, v);
    }
}

async fn create(
    host: &Host,
    stream: &StreamAddress,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let given = text(headers, "content-type")?.map(str::trim).unwrap_or("");
    let plausible = given.split(';').next().is_some_and(|t| {
        let (a, b) = t.trim().split_once('/').unwrap_or(("", ""));
        !a.is_empty() && !b.is_empty()
    });
    let ttl = text(headers, "stream-ttl")?;
    let expires = text(headers, "stream-expires-at")?;
    if ttl.is_some() && expires.is_some() {
        return Err(ApiError::invalid(
            "Stream-TTL and Stream-Expires-At together: send one of them",
        ));
    }
    let fork = fork(stream, headers)?;
    let create = DurableCreate {
        content_type: plausible.then(|| given.to_string()),
        ttl_seconds: ttl
            .map(|t| durable::parse_integer("Stream-TTL", t))
            .transpose()?,
        expires_at: expires.map(durable::parse_expires_at).transpose()?,
        closed: flag(headers, CLOSED)?,
        body: body_bytes(host, body).await?,
        fork,
    };
    let (new, d) = host.durable_create(stream, create).await?;
    let mut response = if new {
        StatusCode::CREATED.into_response()
    } else {
        StatusCode::OK.into_response()
    };
    content_type(&mut response, &d.content_type);
    set(
        &mut response,
        NEXT_OFFSET,
        durable::format_offset(d.shown_tail()),
    );
    if new {
        let authority = text(headers, "host")?.unwrap_or("localhost");
        set(
            &mut response,
            "location",
            format!("http://{authority}{}", uri.path()),
        );
    }
    if d.closed {
        set(&mut response, CLOSED, "true");
    }
    Ok(response)
}

/// `Stream-Forked-From` (a path in the same project, or this server's
/// `/ds/{project}...` URL path of it), `Stream-Fork-Offset` and
/// `Stream-Fork-Sub-Offset`.
fn fork(stream: &StreamAddress, headers: &HeaderMap) -> Result<Option<ForkRequest>, ApiError> {
    let from = text(headers, "stream-forked-from")?;
    let offset = text(headers, "stream-fork-offset")?;
    let sub = text(headers, "stream-fork-sub-offset")?;
    let Some(from) = from else {
        if sub.is_some() || offset.is_some() {
            return Err(ApiError::invalid(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
            ));
        }
        return Ok(None);
    };
    let prefix = format!("/ds/{}/", stream.namespace.project_id().unwrap_or_default());
    let path = from
        .strip_prefix(prefix.as_str())
        .map_or(from.to_string(), |p| format!("/{p}"));
    let source = StreamAddress::new(stream.namespace.clone(), &path)?;
    if source == *stream {
        return Err(ApiError::invalid(format!(
            "Stream-Forked-From {from:?} names the stream itself"
        )));
    }
    let offset = offset.map(durable::parse_fork_offset).transpose()?;
    let sub_offset = sub
        .map(|s| durable::parse_integer("Stream-Fork-Sub-Offset", s))
        .transpose()?
        .unwrap_or(0);
    if sub_offset > 0 && offset.is_none() {
        return Err(ApiError::invalid(
            "Stream-Fork-Sub-Offset names part of the message after Stream-Fork-Offset: send both",
        ));
    }
    Ok(Some(ForkRequest {
        source,
        offset,
        sub_offset,
    }))
}

fn producer(headers: &HeaderMap) -> Result<Option<ProducerStamp>, ApiError> {
    let id = text(headers, "producer-id")?;
    let epoch = text(headers, PRODUCER_EPOCH)?;
    let seq = text(headers, PRODUCER_SEQ)?;
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            if id.is_empty() {
                return Err(ApiError::invalid("Producer-Id is empty"));
            }
            Ok(Some(ProducerStamp {
                id: id.to_string(),
                epoch: durable::parse_integer("Producer-Epoch", epoch)?,
                seq: durable::parse_integer("Producer-Seq", seq)?,
            }))
        }
        _ => Err(ApiError::invalid(
            "Producer-Id, Producer-Epoch and Producer-Seq go together: send all three or none",
        )),
    }
}

async fn append(
    host: &Host,
    stream: &StreamAddress,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let producer = producer(headers)?;
    let append = DurableAppend {
        content_type: text(headers, "content-type")?.map(str::to_string),
        close: flag(headers, CLOSED)?,
        stream_seq: text(headers, "stream-seq")?.map(str::to_string),
        body: body_bytes(host, body).await?,
        producer: producer.clone(),
    };
    let stamp = producer.as_ref();
    let close_only = append.close && append.body.is_empty();
    let mut response = match host.durable_append(stream, append).await? {
        Appended::Done { tail, closed } => {
            let status = if stamp.is_some() && !close_only {
                StatusCode::OK
            } else {
                StatusCode::NO_CONTENT
            };
            let mut r = status.into_response();
            set(&mut r, NEXT_OFFSET, durable::format_offset(tail));
            if closed {
                set(&mut r, CLOSED, "true");
            }
            if let Some(p) = stamp {
                set(&mut r, PRODUCER_EPOCH, p.epoch);
                set(&mut r, PRODUCER_SEQ, p.seq);
            }
            r
        }
        Appended::Duplicate {
            last_seq,
            tail,
            closed,
        } => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            set(&mut r, NEXT_OFFSET, durable::format_offset(tail));
            if closed {
                set(&mut r, CLOSED, "true");
            }
            if let Some(p) = stamp {
                set(&mut r, PRODUCER_EPOCH, p.epoch);
            }
            set(&mut r, PRODUCER_SEQ, last_seq);
            r
        }
        Appended::Refused(ProducerRefusal::StaleEpoch { current }) => {
            let mut r = refusal(
                StatusCode::FORBIDDEN,
                "stale-producer-epoch",
                format!(
                    "Producer-Epoch {} is older than the producer's epoch {current}: a newer \
                     session of this producer took over",
                    stamp.map_or(0, |p| p.epoch)
                ),
            );
            set(&mut r, PRODUCER_EPOCH, current);
            r
        }
        Appended::Refused(ProducerRefusal::NewEpochNotAtZero) => refusal(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            format!(
                "Producer-Epoch {} is new: its first Producer-Seq must be 0, not {}",
                stamp.map_or(0, |p| p.epoch),
                stamp.map_or(0, |p| p.seq)
            ),
        ),
        Appended::Refused(ProducerRefusal::Gap { expected, received }) => {
            let mut r = refusal(
                StatusCode::CONFLICT,
                "producer-sequence-gap",
                format!("Producer-Seq {received} skips ahead: the next one is {expected}"),
            );
            set(&mut r, "producer-expected-seq", expected);
            set(&mut r, "producer-received-seq", received);
            r
        }
        Appended::Closed { tail } => {
            let mut r = refusal(
                StatusCode::CONFLICT,
                "stream-closed",
                format!(
                    "stream {:?} is closed: it takes no more appends",
                    stream.path
                ),
            );
            set(&mut r, CLOSED, "true");
            set(&mut r, NEXT_OFFSET, durable::format_offset(tail));
            r
        }
    };
    response.headers_mut().remove(header::CONTENT_LENGTH);
    Ok(response)
}

/// An error answer with a status the protocol names.
fn refusal(status: StatusCode, code: &'static str, message: String) -> Response {
    let body = json!({"error": {"code": code, "message": message}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn head(host: &Host, stream: &StreamAddress) -> Result<Response, ApiError> {
    let d = host.durable_head(stream).await?;
    let mut r = StatusCode::OK.into_response();
    content_type(&mut r, &d.content_type);
    set(&mut r, NEXT_OFFSET, durable::format_offset(d.shown_tail()));
    set(&mut r, "cache-control", "no-store");
    if d.closed {
        set(&mut r, CLOSED, "true");
    }
    if let Some(ttl) = d.ttl_seconds {
        set(&mut r, "stream-ttl", ttl);
    }
    if let Some(at) = &d.expires_at {
        set(&mut r, "stream-expires-at", at);
    }
    let closed = if d.closed { ":c" } else { "" };
    set(
        &mut r,
        "etag",
        format!(
            "\"{}:-1:{}{closed}\"",
            etag_path(stream),
            durable::format_offset(d.shown_tail())
        ),
    );
    Ok(r)
}

fn etag_path(stream: &StreamAddress) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(stream.path.as_bytes())
}

/// A read's query: `offset` (at most once, never empty), `live`, `cursor`.
struct ReadQuery {
    offset: Option<String>,
    live: Option<String>,
    cursor: Option<String>,
}

fn read_query(uri: &Uri) -> Result<ReadQuery, ApiError> {
    let mut q = ReadQuery {
        offset: None,
        live: None,
        cursor: None,
    };
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "offset" => {
                if q.offset.is_some() {
                    return Err(ApiError::invalid("offset is given more than once"));
                }
                if v.is_empty() {
                    return Err(ApiError::invalid(
                        "offset is empty: send -1, now or an offset",
                    ));
                }
                q.offset = Some(v.into_owned());
            }
            "live" => q.live = Some(v.into_owned()),
            "cursor" => q.cursor = Some(v.into_owned()),
            _ => {}
        }
    }
    Ok(q)
}

async fn read(
    host: &Host,
    stream: &StreamAddress,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let q = read_query(uri)?;
    let from = match &q.offset {
        None => ReadFrom::Start,
        Some(o) => durable::parse_offset(o)?,
    };
    match q.live.as_deref() {
        None => {}
        Some("long-poll") | Some("sse") if q.offset.is_none() => {
            return Err(ApiError::invalid(format!(
                "live={} needs an offset (-1 for the beginning, now for the tail)",
                q.live.as_deref().unwrap_or("")
            )));
        }
        Some("long-poll") => return long_poll(host, stream, from, q.cursor.as_deref()).await,
        Some("sse") => return sse(host, stream, from, q.cursor).await,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "live={other:?} is not a live mode: use long-poll or sse"
            )));
        }
    }
    let page = host.durable_read(stream, from).await?;
    if from == ReadFrom::Now {
        let mut r = body_response(&page, Vec::new());
        set(&mut r, "cache-control", "no-store");
        return Ok(r);
    }
    let start = q.offset.clone().unwrap_or_else(|| "-1".into());
    let closed = if page.at_closed_end() { ":c" } else { "" };
    let etag = format!(
        "\"{}:{start}:{}{closed}\"",
        etag_path(stream),
        durable::format_offset(page.next)
    );
    if text(headers, "if-none-match")? == Some(etag.as_str()) {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        set(&mut r, "etag", etag);
        return Ok(r);
    }
    let mut r = body_response(&page, page.events.clone());
    set(&mut r, "etag", etag);
    Ok(r)
}

/// A `200` with a page's content in the stream's content type and the
/// page's headers.
fn body_response(page: &DurablePage, events: Vec<crate::stream::Event>) -> Response {
    let body = if page.stream.json_mode() {
        let messages: Vec<Value> = events.iter().map(durable::as_json_message).collect();
        serde_json::to_vec(&messages).unwrap_or_else(|_| b"[]".to_vec())
    } else {
        events.iter().flat_map(durable::as_bytes).collect()
    };
    let mut r = (StatusCode::OK, body).into_response();
    content_type(&mut r, &page.stream.content_type);
    set(&mut r, NEXT_OFFSET, durable::format_offset(page.next));
    if page.up_to_date {
        set(&mut r, UP_TO_DATE, "true");
    }
    if page.at_closed_end() {
        set(&mut r, CLOSED, "true");
    }
    r
}

fn cursor(host: &Host, client: Option<&str>) -> String {
    let jitter = 1 + (uuid::Uuid::new_v4().as_u128() % 3600) as u64;
    durable::response_cursor(host.streams.now_ms(), client, jitter)
}

async fn long_poll(
    host: &Host,
    stream: &StreamAddress,
    from: ReadFrom,
    client_cursor: Option<&str>,
) -> Result<Response, ApiError> {
    let page = host.durable_read(stream, from).await?;
    let waits = page.events.is_empty() && !page.stream.closed;
    let page = if waits {
        let after = page.next;
        match host
            .durable_wait(
                stream,
                &page.stream,
                after,
                Duration::from_millis(host.config.http.long_poll_ms),
            )
            .await?
        {
            Some(p) => p,
            None => {
                let mut r = StatusCode::NO_CONTENT.into_response();
                set(&mut r, NEXT_OFFSET, durable::format_offset(after));
                set(&mut r, UP_TO_DATE, "true");
                set(&mut r, CURSOR, cursor(host, client_cursor));
                return Ok(r);
            }
        }
    } else {
        page
    };
    if page.events.is_empty() {
        // Closed, and the reader is at its end.
        let mut r = StatusCode::NO_CONTENT.into_response();
        set(&mut r, NEXT_OFFSET, durable::format_offset(page.next));
        set(&mut r, UP_TO_DATE, "true");
        set(&mut r, CLOSED, "true");
        set(&mut r, CURSOR, cursor(host, client_cursor));
        return Ok(r);
    }
    let events = page.events.clone();
    let mut r = body_response(&page, events);
    set(&mut r, CURSOR, cursor(host, client_cursor));
    Ok(r)
}

/// A data event (when there are events) and its control event, as one
/// write: `next` the offset after them, `end` the last of a closed stream.
fn sse_frame(
    events: &[crate::stream::Event],
    json_mode: bool,
    base64: bool,
    next: u64,
    end: bool,
    up_to_date: bool,
    cursor: &str,
) -> Bytes {
    let mut out = Vec::new();
    if !events.is_empty() {
        let data = if json_mode {
            let messages: Vec<Value> = events.iter().map(durable::as_json_message).collect();
            serde_json::to_string(&messages).unwrap_or_else(|_| "[]".into())
        } else {
            let bytes: Vec<u8> = events.iter().flat_map(durable::as_bytes).collect();
            if base64 {
                base64::engine::general_purpose::STANDARD.encode(bytes)
            } else {
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        out.extend_from_slice(&sse_event("data", &data));
    }
    let mut control = json!({"streamNextOffset": durable::format_offset(next)});
    if end {
        control["streamClosed"] = json!(true);
    } else {
        control["streamCursor"] = json!(cursor);
        if up_to_date {
            control["upToDate"] = json!(true);
        }
    }
    out.extend_from_slice(&sse_event("control", &control.to_string()));
    Bytes::from(out)
}

/// One SSE event: `event: {kind}` and each line of `data` as a `data:`
/// line (any of CR, LF, CRLF ends a line, so no payload can forge an
/// event).
fn sse_event(kind: &str, data: &str) -> Bytes {
    let mut out = format!("event: {kind}\n");
    for line in data.split("\r\n").flat_map(|l| l.split(['\r', '\n'])) {
        out.push_str("data:");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

async fn sse(
    host: &Host,
    stream: &StreamAddress,
    from: ReadFrom,
    client_cursor: Option<String>,
) -> Result<Response, ApiError> {
    let first = host.durable_read(stream, from).await?;
    let base64 = !durable::is_text(&first.stream.content_type);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let host = host.clone();
    let stream = stream.clone();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + SSE_LIFETIME;
        let keep_alive_every = Duration::from_millis(host.config.http.long_poll_ms);
        let frame = |events: &[crate::stream::Event],
                     d: &durable::DurableStream,
                     next: u64,
                     end: bool,
                     up_to_date: bool| {
            sse_frame(
                events,
                d.json_mode(),
                base64,
                next,
                end,
                up_to_date,
                &cursor(&host, client_cursor.as_deref()),
            )
        };
        // Catching up: pages read from the log, each sent as it is read.
        let mut page = first;
        loop {
            let end = page.at_closed_end();
            let out = frame(&page.events, &page.stream, page.next, end, page.up_to_date);
            if tx.send(out).await.is_err() || end {
                return;
            }
            if page.up_to_date {
                break;
            }
            page = match host.durable_read(&stream, ReadFrom::After(page.next)).await {
                Ok(p) => p,
                Err(_) => return,
            };
        }
        // Live: what the stream's live connection brings, sent as it is
        // (nothing is read again), a control event alone after a quiet
        // `[http] long-poll-ms`; the response ends after a minute.
        let d = page.stream;
        let mut next = page.next;
        let Ok(mut live) = host.durable_watch(&stream, &d, next).await else {
            return;
        };
        loop {
            let keep_alive = (tokio::time::Instant::now() + keep_alive_every).min(deadline);
            let arrival = tokio::select! {
                a = next_arrival(&mut live, keep_alive) => a,
                _ = tx.closed() => return,
            };
            let out = match arrival {
                Ok(a) if a.deleted => return,
                Ok(a) => {
                    if a.events.is_empty() && !a.closed {
                        continue;
                    }
                    if let Some(last) = a.events.last() {
                        next = d.shown(last.offset);
                    }
                    let out = frame(&a.events, &d, next, a.closed, a.complete);
                    if a.closed {
                        let _ = tx.send(out).await;
                        return;
                    }
                    out
                }
                Err(News::Timeout) if tokio::time::Instant::now() < deadline => {
                    frame(&[], &d, next, false, true)
                }
                Err(_) => return,
            };
            if tx.send(out).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    }));
    let mut r = (StatusCode::OK, body).into_response();
    content_type(&mut r, "text/event-stream");
    set(&mut r, "cache-control", "no-cache");
    if base64 {
        set(&mut r, "stream-sse-data-encoding", "base64");
    }
    Ok(r)
}
