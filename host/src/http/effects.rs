//! The processor outbox over HTTP: `GET /v1/projects/{p}/effects` (a page,
//! filtered), `GET .../effects/{id}`, `POST .../effects/{id}:retry` and
//! `POST .../effects/{id}:cancel`: parse ([`super::mapping::parse_effect`]),
//! apply ([`Host::apply_effect`]), render.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use std::sync::Arc;

use super::error::ApiError;
use super::{answer, authorize_project, mapping};
use crate::host::request::{EffectAnswer, EffectRequest};
use crate::host::Host;

async fn serve(
    host: &Host,
    method: &Method,
    project: &str,
    id: Option<&str>,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<EffectAnswer, ApiError> {
    let caller = authorize_project(host, headers, project)?;
    let request = match mapping::parse_effect(method, id, uri.query()) {
        // An unknown effect is named before an unknown method of it.
        Err(e) if e.code == "method-not-found" => {
            let known = id.and_then(|i| i.split(':').next()?.parse::<i64>().ok());
            if let Some(known) = known {
                host.effect(project, known).await?;
            }
            return Err(e);
        }
        parsed => parsed?,
    };
    match &request {
        EffectRequest::Retry { id } => {
            caller.require_configure(&format!("retrying effect {id}"))?
        }
        EffectRequest::Cancel { id } => {
            caller.require_configure(&format!("cancelling effect {id}"))?
        }
        EffectRequest::List(_) | EffectRequest::Get { .. } => {}
    }
    Ok(host.apply_effect(project, request).await?)
}

/// `GET /v1/projects/{p}/effects`.
pub(super) async fn list(
    State(host): State<Arc<Host>>,
    Path(project): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    answer(serve(&host, &method, &project, None, &uri, &headers).await)
}

/// `GET .../effects/{id}`, `POST .../effects/{id}:retry|cancel`.
pub(super) async fn route(
    State(host): State<Arc<Host>>,
    Path((project, id)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    answer(serve(&host, &method, &project, Some(&id), &uri, &headers).await)
}
