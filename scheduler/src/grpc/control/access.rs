//! The caller of a control call (for audit rows and app scopes) and the token calls.
//!
//! A token scoped to an app sees that app's workflows, runs, instances and secrets only: to
//! it, anything else answers exactly as a missing object does, so a scoped caller cannot learn
//! which names exist elsewhere. Roles are checked before a call reaches a handler (`auth::AuthLayer`).

use ax_core::access::{Identity, Role};
use ax_core::ids::{InstanceId, RunId};
use ax_core::worker_scope::WorkerScope;
use ax_proto::v1 as pb;
use ax_store::{Caller, InstanceRecord, RunRecord, TokenRecord};
use tonic::{Request, Response, Status};

use super::ControlApi;
use crate::auth::tokens::{self, CreateError, TokenRequest};
use crate::clock::now_ms;
use crate::grpc::convert::store_status;

/// Who made a call, as handlers need it.
pub(crate) struct Call {
    pub caller: Caller,
    pub identity: Option<Identity>,
}

impl Call {
    pub fn of<T>(request: &Request<T>) -> Call {
        let identity = request.extensions().get::<Identity>().cloned();
        Call {
            caller: Caller {
                remote: request
                    .remote_addr()
                    .map(|addr| addr.to_string())
                    .unwrap_or_default(),
                token: identity
                    .as_ref()
                    .map(|i| i.token.clone())
                    .unwrap_or_default(),
            },
            identity,
        }
    }

    /// The app this caller is confined to, if any.
    pub fn app_scope(&self) -> Option<&str> {
        self.identity.as_ref().and_then(|i| i.app.as_deref())
    }

    /// `Ok` when the caller may see an object of `app`; else the object's own not-found error.
    pub fn sees(&self, app: &str, not_found: impl FnOnce() -> String) -> Result<(), Status> {
        match &self.identity {
            Some(identity) if !identity.sees_app(app) => Err(Status::not_found(not_found())),
            _ => Ok(()),
        }
    }

    /// Refuses a scoped caller what spans every app (the audit trail, tokens).
    pub fn unscoped(&self, what: &str) -> Result<(), Status> {
        match self.app_scope() {
            Some(app) => Err(Status::permission_denied(format!(
                "{what} spans every app: it needs a token not scoped to one (this one is scoped \
                 to {app:?})"
            ))),
            None => Ok(()),
        }
    }
}

impl ControlApi {
    /// The app a run's workflow version belongs to.
    pub(super) async fn app_of_run(&self, run: &RunRecord) -> Result<String, Status> {
        let versioned = self
            .node
            .specs
            .get(run.workflow_id, run.workflow_version)
            .await
            .map_err(store_status)?;
        Ok(versioned.spec.app.clone())
    }

    /// The run `id`, if it exists and the caller may see it.
    pub(super) async fn visible_run(&self, call: &Call, id: RunId) -> Result<RunRecord, Status> {
        let not_found = || format!("run {id} not found");
        let run = self
            .node
            .store
            .get_run(id)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(not_found()))?;
        if call.app_scope().is_some() {
            call.sees(&self.app_of_run(&run).await?, not_found)?;
        }
        Ok(run)
    }

    /// The instance `id`, if it exists and the caller may see it.
    pub(super) async fn visible_instance(
        &self,
        call: &Call,
        id: InstanceId,
    ) -> Result<InstanceRecord, Status> {
        let not_found = || format!("instance {id} not found");
        let instance = self
            .node
            .store
            .get_instance(id)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(not_found()))?;
        if call.app_scope().is_some() {
            let run = self
                .node
                .store
                .get_run(instance.run_id)
                .await
                .map_err(store_status)?
                .ok_or_else(|| Status::not_found(not_found()))?;
            call.sees(&self.app_of_run(&run).await?, not_found)?;
        }
        Ok(instance)
    }

    /// Refuses a scoped caller a workflow file of another app, or one whose name another
    /// app's workflow holds. Workflow names are one namespace across apps, so the second
    /// refusal cannot read as nothing: it says the name is taken, and nothing else of the
    /// workflow that holds it (not even its app).
    pub(super) async fn check_apply_scope(
        &self,
        call: &Call,
        spec: &ax_core::spec::WorkflowSpec,
    ) -> Result<(), Status> {
        let Some(scope) = call.app_scope() else {
            return Ok(());
        };
        if spec.app != scope {
            return Err(Status::permission_denied(format!(
                "workflow {:?} of app {:?} cannot be applied with a token scoped to app {scope:?}",
                spec.name, spec.app
            )));
        }
        let existing = self
            .node
            .store
            .get_workflow(&spec.name)
            .await
            .map_err(store_status)?;
        if existing.is_some_and(|record| record.spec.app != scope) {
            return Err(Status::permission_denied(format!(
                "workflow name {:?} is taken by a workflow outside app {scope:?} (names are \
                 shared by every app): choose another name",
                spec.name
            )));
        }
        Ok(())
    }

    pub(super) fn identity_of(&self, call: &Call) -> pb::Identity {
        match &call.identity {
            Some(identity) => pb::Identity {
                token: identity.token.clone(),
                role: identity.role.to_string(),
                app: identity.app.clone().unwrap_or_default(),
                authentication: true,
            },
            None => pb::Identity {
                authentication: self.node.gate.mode() == crate::auth::AuthMode::Tokens,
                ..pb::Identity::default()
            },
        }
    }

    pub(super) async fn token_create(
        &self,
        call: &Call,
        request: pb::CreateTokenRequest,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        call.unscoped("managing tokens")?;
        let role: Role = request.role.parse().map_err(Status::invalid_argument)?;
        if request.lifetime_ms < 0 {
            return Err(Status::invalid_argument("lifetime_ms must not be negative"));
        }
        let app = request.app.trim();
        let worker = if role == Role::Worker {
            // A worker's apps are its scope's; `app` counts as one of them.
            let mut apps = request.worker_apps.clone();
            if !app.is_empty() {
                apps.push(app.to_string());
            }
            Some(
                WorkerScope::parse(&request.worker_ids, &apps, &request.worker_labels)
                    .map_err(Status::invalid_argument)?,
            )
        } else if !request.worker_ids.is_empty()
            || !request.worker_apps.is_empty()
            || !request.worker_labels.is_empty()
        {
            return Err(Status::invalid_argument(format!(
                "worker ids, apps and labels belong to worker tokens, not to a {role} token"
            )));
        } else {
            None
        };
        let app = if role == Role::Worker { "" } else { app };
        let now = now_ms();
        let created_by = match &call.identity {
            Some(identity) => identity.token.clone(),
            None => actor_or_anonymous(&request.actor),
        };
        let (secret, stored) = tokens::create(
            self.node.store.as_ref(),
            TokenRequest {
                name: request.name.clone(),
                role,
                app: (!app.is_empty()).then(|| app.to_string()),
                lifetime_ms: (request.lifetime_ms > 0).then_some(request.lifetime_ms),
                created_by,
                worker,
            },
            now,
        )
        .await
        .map_err(|err| match err {
            CreateError::Invalid(why) => Status::invalid_argument(why),
            CreateError::Taken(_) => Status::already_exists(err.to_string()),
            CreateError::Store(err) => store_status(err),
        })?;
        let mut detail = format!("role {}", stored.role);
        if let Some(app) = &stored.app {
            detail.push_str(&format!(", app {app}"));
        }
        if let Some(scope) = &stored.worker {
            detail.push_str(&format!(", {}", scope.describe()));
        }
        if let Some(at) = stored.expires_at {
            detail.push_str(&format!(", expires {}", ax_core::rfc3339(at)));
        }
        self.audit(
            &request.actor,
            "token_create",
            format!("token/{}", stored.name),
            detail,
            &call.caller,
        )
        .await;
        let record = TokenRecord {
            name: stored.name,
            role: stored.role,
            app: stored.app,
            created_at: stored.created_at,
            created_by: stored.created_by,
            expires_at: stored.expires_at,
            revoked_at: None,
            worker: stored.worker,
        };
        Ok(Response::new(pb::CreateTokenResponse {
            token: Some(token_message(&record)),
            secret,
        }))
    }

    pub(super) async fn token_list(
        &self,
        call: &Call,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        call.unscoped("managing tokens")?;
        let tokens = self.node.store.list_tokens().await.map_err(store_status)?;
        Ok(Response::new(pb::ListTokensResponse {
            tokens: tokens.iter().map(token_message).collect(),
        }))
    }

    pub(super) async fn token_revoke(
        &self,
        call: &Call,
        request: pb::RevokeTokenRequest,
    ) -> Result<Response<pb::Token>, Status> {
        call.unscoped("managing tokens")?;
        let record = self
            .node
            .store
            .revoke_token(&request.name, now_ms())
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("token {:?} not found", request.name)))?;
        // This node stops honouring it at once; the others within the gate's cache time.
        self.node.gate.forget_cached();
        self.audit(
            &request.actor,
            "token_revoke",
            format!("token/{}", record.name),
            String::new(),
            &call.caller,
        )
        .await;
        Ok(Response::new(token_message(&record)))
    }
}

fn actor_or_anonymous(actor: &str) -> String {
    match actor.trim() {
        "" => "anonymous".into(),
        actor => actor.into(),
    }
}

fn token_message(record: &TokenRecord) -> pb::Token {
    pb::Token {
        name: record.name.clone(),
        role: record.role.to_string(),
        app: record.app.clone().unwrap_or_default(),
        created_at_ms: record.created_at,
        created_by: record.created_by.clone(),
        expires_at_ms: record.expires_at.unwrap_or(0),
        revoked_at_ms: record.revoked_at.unwrap_or(0),
        worker_ids: record.worker.as_ref().map_or_else(Vec::new, |scope| {
            scope.ids.iter().map(|id| id.as_str().to_string()).collect()
        }),
        worker_apps: record
            .worker
            .as_ref()
            .map_or_else(Vec::new, |scope| scope.apps.iter().cloned().collect()),
        worker_labels: record
            .worker
            .as_ref()
            .map_or_else(Vec::new, |scope| scope.label_list()),
    }
}
