//! `POST /v1/projects/{project}/itx` over HTTP: parse, call the host
//! ([`crate::host::itx`]), render `{"result": ...}`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{answer, authorize_project, read_json};
use crate::host::Host;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ItxInput {
    expression: Value,
    #[serde(default)]
    args: Vec<Value>,
}

/// `POST /v1/projects/{project}/itx`.
pub(super) async fn call(
    State(host): State<Host>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        authorize_project(&host, &headers, &project)?;
        let input: ItxInput = read_json(&host, body).await?;
        let result = host
            .call_expression(&project, &input.expression, input.args)
            .await?;
        Ok(json!({ "result": result }))
    }
    .await;
    answer(result)
}
