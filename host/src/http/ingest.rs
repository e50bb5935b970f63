//! Ingest over HTTP: `POST /v1/projects/{p}/ingest{path}` (accept, `202`),
//! `GET /v1/ingest` and `POST /v1/ingest:register` (admin).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::{answer, authenticate, read_json};
use crate::host::Host;
use crate::stream::{EventInput, Namespace, StreamAddress};

/// The body of an ingest request.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IngestInput {
    events: Vec<EventInput>,
}

/// `POST /v1/projects/{project}/ingest` (the root stream).
pub async fn accept_root(
    State(host): State<Host>,
    axum::extract::Path(project): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(accept(&host, &project, "/", &headers, body).await)
}

/// `POST /v1/projects/{project}/ingest/{path}`.
pub async fn accept_path(
    State(host): State<Host>,
    axum::extract::Path((project, rest)): axum::extract::Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(accept(&host, &project, &format!("/{rest}"), &headers, body).await)
}

fn respond(result: Result<usize, ApiError>) -> Response {
    match result {
        Ok(n) => (
            StatusCode::ACCEPTED,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"accepted": n}).to_string(),
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
) -> Result<usize, ApiError> {
    let caller = authenticate(host, headers)?;
    let namespace = Namespace::project(project)?;
    caller.may_use(&namespace)?;
    let address = StreamAddress::new(namespace, path)?;
    let input: IngestInput = read_json(host, body).await?;
    Ok(host.ingest(&address, input.events).await?)
}

/// `GET /v1/ingest`.
pub async fn status(State(host): State<Host>, headers: HeaderMap) -> Response {
    let result = async {
        authenticate(&host, &headers)?.require_admin("GET /v1/ingest")?;
        Ok(host.ingest_status().await?)
    }
    .await;
    answer(result)
}

/// `POST /v1/ingest:register`: the bridge registers the JetStream stream
/// it sees now (it must be empty) and consumes it; answers its status, or
/// `409 registration-refused` with the reason.
pub async fn register(State(host): State<Host>, headers: HeaderMap) -> Response {
    let result = async {
        authenticate(&host, &headers)?.require_admin("POST /v1/ingest:register")?;
        Ok(host.register_ingest().await?)
    }
    .await;
    answer(result)
}
