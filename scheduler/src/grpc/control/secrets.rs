//! The secret calls (admin), and the check that a workflow names only secrets it may use.
//!
//! A secret belongs to an app or is global (`ax_core::app_scope`). A token scoped to an app
//! sets, lists and deletes that app's secrets only (and sees the global ones' names, which its
//! workflows may use); an unscoped admin manages the global ones and any app's. To a scoped
//! caller, another app's secret of a name reads exactly as no secret of that name.

use std::collections::BTreeSet;

use ax_core::app_scope::{SecretAppError, managed_secret_app, secret_listing, secret_lookup};
use ax_core::spec::WorkflowSpec;
use ax_proto::v1 as pb;
use ax_store::SecretRecord;
use tonic::{Response, Status};

use super::ControlApi;
use super::access::Call;
use crate::clock::now_ms;
use crate::grpc::convert::store_status;
use crate::secrets::MAX_VALUE_BYTES;

fn app_refused(err: SecretAppError) -> Status {
    match err {
        SecretAppError::Invalid(_) => Status::invalid_argument(err.to_string()),
        SecretAppError::OutOfScope { .. } => Status::permission_denied(err.to_string()),
    }
}

/// The audit row's target: `secret/NAME` for a global secret, `secret/APP/NAME` for an app's.
fn target(app: &str, name: &str) -> String {
    if app.is_empty() {
        format!("secret/{name}")
    } else {
        format!("secret/{app}/{name}")
    }
}

/// A secret as people read it in a message: `"db"`, or `"db" of app sales`.
fn described(app: &str, name: &str) -> String {
    if app.is_empty() {
        format!("secret {name:?}")
    } else {
        format!("secret {name:?} of app {app}")
    }
}

impl ControlApi {
    /// Refuses a workflow that names a secret it may not use: one that neither its app nor the
    /// global secrets hold, naming the task, the variable and the secret. Another app's secret
    /// of that name does not count, and to a scoped caller the refusal reads the same whether
    /// one exists or not.
    pub(super) async fn check_secret_references(
        &self,
        call: &Call,
        spec: &WorkflowSpec,
    ) -> Result<(), Status> {
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
        let stored = self.node.store.list_secrets().await.map_err(store_status)?;
        let usable: BTreeSet<&str> = stored
            .iter()
            .filter(|record| secret_lookup(&spec.app).any(|app| app == record.app))
            .map(|record| record.name.as_str())
            .collect();
        let whose = if spec.app.is_empty() {
            " (a workflow without an app names global secrets only)".to_string()
        } else {
            format!(" in app {} or globally", spec.app)
        };
        let missing: Vec<String> = wanted
            .iter()
            .filter(|(_, _, secret)| !usable.contains(*secret))
            .map(|(task, variable, secret)| {
                let mut why = format!(
                    "task {task}: env {variable} names secret {secret:?}, which does not \
                     exist{whose}"
                );
                // An unscoped caller may see every app's secrets: it is told where one is.
                if call.app_scope().is_none() {
                    let elsewhere: Vec<&str> = stored
                        .iter()
                        .filter(|record| record.name == *secret)
                        .map(|record| record.app.as_str())
                        .collect();
                    if !elsewhere.is_empty() {
                        why.push_str(&format!(
                            " (app {} has one; a workflow names its own app's secrets and \
                             global ones only)",
                            elsewhere.join(", app ")
                        ));
                    }
                }
                why
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let create = if spec.app.is_empty() {
            "axctl secret set NAME".to_string()
        } else {
            format!("axctl secret set NAME --app {}", spec.app)
        };
        Err(Status::invalid_argument(format!(
            "workflow {}: {} (create it first: {create})",
            spec.name,
            missing.join("; ")
        )))
    }

    pub(super) async fn secret_set(
        &self,
        call: &Call,
        request: pb::SetSecretRequest,
    ) -> Result<Response<pb::Secret>, Status> {
        let app = managed_secret_app(call.app_scope(), &request.app).map_err(app_refused)?;
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
        let sealed = key.seal(&app, name, &request.value);
        let by = match &call.identity {
            Some(identity) => identity.token.clone(),
            None => request.actor.trim().to_string(),
        };
        let record = self
            .node
            .store
            .put_secret(&app, name, &sealed, now_ms(), &by)
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
            target(&app, name),
            String::new(),
            &call.caller,
        )
        .await;
        Ok(Response::new(secret_message(&record)))
    }

    pub(super) async fn secret_list(
        &self,
        call: &Call,
        request: pb::ListSecretsRequest,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        let listing = secret_listing(call.app_scope(), &request.app).map_err(app_refused)?;
        let secrets = self.node.store.list_secrets().await.map_err(store_status)?;
        Ok(Response::new(pb::ListSecretsResponse {
            secrets: secrets
                .iter()
                .filter(|record| listing.shows(&record.app))
                .map(secret_message)
                .collect(),
        }))
    }

    pub(super) async fn secret_delete(
        &self,
        call: &Call,
        request: pb::DeleteSecretRequest,
    ) -> Result<Response<pb::Secret>, Status> {
        let app = managed_secret_app(call.app_scope(), &request.app).map_err(app_refused)?;
        let name = request.name.trim();
        let secrets = self.node.store.list_secrets().await.map_err(store_status)?;
        let Some(record) = secrets
            .iter()
            .find(|r| r.app == app && r.name == name)
            .cloned()
        else {
            return Err(Status::not_found(format!(
                "{} not found",
                described(&app, name)
            )));
        };
        // The workflows whose latest version gets this very secret for a name: an app's
        // workflows for an app's secret; for a global one, those of apps without their own.
        let resolves_here = |workflow_app: &str| {
            secret_lookup(workflow_app).find(|candidate| {
                secrets
                    .iter()
                    .any(|r| r.app == *candidate && r.name == name)
            }) == Some(app.as_str())
        };
        let candidates = if app.is_empty() {
            None
        } else {
            Some(app.as_str())
        };
        let users: Vec<String> = self
            .node
            .store
            .list_workflows(candidates)
            .await
            .map_err(store_status)?
            .into_iter()
            .filter(|w| {
                resolves_here(&w.spec.app)
                    && w.spec
                        .tasks
                        .iter()
                        .any(|t| t.secret_env.values().any(|s| s == name))
            })
            .map(|w| w.name)
            .collect();
        if !users.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{} is named by workflow {}: apply them without it first",
                described(&app, name),
                users.join(", ")
            )));
        }
        self.node
            .store
            .delete_secret(&app, name)
            .await
            .map_err(store_status)?;
        self.node.secrets.forget();
        self.audit(
            &request.actor,
            "secret_delete",
            target(&app, name),
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
        app: record.app.clone(),
    }
}
