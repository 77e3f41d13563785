//! Workflow versions held in memory: a run keeps the definition version it started with, and
//! versions never change once stored, so caching them needs no invalidation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ax_core::ids::WorkflowId;
use ax_core::spec::{TaskSpec, WorkflowSpec};
use ax_store::{Store, StoreError};

pub struct VersionedSpec {
    pub name: String,
    pub spec: WorkflowSpec,
    tasks: HashMap<String, usize>,
}

impl VersionedSpec {
    pub fn task(&self, name: &str) -> Option<&TaskSpec> {
        self.tasks.get(name).map(|&index| &self.spec.tasks[index])
    }
}

pub struct SpecCache {
    store: Arc<Store>,
    versions: Mutex<HashMap<(WorkflowId, u32), Arc<VersionedSpec>>>,
}

impl SpecCache {
    pub fn new(store: Arc<Store>) -> Self {
        SpecCache {
            store,
            versions: Mutex::new(HashMap::new()),
        }
    }

    pub async fn get(
        &self,
        id: WorkflowId,
        version: u32,
    ) -> Result<Arc<VersionedSpec>, StoreError> {
        if let Some(found) = self.lock().get(&(id, version)) {
            return Ok(found.clone());
        }
        let record = self
            .store
            .get_workflow_version(id, version)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("workflow {id} version {version}")))?;
        let tasks = record
            .spec
            .tasks
            .iter()
            .enumerate()
            .map(|(index, task)| (task.name.clone(), index))
            .collect();
        let versioned = Arc::new(VersionedSpec {
            name: record.name,
            spec: record.spec,
            tasks,
        });
        self.lock().insert((id, version), versioned.clone());
        Ok(versioned)
    }

    /// The version when it is in memory already (for callers that cannot wait on the store).
    pub fn cached(&self, id: WorkflowId, version: u32) -> Option<Arc<VersionedSpec>> {
        self.lock().get(&(id, version)).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(WorkflowId, u32), Arc<VersionedSpec>>> {
        self.versions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
