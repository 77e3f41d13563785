//! The secret calls (admin), and the check that a workflow names only secrets that exist.

use std::collections::BTreeSet;

use ax_core::spec::WorkflowSpec;
use ax_proto::v1 as pb;
use ax_store::SecretRecord;
use tonic::{Response, Status};

use super::ControlApi;
use super::access::Call;
use crate::clock::now_ms;
use crate::grpc::convert::store_status;
use crate::secrets::MAX_VALUE_BYTES;

impl ControlApi {
    /// Refuses a workflow that names a secret the store does not hold, naming the task, the
    /// variable and the secret.
    pub(super) async fn check_secrets_exist(&self, spec: &WorkflowSpec) -> Result<(), Status> {
        let wanted: Vec<(&str, &str, &str)> = spec
            .tasks
            .iter()
            .flat_map(|task| {
                task.secret_env.iter().map(|(variable, secret)| {
                    (task.name.as_str(), variable.as_str(), secret.as_str())
                })
            })
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let stored: BTreeSet<String> = self
            .node
            .store
            .list_secrets()
            .await
            .map_err(store_status)?
            .into_iter()
            .map(|record| record.name)
            .collect();
        let missing: Vec<String> = wanted
            .iter()
            .filter(|(_, _, secret)| !stored.contains(*secret))
            .map(|(task, variable, secret)| {
                format!("task {task}: env {variable} names secret {secret:?}, which does not exist")
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "workflow {}: {} (create it first: axctl secret set NAME)",
            spec.name,
            missing.join("; ")
        )))
    }

    pub(super) async fn secret_set(
        &self,
        call: &Call,
        request: pb::SetSecretRequest,
    ) -> Result<Response<pb::Secret>, Status> {
        call.unscoped("managing secrets")?;
        let name = request.name.trim();
        if !ax_core::spec::is_valid_name(name) {
            return Err(Status::invalid_argument(format!(
                "secret name {name:?}: expected 1 to 64 of a-z, 0-9, '_', '.', '-', starting \
                 with a letter or digit"
            )));
        }
        if request.value.is_empty() {
            return Err(Status::invalid_argument(format!(
                "secret {name:?}: the value is empty"
            )));
        }
        if request.value.len() > MAX_VALUE_BYTES {
            return Err(Status::invalid_argument(format!(
                "secret {name:?}: the value is {} bytes; the limit is {MAX_VALUE_BYTES}",
                request.value.len()
            )));
        }
        let key = self
            .node
            .secrets
            .key()
            .map_err(|err| Status::failed_precondition(err.to_string()))?;
        let sealed = key.seal(name, &request.value);
        let by = match &call.identity {
            Some(identity) => identity.token.clone(),
            None => request.actor.trim().to_string(),
        };
        let record = self
            .node
            .store
            .put_secret(name, &sealed, now_ms(), &by)
            .await
            .map_err(store_status)?;
        self.node.secrets.forget();
        let action = if record.created_at == record.updated_at {
            "secret_create"
        } else {
            "secret_update"
        };
        // The row says which secret changed, never its value.
        self.audit(
            &request.actor,
            action,
            format!("secret/{name}"),
            String::new(),
            &call.caller,
        )
        .await;
        Ok(Response::new(secret_message(&record)))
    }

    pub(super) async fn secret_list(
        &self,
        call: &Call,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        call.unscoped("managing secrets")?;
        let secrets = self.node.store.list_secrets().await.map_err(store_status)?;
        Ok(Response::new(pb::ListSecretsResponse {
            secrets: secrets.iter().map(secret_message).collect(),
        }))
    }

    pub(super) async fn secret_delete(
        &self,
        call: &Call,
        request: pb::DeleteSecretRequest,
    ) -> Result<Response<pb::Secret>, Status> {
        call.unscoped("managing secrets")?;
        let name = request.name.trim();
        let secrets = self.node.store.list_secrets().await.map_err(store_status)?;
        let Some(record) = secrets.into_iter().find(|r| r.name == name) else {
            return Err(Status::not_found(format!("secret {name:?} not found")));
        };
        let users: Vec<String> = self
            .node
            .store
            .list_workflows(None)
            .await
            .map_err(store_status)?
            .into_iter()
            .filter(|w| {
                w.spec
                    .tasks
                    .iter()
                    .any(|t| t.secret_env.values().any(|s| s == name))
            })
            .map(|w| w.name)
            .collect();
        if !users.is_empty() {
            return Err(Status::failed_precondition(format!(
                "secret {name:?} is named by workflow {}: apply them without it first",
                users.join(", ")
            )));
        }
        self.node
            .store
            .delete_secret(name)
            .await
            .map_err(store_status)?;
        self.node.secrets.forget();
        self.audit(
            &request.actor,
            "secret_delete",
            format!("secret/{name}"),
            String::new(),
            &call.caller,
        )
        .await;
        Ok(Response::new(secret_message(&record)))
    }
}

fn secret_message(record: &SecretRecord) -> pb::Secret {
    pb::Secret {
        name: record.name.clone(),
        created_at_ms: record.created_at,
        updated_at_ms: record.updated_at,
        updated_by: record.updated_by.clone(),
    }
}
