//! ITX calls: an exported function of a deployed component, called with
//! JSON arguments (WIT values in their JSON form). `POST
//! /v1/projects/{p}/itx` over HTTP.

use serde_json::Value;

use super::components::component_not_found;
use super::Host;
use crate::error::Error;
use crate::itx::{resolve, Target};
use crate::processor::runtime::{CallError, Runtime};
use crate::storage::Storage;

/// How long an ITX call waits for its project's place among the calls
/// running (`[processors] max-concurrent-calls-per-project`) before it is
/// refused with `429 too-many-calls`.
pub(super) const CALL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Calls `function` of `component` in `project` (blocking).
fn call_blocking(
    storage: &Storage,
    runtime: &Runtime,
    project: &str,
    component: &str,
    function: &str,
    args: &[Value],
    timeout_ms: u64,
) -> Result<Value, Error> {
    let internal = |e: anyhow::Error| Error::internal(format!("{e:#}"));
    let (prepared, row) = crate::processor::deployed(storage, runtime, project, component)
        .map_err(internal)?
        .ok_or_else(|| component_not_found(project, component))?;
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
            CallError::NoSuchFunction(f) => Error::not_found(
                "function-not-found",
                format!(
                    "component {component:?} exports no function {f:?} (it exports: {})",
                    row.exports.join(", ")
                ),
            ),
            CallError::Argument(m) => Error::invalid_with("invalid-argument", m.to_string()),
            CallError::Guest(g) => {
                Error::unprocessable("itx-failed", format!("{component}.{function}: {g}"))
            }
            CallError::Err(v) => Error::unprocessable(
                "itx-failed",
                format!("{component}.{function} returned err: {v}"),
            ),
        })
}

impl Host {
    /// Calls `function` (`interface.function` or a top-level `function`) of
    /// component `component` deployed in `project` with JSON arguments, one
    /// per parameter; answers its result as JSON. A guest's `err` or trap
    /// is `itx-failed`; a bad argument `invalid-argument`, naming its path.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "kinds", std::fs::read(guests.join("kinds.wasm"))?)).await?;
    /// use serde_json::json;
    ///
    /// let sum = host.call("acme", "kinds", "add", [json!(2), json!(3)]).await?;
    /// assert_eq!(sum, json!(5));
    /// let e = host.call("acme", "kinds", "divide", [json!(1.0), json!(0.0)]).await.unwrap_err();
    /// assert_eq!(e.code, "itx-failed");
    /// # Ok(()) }
    /// ```
    pub async fn call(
        &self,
        project: &str,
        component: &str,
        function: &str,
        args: impl Into<Vec<Value>>,
    ) -> Result<Value, Error> {
        crate::stream::Namespace::project(project)?;
        let storage = self.streams.storage().clone();
        let runtime = self.streams.wasm_runtime().clone();
        let (project, component, function) = (
            project.to_string(),
            component.to_string(),
            function.to_string(),
        );
        let args = args.into();
        let timeout_ms = self.config.delivery.timeout_ms;
        let place = self
            .streams
            .executors()
            .calls
            .enter_within(&project, CALL_WAIT)
            .await?;
        // The place goes with the call: a caller that goes away does not
        // give it back while the guest still runs.
        let guest = runtime.clone();
        guest
            .run_guest(move || {
                let _place = place;
                call_blocking(
                    &storage, &runtime, &project, &component, &function, &args, timeout_ms,
                )
            })
            .await
            .map_err(|e| Error::internal(format!("the call panicked: {e}")))?
    }

    /// As [`Host::call`], the function named by an ITX expression
    /// (`["components", ["get", "calculator"], "math.add"]`, as subscriptions name
    /// their ITX receivers).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "kinds", std::fs::read(guests.join("kinds.wasm"))?)).await?;
    /// use serde_json::json;
    ///
    /// let expression = json!(["components", ["get", "kinds"], "divide"]);
    /// let half = host.call_expression("acme", &expression, [json!(5.0), json!(2.0)]).await?;
    /// assert_eq!(half, json!(2.5));
    /// # Ok(()) }
    /// ```
    pub async fn call_expression(
        &self,
        project: &str,
        expression: &Value,
        args: impl Into<Vec<Value>>,
    ) -> Result<Value, Error> {
        let Target::ComponentFunction {
            component,
            function,
        } = resolve(expression).map_err(|m| Error::invalid_with("invalid-expression", m))?;
        self.call(project, &component, &function, args).await
    }
}
