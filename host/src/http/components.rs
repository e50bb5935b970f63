//! Components over HTTP (`PUT`/`GET /v1/projects/{p}/components/...`):
//! parse, call the host ([`crate::host::components`]), render.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{answer, authorize_project, query, read_body};
use crate::host::components::{Deploy, COMPONENT_BYTES_MAX};
use crate::host::Host;

/// `PUT /v1/projects/{project}/components/{name}[?refold=true]`.
pub(super) async fn deploy(
    State(host): State<Host>,
    Path((project, name)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        authorize_project(&host, &headers, &project)?;
        let refold = query::deploy_query(uri.query())?;
        let bytes = read_body(&host, body, COMPONENT_BYTES_MAX, "component").await?;
        let mut deploy = Deploy::new(project, name, bytes.to_vec());
        if refold {
            deploy = deploy.refold();
        }
        Ok(host.deploy(deploy).await?)
    }
    .await;
    answer(result)
}

/// `GET /v1/projects/{project}/components`.
pub(super) async fn list(
    State(host): State<Host>,
    Path(project): Path<String>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        authorize_project(&host, &headers, &project)?;
        Ok(json!({ "components": host.components(&project).await? }))
    }
    .await;
    answer(result)
}

/// `GET .../components/{name}/versions`.
pub(super) async fn versions(
    State(host): State<Host>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        authorize_project(&host, &headers, &project)?;
        Ok(host.component_versions(&project, &name).await?)
    }
    .await;
    answer(result)
}

/// `GET .../components/{name}`: the component as JSON, or its bytes with
/// `accept: application/wasm` (to run a repro command locally).
pub(super) async fn get(
    State(host): State<Host>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let wants_wasm = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/wasm"));
    if let Err(e) = authorize_project(&host, &headers, &project) {
        return e.into_response();
    }
    if !wants_wasm {
        return answer(host.component(&project, &name).await.map_err(Into::into));
    }
    match host.component_bytes(&project, &name).await {
        Ok(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/wasm")],
            bytes,
        )
            .into_response(),
        Err(e) => super::ApiError::from(e).into_response(),
    }
}

