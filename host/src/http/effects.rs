//! The processor outbox over HTTP: `GET /v1/projects/{p}/effects` (a page,
//! filtered), `GET .../effects/{id}`, `POST .../effects/{id}:retry` and
//! `POST .../effects/{id}:cancel`: parse, call the host
//! ([`crate::host::effects`]), render.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;

use super::error::ApiError;
use super::{answer, authorize_project, query::effect_query};
use crate::host::Host;

/// `GET /v1/projects/{p}/effects`.
pub(super) async fn list(
    State(host): State<Host>,
    Path(project): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let result = async {
        authorize_project(&host, &headers, &project)?;
        let filter = effect_query(uri.query())?;
        Ok(host.effects(&project, filter).await?)
    }
    .await;
    answer(result)
}

fn parse_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::invalid(format!("effect id {raw:?} is not a positive integer")))
}

/// `GET .../effects/{id}`, `POST .../effects/{id}:retry|cancel`.
pub(super) async fn route(
    State(host): State<Host>,
    Path((project, id)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let result = async {
        authorize_project(&host, &headers, &project)?;
        let effect = match (id.split_once(':'), &method) {
            (None, &Method::GET) => host.effect(&project, parse_id(&id)?).await?,
            (Some((id, "retry")), &Method::POST) => {
                host.retry_effect(&project, parse_id(id)?).await?
            }
            (Some((id, "cancel")), &Method::POST) => {
                host.cancel_effect(&project, parse_id(id)?).await?
            }
            (Some((id, other)), &Method::POST) => {
                host.effect(&project, parse_id(id)?).await?;
                return Err(ApiError::not_found(
                    "method-not-found",
                    format!("unknown effect method {other:?}: use :retry or :cancel"),
                ));
            }
            _ => {
                return Err(ApiError::new(
                    405,
                    "method-not-allowed",
                    format!(
                        "{method} is not allowed here: GET an effect, POST its :retry or :cancel"
                    ),
                ))
            }
        };
        Ok(effect)
    }
    .await;
    answer(result)
}
