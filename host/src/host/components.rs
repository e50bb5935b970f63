//! Components: deploying a version, listing them, reading one (and its
//! bytes) and its versions. `PUT`/`GET /v1/projects/{p}/components/...`
//! over HTTP.

use crate::component::DeployMode;
pub use crate::rollout::versions::SubscriptionRef;
use serde::Serialize;
use serde_json::Value;

use super::Host;
use crate::clock::format_timestamp;
use crate::error::Error;
use crate::storage::{Deployment, WriteOp};
use crate::stream::{types, validate_project, StreamAddress};

/// Largest component accepted, in bytes.
pub const COMPONENT_BYTES_MAX: usize = 64 * 1024 * 1024;

/// A component to deploy: its project, name and bytes, and whether every
/// instance refolds with it. Build with [`Deploy::new`].
#[derive(Debug, Clone)]
pub struct Deploy {
    project: String,
    name: String,
    bytes: Vec<u8>,
    mode: DeployMode,
}

impl Deploy {
    /// Deploys `bytes` (a WebAssembly component) as `name` in `project`;
    /// each instance goes on from its checkpoint with it
    /// ([`DeployMode::Continue`]).
    pub fn new(project: impl Into<String>, name: impl Into<String>, bytes: Vec<u8>) -> Self {
        Deploy {
            project: project.into(),
            name: name.into(),
            bytes,
            mode: DeployMode::Continue,
        }
    }

    /// How the instances of the version it replaces are treated (the
    /// methods below set one each; the last one set holds).
    pub fn mode(mut self, mode: DeployMode) -> Self {
        self.mode = mode;
        self
    }

    /// [`DeployMode::Shadow`]: folds every instance with this version
    /// beside the current one, which keeps serving and waking
    /// (`?refold=shadow` over HTTP): its effects are held, its state and
    /// keys compared ([`Host::processor_shadow`]) until each instance is
    /// promoted ([`Host::promote_shadow`]) or discarded
    /// ([`Host::discard_shadow`]). A deploy while a shadow exists replaces
    /// it.
    pub fn shadow(self) -> Self {
        self.mode(DeployMode::Shadow)
    }

    /// [`DeployMode::Refold`]: refolds every instance from the new
    /// version's initial state, even if its bytes are unchanged
    /// (`?refold=true` over HTTP); history's effects are dropped.
    pub fn refold(self) -> Self {
        self.mode(DeployMode::Refold {
            replay_effects: false,
        })
    }

    /// [`DeployMode::Refold`] storing the effects the new version's fold
    /// returns for history too (deduplicated by identity;
    /// `?refold=true&replayEffects=true`). By default a refold drops them:
    /// history's effects ran under the old version.
    pub fn replay_effects(self) -> Self {
        self.mode(DeployMode::Refold {
            replay_effects: true,
        })
    }
}

/// What a deploy did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Deployed {
    /// The component's name.
    pub name: String,
    /// The deployed version's digest (`sha256:...`).
    pub digest: String,
    /// Its exported functions (`interface.function` or `function`).
    pub exports: Vec<String>,
    /// This host is compiling it (in the background: the deploy answered
    /// once it was validated and stored); its first wake or call waits for
    /// the compile, which does not count against its timeout.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub compiling: bool,
    /// The bytes are the current version's: no new version was made.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unchanged: bool,
    /// Subscriptions the component had halted, resumed by the new version.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resumed_subscriptions: Vec<SubscriptionRef>,
    /// Subscriptions failing on the component, retried at once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retrying_subscriptions: Vec<SubscriptionRef>,
    /// Every instance refolds with this version ([`Deploy::refold`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refolding: bool,
    /// The streams whose instance refolds (with `refolding`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refolding_streams: Option<Vec<String>>,
    /// With [`Deploy::shadow`]: the streams whose instance it shadows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadowing: Option<Vec<String>>,
}

/// A deployed component: its current version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    /// The component's name.
    pub name: String,
    /// The current version's digest.
    pub digest: String,
    /// Its exported functions.
    pub exports: Vec<String>,
    /// When the current version was deployed (RFC 3339).
    pub deployed_at: String,
    /// This host is compiling the current version now.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub compiling: bool,
}

impl Component {
    /// The component of a stored row; `compiling` from `runtime`.
    fn from_row(
        r: crate::storage::ComponentRow,
        runtime: &crate::processor::runtime::Runtime,
    ) -> Self {
        Component {
            compiling: runtime.is_compiling(&r.digest),
            name: r.name,
            digest: r.digest,
            exports: r.exports,
            deployed_at: r.deployed_at,
        }
    }
}

/// A component's versions, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentVersions {
    /// The component's name.
    pub name: String,
    /// Its versions, newest first.
    pub versions: Vec<Version>,
}

/// One version of a component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    /// The version's digest.
    pub digest: String,
    /// When it was deployed (RFC 3339).
    pub deployed_at: String,
}

/// `404 component-not-found`.
pub(crate) fn component_not_found(project: &str, component: &str) -> Error {
    Error::not_found(
        "component-not-found",
        format!("component {component:?} is not deployed in project {project:?}"),
    )
}

/// Component names follow project names: `[a-z0-9][a-z0-9-]{0,62}`.
fn validate_name(name: &str) -> Result<(), Error> {
    validate_project(name).map_err(|_| {
        Error::invalid(format!(
            "component name {name:?} is invalid: it must match [a-z0-9][a-z0-9-]{{0,62}}"
        ))
    })
}

impl Host {
    /// Deploys a component: a new version when its bytes differ from the
    /// current one's. Subscriptions the component halted resume, failing
    /// ones retry at once, and with [`Deploy::refold`] every instance
    /// refolds.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// use streamhost::Deploy;
    ///
    /// let bytes = std::fs::read(guests.join("counter.wasm"))?;
    /// let deployed = host.deploy(Deploy::new("acme", "counter", bytes.clone())).await?;
    /// assert!(deployed.digest.starts_with("sha256:"));
    /// // The same bytes again make no new version.
    /// assert!(host.deploy(Deploy::new("acme", "counter", bytes)).await?.unchanged);
    /// # Ok(()) }
    /// ```
    pub async fn deploy(&self, deploy: Deploy) -> Result<Deployed, Error> {
        let Deploy {
            project,
            name,
            bytes,
            mode,
        } = deploy;
        crate::stream::Namespace::project(&project)?;
        validate_name(&name)?;
        if bytes.len() > COMPONENT_BYTES_MAX {
            return Err(Error::too_large(format!(
                "the component is over the limit of {COMPONENT_BYTES_MAX} bytes"
            )));
        }
        let runtime = self.streams.wasm_runtime().clone();
        // Validated without compiling: the deploy answers in a fraction of
        // a second and the compile goes on in the background (below).
        let (storage, (p, n)) = (
            self.streams.storage().clone(),
            (project.clone(), name.clone()),
        );
        let bounded = self.streams.stored().max().is_some();
        let (exports, bytes, digest, current) = tokio::task::spawn_blocking(move || {
            let digest = crate::processor::runtime::digest(&bytes);
            // (The version deployed now, when stored bytes are bounded: the
            // same bytes again store nothing.)
            let current = bounded
                .then(|| storage.component(&p, &n).ok().flatten().map(|c| c.digest))
                .flatten();
            runtime.check(&bytes).map(|e| (e, bytes, digest, current))
        })
        .await
        .map_err(|e| Error::internal(format!("validating the component panicked: {e}")))?
        .map_err(|m| Error::invalid_with("invalid-component", m))?;
        if mode.is_shadow() {
            // A shadow folds beside the current version: there must be one.
            self.component(&project, &name).await?;
        }
        // A new version's bytes count against the project's stored bytes
        // (`507 project-storage-full` at its bound; the same bytes again
        // store nothing).
        if current.as_ref() != Some(&digest) {
            self.streams.stored().admit(&project, bytes.len() as u64)?;
        }
        let deployment = Deployment {
            project: project.clone(),
            name: name.clone(),
            digest: digest.clone(),
            exports: exports.clone(),
            bytes,
            deployed_at: format_timestamp(self.streams.now_ms()),
            mode,
            versions_kept: self.config.processors.max_versions_per_component,
        };
        let new_version = self
            .streams
            .storage()
            .submit(WriteOp::Deploy(deployment))
            .await
            .map_err(|_| Error::internal("the storage writer stopped"))?
            .map_err(|e| Error::internal(format!("storing the component failed: {e}")))?
            == 1;
        // Compiled once per digest on this host, below requests; its first
        // wake or call waits for it (not counted against its timeout).
        let runtime = self.streams.wasm_runtime();
        let (storage, stored) = (self.streams.storage().clone(), digest.clone());
        runtime.compile_in_background(&digest, move || storage.component_bytes(&stored));
        let compiling = runtime.is_compiling(&digest);
        // Ingest held on a reactor that could not run may go on now.
        self.ingest.retry_now();
        let mut deployed = Deployed {
            name: name.clone(),
            digest: digest.clone(),
            exports,
            compiling,
            unchanged: !new_version,
            resumed_subscriptions: Vec::new(),
            retrying_subscriptions: Vec::new(),
            refolding: false,
            refolding_streams: None,
            shadowing: None,
        };
        // Any deploy replaces the shadows folding now.
        self.streams
            .executors()
            .shadows
            .stop_component(&project, &name);
        if mode.is_shadow() {
            let timeout_ms = self.config.delivery.timeout_ms;
            let paths =
                crate::rollout::shadow::start(&self.streams, &project, &name, &digest, timeout_ms)
                    .await
                    .map_err(|e| Error::internal(format!("starting the shadow failed: {e:#}")))?;
            deployed.unchanged = false;
            deployed.shadowing = Some(paths);
            return Ok(deployed);
        }
        if new_version {
            let streams = &self.streams;
            deployed.resumed_subscriptions =
                crate::rollout::versions::resume_halted(streams, &project, &name, &digest).await?;
            deployed.retrying_subscriptions =
                crate::rollout::versions::retry_failing(streams, &project, &name).await;
        }
        if mode.refolds() {
            let timeout_ms = self.config.delivery.timeout_ms;
            let paths =
                crate::rollout::refold::start(&self.streams, &project, &name, &digest, timeout_ms)
                    .await
                    .map_err(|e| Error::internal(format!("starting the refold failed: {e:#}")))?;
            deployed.refolding = true;
            deployed.refolding_streams = Some(paths);
        }
        Ok(deployed)
    }

    /// The components deployed in `project`, by name.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "counter", std::fs::read(guests.join("counter.wasm"))?)).await?;
    /// let listed = host.components("acme").await?;
    /// assert_eq!(listed.len(), 1);
    /// assert_eq!(listed[0].name, "counter");
    /// # Ok(()) }
    /// ```
    pub async fn components(&self, project: &str) -> Result<Vec<Component>, Error> {
        crate::stream::Namespace::project(project)?;
        let p = project.to_string();
        let rows = self
            .read_storage("listing components", move |s| s.components(&p))
            .await?;
        let runtime = self.streams.wasm_runtime();
        Ok(rows
            .into_iter()
            .map(|r| Component::from_row(r, runtime))
            .collect())
    }

    /// Component `name` of `project`, or `component-not-found`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "counter", std::fs::read(guests.join("counter.wasm"))?)).await?;
    /// let counter = host.component("acme", "counter").await?;
    /// assert!(counter.exports.iter().any(|e| e == "fold"), "{:?}", counter.exports);
    /// let missing = host.component("acme", "ghost").await.unwrap_err();
    /// assert_eq!(missing.code, "component-not-found");
    /// # Ok(()) }
    /// ```
    pub async fn component(&self, project: &str, name: &str) -> Result<Component, Error> {
        let (p, n) = (project.to_string(), name.to_string());
        self.read_storage("reading the component", move |s| s.component(&p, &n))
            .await?
            .map(|r| Component::from_row(r, self.streams.wasm_runtime()))
            .ok_or_else(|| component_not_found(project, name))
    }

    /// The bytes of component `name`'s current version (to run a repro
    /// command locally), or `component-not-found`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "counter", std::fs::read(guests.join("counter.wasm"))?)).await?;
    /// let bytes = host.component_bytes("acme", "counter").await?;
    /// assert_eq!(bytes, std::fs::read(guests.join("counter.wasm"))?);
    /// # Ok(()) }
    /// ```
    pub async fn component_bytes(&self, project: &str, name: &str) -> Result<Vec<u8>, Error> {
        let (p, n) = (project.to_string(), name.to_string());
        self.read_storage("reading the component", move |s| {
            match s.component(&p, &n)? {
                Some(row) => Ok(Some(s.component_bytes(&row.digest)?)),
                None => Ok(None),
            }
        })
        .await?
        .ok_or_else(|| component_not_found(project, name))
    }

    /// Component `name`'s versions, newest first, or `component-not-found`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "counter", std::fs::read(guests.join("counter.wasm"))?)).await?;
    /// use streamhost::Deploy;
    ///
    /// host.deploy(Deploy::new("acme", "counter", std::fs::read(guests.join("minimal.wasm"))?)).await?;
    /// let versions = host.component_versions("acme", "counter").await?;
    /// assert_eq!(versions.versions.len(), 2); // newest first
    /// # Ok(()) }
    /// ```
    pub async fn component_versions(
        &self,
        project: &str,
        name: &str,
    ) -> Result<ComponentVersions, Error> {
        let (p, n) = (project.to_string(), name.to_string());
        let rows = self
            .read_storage("reading the versions", move |s| {
                s.component_versions(&p, &n)
            })
            .await?;
        if rows.is_empty() {
            return Err(component_not_found(project, name));
        }
        Ok(ComponentVersions {
            name: name.to_string(),
            versions: rows
                .into_iter()
                .map(|(digest, deployed_at)| Version {
                    digest,
                    deployed_at,
                })
                .collect(),
        })
    }

    /// Refuses (`400 invalid`) a `subscription-configured` event of
    /// `events` whose processor-wake or reactor receiver names a deployed
    /// component that does not export what it needs
    /// ([`crate::subscription::check_exports`]); one not deployed yet
    /// passes (see `undeployed_receivers`).
    pub(crate) async fn refuse_wrong_receivers(
        &self,
        address: &StreamAddress,
        events: &[crate::stream::EventInput],
    ) -> Result<(), Error> {
        let Some(project) = address.namespace.project_id().map(str::to_string) else {
            return Ok(());
        };
        let needed: Vec<(String, &'static str)> = events
            .iter()
            .filter_map(|e| configured(&e.event_type, e.payload.as_ref()?))
            .filter_map(|config| config.receiver.needed_export())
            .collect();
        if needed.is_empty() {
            return Ok(());
        }
        let storage = self.streams.storage().clone();
        tokio::task::spawn_blocking(move || {
            for (component, export) in needed {
                let row = storage.component(&project, &component).map_err(|e| {
                    Error::internal(format!("reading component {component:?}: {e:#}"))
                })?;
                if let Some(row) = row {
                    crate::subscription::check_exports(&component, export, &row.exports)
                        .map_err(Error::invalid)?;
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::internal(format!("checking the receivers panicked: {e}")))?
    }

    /// Warnings for subscriptions just configured whose processor or ITX
    /// component is not deployed: accepted (it may be deployed later, and then
    /// the subscription starts or resumes), but said at once.
    pub(crate) async fn undeployed_receivers(
        &self,
        address: &StreamAddress,
        events: &[crate::stream::Event],
    ) -> Vec<String> {
        let Some(project) = address.namespace.project_id().map(str::to_string) else {
            return Vec::new();
        };
        let named: Vec<(String, String)> = events
            .iter()
            .filter(|e| !e.is_copy())
            .filter_map(|e| {
                let config = configured(&e.event_type, &e.payload)?;
                let component = config.receiver.component()?;
                let key = config.subscription_key.unwrap_or_default();
                Some((key, component))
            })
            .collect();
        if named.is_empty() {
            return Vec::new();
        }
        let storage = self.streams.storage().clone();
        tokio::task::spawn_blocking(move || {
            named
                .into_iter()
                .filter(|(_, c)| matches!(storage.component(&project, c), Ok(None)))
                .map(|(key, c)| {
                    format!(
                        "subscription {key:?} calls component {c:?}, which is not deployed in project \
                         {project:?}: it fails (and retries, then halts) until it is; deploying it \
                         resumes a halted subscription"
                    )
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }
}

/// The configuration a `subscription-configured` event carries (`None` for
/// any other event, or a payload that is not one).
fn configured(
    event_type: &str,
    payload: &serde_json::Map<String, Value>,
) -> Option<crate::subscription::SubscriptionConfig> {
    if event_type != types::SUBSCRIPTION_CONFIGURED {
        return None;
    }
    serde_json::from_value(Value::Object(payload.clone())).ok()
}
