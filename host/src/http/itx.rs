//! `POST /v1/projects/{project}/itx`: call an exported function of a
//! deployed component with JSON arguments.

use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use crate::host::Host;
use crate::itx::{resolve, Target};
use crate::processor::runtime::{CallError, Runtime};
use crate::storage::Storage;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ItxInput {
    pub expression: Value,
    #[serde(default)]
    pub args: Vec<Value>,
}

/// Calls `function` of `component` in `project` (blocking).
pub fn call(
    storage: &Storage,
    runtime: &Runtime,
    project: &str,
    component: &str,
    function: &str,
    args: &[Value],
    timeout_ms: u64,
) -> Result<Value, ApiError> {
    let internal = |e: anyhow::Error| ApiError::internal(format!("{e:#}"));
    let (prepared, row) = crate::processor::deployed(storage, runtime, project, component)
        .map_err(internal)?
        .ok_or_else(|| ApiError::component_not_found(project, component))?;
    runtime
        .call_function(
            component,
            &prepared,
            function,
            args,
            timeout_ms,
            Default::default(),
        )
        .map_err(|e| match e {
            CallError::NoSuchFunction(f) => ApiError::not_found(
                "function-not-found",
                format!(
                    "component {component:?} exports no function {f:?} (it exports: {})",
                    row.exports.join(", ")
                ),
            ),
            CallError::Argument(m) => ApiError::new(400, "invalid-argument", m.to_string()),
            CallError::Guest(g) => {
                ApiError::new(422, "itx-failed", format!("{component}.{function}: {g}"))
            }
            CallError::Err(v) => ApiError::new(
                422,
                "itx-failed",
                format!("{component}.{function} returned err: {v}"),
            ),
        })
}

/// `POST /v1/projects/{project}/itx`.
pub async fn itx(host: &Host, project: &str, input: ItxInput) -> Result<Value, ApiError> {
    let Target::ComponentFunction {
        component,
        function,
    } = resolve(&input.expression).map_err(|m| ApiError::new(400, "invalid-expression", m))?;
    let storage = host.streams.storage().clone();
    let runtime = host.streams.wasm_runtime().clone();
    let project = project.to_string();
    let timeout_ms = host.config.delivery.timeout_ms;
    let result = tokio::task::spawn_blocking(move || {
        call(
            &storage,
            &runtime,
            &project,
            &component,
            &function,
            &input.args,
            timeout_ms,
        )
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(json!({ "result": result }))
}
