//! The processor instances being refolded on this host ([`Refolds`]), and
//! the guarded switch to a new version's state that a refold and a shadow's
//! promotion both make ([`switched`]). The refold itself is
//! `streamhost::rollout::refold` in the host.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use streamhost_core::delivery::Failure;
use streamhost_storage::{Checkpoint, WriteOp};

/// The processor instances being refolded: (project, path, component).
#[derive(Clone, Default)]
pub struct Refolds(Arc<Mutex<HashSet<(String, String, String)>>>);

impl Refolds {
    pub fn contains(&self, project: &str, path: &str, component: &str) -> bool {
        self.0.lock().expect("refolds").contains(&(
            project.to_string(),
            path.to_string(),
            component.to_string(),
        ))
    }

    /// Marks an instance as refolding; `false` if it was already.
    pub fn mark(&self, key: (String, String, String)) -> bool {
        self.0.lock().expect("refolds").insert(key)
    }

    /// The instance's refold is over.
    pub fn clear(&self, key: &(String, String, String)) {
        self.0.lock().expect("refolds").remove(key);
    }
}

/// Submits a switch to a new version's state (a refold's, a shadow's
/// promotion), guarded by the live checkpoint it replaces: `false` when a
/// wake moved that checkpoint first (fold the rest and try again).
pub fn switched(
    storage: &streamhost_storage::Storage,
    switch: Checkpoint,
) -> Result<bool, Failure> {
    match storage.submit(WriteOp::Checkpoint(switch)).blocking_recv() {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(e)) if e.refusal() == Some(&streamhost_storage::Refusal::CheckpointMoved) => {
            Ok(false)
        }
        Ok(Err(e)) => Err(Failure::new(e.message().to_string(), true)),
        Err(_) => Err(Failure::new("the storage writer stopped", true)),
    }
}
