//! Components over HTTP (`PUT`/`GET /v1/projects/{p}/components/...`):
//! parse ([`super::mapping::parse_component`]), apply
//! ([`Host::apply_component`]), render.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use super::error::ApiError;
use super::{authorize_project, mapping, ok_json, read_body};
use crate::host::components::COMPONENT_BYTES_MAX;
use crate::host::request::ComponentAnswer;
use crate::host::Host;

/// Which component route: `.../components` (no name),
/// `.../components/{name}`, `.../components/{name}/versions`.
struct Place<'a> {
    project: &'a str,
    name: Option<&'a str>,
    versions: bool,
}

/// Every component route.
async fn serve(
    host: &Host,
    place: Place<'_>,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Place {
        project,
        name,
        versions,
    } = place;
    let caller = authorize_project(host, headers, project)?;
    if method == Method::PUT {
        caller.require_configure(&format!("deploying component {:?}", name.unwrap_or("")))?;
    }
    let bytes = if method == Method::PUT {
        Some(
            read_body(host, body, COMPONENT_BYTES_MAX, "component")
                .await?
                .to_vec(),
        )
    } else {
        None
    };
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let request = mapping::parse_component(&method, name, versions, uri.query(), accept, bytes)?;
    Ok(match host.apply_component(project, request).await? {
        ComponentAnswer::Bytes(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, mapping::WASM)],
            bytes,
        )
            .into_response(),
        answer => ok_json(&answer),
    })
}

fn respond(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/projects/{project}/components`.
pub(super) async fn list(
    State(host): State<Arc<Host>>,
    Path(project): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let place = Place {
        project: &project,
        name: None,
        versions: false,
    };
    respond(serve(&host, place, method, &uri, &headers, body).await)
}

/// `PUT`/`GET .../components/{name}` (its bytes with `accept:
/// application/wasm`).
pub(super) async fn one(
    State(host): State<Arc<Host>>,
    Path((project, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let place = Place {
        project: &project,
        name: Some(&name),
        versions: false,
    };
    respond(serve(&host, place, method, &uri, &headers, body).await)
}

/// `GET .../components/{name}/versions`.
pub(super) async fn versions(
    State(host): State<Arc<Host>>,
    Path((project, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let place = Place {
        project: &project,
        name: Some(&name),
        versions: true,
    };
    respond(serve(&host, place, method, &uri, &headers, body).await)
}
