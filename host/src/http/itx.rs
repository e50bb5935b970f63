//! `POST /v1/projects/{project}/itx` over HTTP: parse
//! ([`super::mapping::parse_itx`]), apply ([`Host::apply_itx`]), render
//! `{"result": ...}`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::json;
use std::sync::Arc;

use super::{answer, authorize_project, mapping, read_body};
use crate::host::Host;

/// `POST /v1/projects/{project}/itx`.
pub(super) async fn call(
    State(host): State<Arc<Host>>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        authorize_project(&host, &headers, &project)?;
        let limit = host.config.max_body_bytes;
        let body = read_body(&host, body, limit, "request body").await?;
        let request = mapping::parse_itx(&body)?;
        let trace = super::header_trace(&headers);
        Ok(json!({ "result": host.apply_itx_traced(&project, request, trace).await? }))
    }
    .await;
    answer(result)
}
