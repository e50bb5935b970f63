//! A project's webhook signing secrets over HTTP (admin):
//! `PUT /v1/projects/{p}/secrets/webhooks` generates a new one and answers
//! `{"secret": "whsec_..."}` (the previous keeps signing until retired),
//! `POST /v1/projects/{p}/secrets/webhooks:retirePrevious` retires the
//! previous one (`{"retired": true|false}`).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

use super::error::ApiError;
use super::{answer, authenticate};
use crate::host::Host;

/// `PUT .../secrets/webhooks`, `POST .../secrets/webhooks:retirePrevious`.
pub(super) async fn route(
    State(host): State<Arc<Host>>,
    Path((project, name)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let caller = authenticate(&host, &headers)?;
        crate::stream::validate_project(&project)?;
        match (name.as_str(), &method) {
            ("webhooks", &Method::PUT) => {
                caller.require_admin(&format!("a new webhook secret for project {project:?}"))?;
                let made = host.rotate_webhook_secret(&project).await?;
                Ok(json!({"secret": made.secret}))
            }
            ("webhooks:retirePrevious", &Method::POST) => {
                caller.require_admin(&format!(
                    "retiring the previous webhook secret of project {project:?}"
                ))?;
                let done = host.retire_previous_webhook_secret(&project).await?;
                Ok(json!({"retired": done.retired}))
            }
            ("webhooks", _) => Err(ApiError::new(
                405,
                "method-not-allowed",
                format!("{method} is not allowed here: PUT generates a new webhook secret"),
            )),
            ("webhooks:retirePrevious", _) => Err(ApiError::new(
                405,
                "method-not-allowed",
                format!("{method} is not allowed here: POST retires the previous secret"),
            )),
            (other, _) => Err(ApiError::not_found(
                "not-found",
                format!(
                    "no secret {other:?}: a project has `webhooks` (PUT) and \
                     `webhooks:retirePrevious` (POST)"
                ),
            )),
        }
    }
    .await;
    let result: Result<Value, ApiError> = result;
    match result {
        Ok(v) => {
            // The secret is in this answer only: never cached on the way.
            let mut response = answer(Ok(v));
            response.headers_mut().insert(
                axum::http::header::CACHE_CONTROL,
                axum::http::HeaderValue::from_static("no-store"),
            );
            response
        }
        Err(e) => e.into_response(),
    }
}
