//! Ingest over HTTP: `POST /v1/projects/{p}/ingest{path}` (accept, `202`),
//! a project's parked events (`GET .../ingest/parked`, `POST
//! .../ingest/parked/{id}:redrive|discard`), `GET /v1/ingest` and
//! `POST /v1/ingest:register` (admin).

use super::error::ApiError;
use super::{answer, authenticate, authorize_project, mapping, read_body};
use crate::host::request::{IngestAnswer, IngestRequest};
use crate::host::Host;
use crate::stream::Namespace;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// `POST /v1/projects/{project}/ingest` (the root stream).
pub async fn accept_root(
    State(host): State<Arc<Host>>,
    axum::extract::Path(project): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(accept(&host, &project, "/", &headers, body).await)
}

/// `POST /v1/projects/{project}/ingest/{path}`, and the parked events:
/// `GET .../ingest/parked`, `POST .../ingest/parked/{id}:redrive|discard`
/// (a stream path has no `:`, and `GET` accepts nothing).
pub async fn path_route(
    State(host): State<Arc<Host>>,
    axum::extract::Path((project, rest)): axum::extract::Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(request) = mapping::parse_parked(&project, &method, &rest, uri.query()) {
        let result = async {
            authorize_project(&host, &headers, &project)?;
            Ok(host.apply_ingest(request?).await?)
        }
        .await;
        return answer(result);
    }
    if method != Method::POST {
        return ApiError::new(
            405,
            "method-not-allowed",
            format!("{method} is not allowed here: POST events to ingest them"),
        )
        .into_response();
    }
    respond(accept(&host, &project, &format!("/{rest}"), &headers, body).await)
}

fn respond(result: Result<IngestAnswer, ApiError>) -> Response {
    match result
        .and_then(|a| serde_json::to_string(&a).map_err(|e| ApiError::internal(e.to_string())))
    {
        Ok(body) => (
            StatusCode::ACCEPTED,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn accept(
    host: &Host,
    project: &str,
    path: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<IngestAnswer, ApiError> {
    let caller = authenticate(host, headers)?;
    caller.may_use(&Namespace::project(project)?)?;
    let limit = host.config.max_body_bytes;
    let body = read_body(host, body, limit, "request body").await?;
    let mut request = mapping::parse_ingest(project, path, &body)?;
    if let IngestRequest::Accept { events, .. } = &mut request {
        super::carry_trace(events, headers);
    }
    Ok(host.apply_ingest(request).await?)
}

/// The admins' ingest requests: `GET /v1/ingest`, `POST /v1/ingest:register`.
async fn admin(host: &Host, headers: &HeaderMap, request: IngestRequest, what: &str) -> Response {
    let result = async {
        authenticate(host, headers)?.require_admin(what)?;
        Ok(host.apply_ingest(request).await?)
    }
    .await;
    answer(result)
}

/// `GET /v1/ingest`.
pub async fn status(State(host): State<Arc<Host>>, headers: HeaderMap) -> Response {
    admin(&host, &headers, IngestRequest::Status, "GET /v1/ingest").await
}

/// `POST /v1/ingest:register`: the bridge registers the JetStream stream
/// it sees now (it must be empty) and consumes it; answers its status, or
/// `409 registration-refused` with the reason.
pub async fn register(State(host): State<Arc<Host>>, headers: HeaderMap) -> Response {
    admin(
        &host,
        &headers,
        IngestRequest::Register,
        "POST /v1/ingest:register",
    )
    .await
}
