//! An in-process `ControlService` with canned data that records what it was asked. Shared by the
//! binary's tests (ctl/tests/cli.rs) and the `dev --run` unit test (via `#[path]`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax_proto::v1 as pb;
use pb::control_service_server::{ControlService, ControlServiceServer};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status};

/// The first run id the fake hands out; runs count up from here.
pub const FIRST_RUN_ID: i64 = 100;

pub struct FakeRun {
    pub run: pb::Run,
    pub polls: u32,
    pub ends_after: u32,
    pub final_state: pb::RunState,
}

pub struct State {
    /// Method names in call order.
    pub calls: Vec<String>,
    pub applies: Vec<pb::ApplyWorkflowRequest>,
    pub triggers: Vec<pb::TriggerWorkflowRequest>,
    pub list_runs: Vec<pb::ListRunsRequest>,
    pub workflows: Vec<pb::Workflow>,
    pub runs: Vec<FakeRun>,
    pub instances: Vec<pb::Instance>,
    pub logs: HashMap<i64, Vec<pb::StoredLogLine>>,
    pub workers: Vec<pb::WorkerInfo>,
    pub nodes: Vec<pb::NodeInfo>,
    /// Now on the store's clock, as `ListNodes` answers it.
    pub store_now_ms: i64,
    /// The store's schema as `ListNodes` answers it: release, migration, oldest release.
    pub schema: (String, i64, String),
    /// New runs end in this state after this many GetRun polls.
    pub run_script: (u32, pb::RunState),
    pub idempotency: HashMap<String, i64>,
    /// What GetDag, ExplainWorkflow and ListAudit answer, and what they were asked.
    pub views: Views,
    pub backfills: Vec<pb::BackfillWorkflowRequest>,
    pub purges: Vec<pb::PurgeRunsRequest>,
    pub set_applies: Vec<pb::ApplyWorkflowsRequest>,
    pub deletes: Vec<pb::DeleteWorkflowRequest>,
    /// TriggerWorkflow refuses this many calls for load (the bound `Overloaded` says), then
    /// answers as usual.
    pub refuse_triggers: (u32, Option<pb::Overloaded>),
}

#[derive(Default)]
pub struct Views {
    pub dag: Option<pb::Dag>,
    pub explanation: Option<pb::Explanation>,
    pub audit: Vec<pb::AuditEntry>,
    pub dag_requests: Vec<pb::GetDagRequest>,
    pub explain_requests: Vec<pb::ExplainWorkflowRequest>,
    pub audit_requests: Vec<pb::ListAuditRequest>,
}

impl Default for State {
    fn default() -> Self {
        State {
            calls: Vec::new(),
            applies: Vec::new(),
            triggers: Vec::new(),
            list_runs: Vec::new(),
            workflows: Vec::new(),
            runs: Vec::new(),
            instances: Vec::new(),
            logs: HashMap::new(),
            workers: Vec::new(),
            nodes: Vec::new(),
            store_now_ms: 0,
            schema: Default::default(),
            run_script: (3, pb::RunState::Success),
            idempotency: HashMap::new(),
            views: Views::default(),
            backfills: Vec::new(),
            purges: Vec::new(),
            set_applies: Vec::new(),
            deletes: Vec::new(),
            refuse_triggers: (0, None),
        }
    }
}

#[derive(Clone, Default)]
pub struct Fake {
    pub state: Arc<Mutex<State>>,
}

impl Fake {
    /// Serves on 127.0.0.1 with a free port and returns the URL to reach it.
    pub async fn start(self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ControlServiceServer::new(self))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    pub fn calls(&self) -> Vec<String> {
        self.with(|s| s.calls.clone())
    }

    fn record(&self, method: &str) {
        self.with(|s| s.calls.push(method.to_string()));
    }
}

pub fn workflow(name: &str, version: u32) -> pb::Workflow {
    pb::Workflow {
        name: name.into(),
        app: "data".into(),
        owner: "ops".into(),
        version,
        schedule: Some(pb::Schedule {
            trigger: pb::TriggerKind::Cron as i32,
            cron: "0 2 * * *".into(),
            timezone: "Europe/Paris".into(),
            misfire: "fire_once".into(),
            overlap: "allow".into(),
            ..Default::default()
        }),
        tasks: vec![
            pb::TaskSpec {
                name: "extract".into(),
                command: "./extract.sh".into(),
                retries: 2,
                timeout_ms: 600_000,
                ..Default::default()
            },
            pb::TaskSpec {
                name: "load".into(),
                command: "./load.sh".into(),
                upstream: vec!["extract".into()],
                ..Default::default()
            },
        ],
        created_at_ms: 1_700_000_000_000,
        updated_at_ms: 1_700_000_000_000,
        next_fires_ms: vec![1_700_010_000_000, 1_700_096_400_000],
        ..Default::default()
    }
}

pub fn instance(
    id: i64,
    run_id: i64,
    task: &str,
    state: pb::InstanceState,
    exit_code: Option<i32>,
) -> pb::Instance {
    pb::Instance {
        id,
        run_id,
        workflow: "etl".into(),
        task: task.into(),
        state: state as i32,
        attempt: 1,
        worker_id: "w1".into(),
        created_at_ms: 1_700_000_000_000 + id,
        started_at_ms: 1_700_000_001_000,
        finished_at_ms: 1_700_000_004_200,
        exit_code,
        attempts: vec![pb::Attempt {
            attempt: 1,
            state: state as i32,
            worker_id: "w1".into(),
            started_at_ms: 1_700_000_001_000,
            finished_at_ms: 1_700_000_004_200,
            exit_code,
            pid: 4242,
            log_lines: 2,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Stdout lines numbered from 1, except that lines starting with `!` are stderr.
pub fn lines(texts: &[&str]) -> Vec<pb::StoredLogLine> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let (stream, text) = match text.strip_prefix('!') {
                Some(rest) => (pb::LogStream::Stderr, rest),
                None => (pb::LogStream::Stdout, *text),
            };
            pb::StoredLogLine {
                seq: i as u64 + 1,
                stream: stream as i32,
                text: text.into(),
                at_ms: 1_700_000_001_000 + i as i64,
            }
        })
        .collect()
}

fn counts(run: &FakeRun) -> pb::InstanceCounts {
    let finished = run.polls >= run.ends_after;
    match (finished, run.final_state) {
        (false, _) if run.polls <= 1 => pb::InstanceCounts {
            waiting: 1,
            not_created: 1,
            ..Default::default()
        },
        (false, _) => pb::InstanceCounts {
            running: 1,
            not_created: 1,
            ..Default::default()
        },
        (true, pb::RunState::Success) => pb::InstanceCounts {
            success: 2,
            ..Default::default()
        },
        (true, pb::RunState::Cancelled) => pb::InstanceCounts {
            success: 1,
            cancelled: 1,
            ..Default::default()
        },
        (true, _) => pb::InstanceCounts {
            success: 1,
            failed: 1,
            ..Default::default()
        },
    }
}

/// Finds the line of `needle` in `source`, 1-based, like a real validator would.
fn line_of(source: &str, needle: &str) -> Option<usize> {
    source
        .lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
}

#[tonic::async_trait]
impl ControlService for Fake {
    async fn apply_workflow(
        &self,
        request: Request<pb::ApplyWorkflowRequest>,
    ) -> Result<Response<pb::ApplyWorkflowResponse>, Status> {
        self.record("ApplyWorkflow");
        let req = request.into_inner();
        self.with(|s| s.applies.push(req.clone()));
        if let Some(line) = line_of(&req.source, "nope") {
            return Err(Status::invalid_argument(format!(
                "{}:{line}: tasks.load.upstream: unknown task \"nope\"",
                req.source_name
            )));
        }
        let Some(name) = req
            .source
            .lines()
            .find_map(|l| l.strip_prefix("name:"))
            .map(|n| n.trim().to_string())
        else {
            return Err(Status::invalid_argument(format!(
                "{}:1: name: missing",
                req.source_name
            )));
        };
        let warnings = if req.source.contains("deprecated") {
            vec!["`schedule.cron_tz` is deprecated, use `schedule.timezone`".to_string()]
        } else {
            vec![]
        };
        let response = self.with(|s| {
            let existing = s.workflows.iter_mut().find(|w| w.name == name);
            let (outcome, workflow) = match (existing, req.dry_run) {
                (Some(w), true) => (pb::ApplyOutcome::Valid, w.clone()),
                (None, true) => (pb::ApplyOutcome::Valid, workflow(&name, 0)),
                (Some(w), false) if w.source == req.source => {
                    (pb::ApplyOutcome::Unchanged, w.clone())
                }
                (Some(w), false) => {
                    w.version += 1;
                    w.source = req.source.clone();
                    (pb::ApplyOutcome::Updated, w.clone())
                }
                (None, false) => {
                    let mut w = workflow(&name, 1);
                    w.source = req.source.clone();
                    s.workflows.push(w.clone());
                    (pb::ApplyOutcome::Created, w)
                }
            };
            pb::ApplyWorkflowResponse {
                workflow: Some(workflow),
                outcome: outcome as i32,
                warnings,
            }
        });
        Ok(Response::new(response))
    }

    /// Applies a set as the real one does, on the fake's workflows: each file's `name:` and
    /// `app:` lines; a file containing "nope" is refused at its line; all or nothing.
    async fn apply_workflows(
        &self,
        request: Request<pb::ApplyWorkflowsRequest>,
    ) -> Result<Response<pb::ApplyWorkflowsResponse>, Status> {
        self.record("ApplyWorkflows");
        let req = request.into_inner();
        self.with(|s| s.set_applies.push(req.clone()));
        let field = |source: &str, key: &str| {
            source
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
        };
        let mut errors = Vec::new();
        for file in &req.files {
            if let Some(line) = line_of(&file.source, "nope") {
                errors.push(format!(
                    "{}:{line}: tasks.load.upstream: unknown task \"nope\"",
                    file.source_name
                ));
            }
            if field(&file.source, "name:").is_none() {
                errors.push(format!("{}:1: name: missing", file.source_name));
            }
        }
        if !errors.is_empty() {
            return Err(Status::invalid_argument(errors.join("\n")));
        }
        let response = self.with(|s| {
            let mut files = Vec::new();
            let mut names = Vec::new();
            for file in &req.files {
                let name = field(&file.source, "name:").unwrap_or_default();
                let app = field(&file.source, "app:").unwrap_or_else(|| "data".into());
                names.push(name.clone());
                let existing = s.workflows.iter_mut().find(|w| w.name == name);
                let (outcome, version, stored_source) = match existing {
                    Some(w) if w.source == file.source => {
                        (pb::ApplyOutcome::Unchanged, w.version, w.source.clone())
                    }
                    Some(w) => {
                        let stored = (w.version, w.source.clone());
                        if !req.dry_run {
                            w.version += 1;
                            w.source = file.source.clone();
                        }
                        (
                            pb::ApplyOutcome::Updated,
                            if req.dry_run { stored.0 } else { w.version },
                            stored.1,
                        )
                    }
                    None => {
                        if !req.dry_run {
                            let mut w = workflow(&name, 1);
                            w.app = app.clone();
                            w.source = file.source.clone();
                            s.workflows.push(w);
                        }
                        (
                            pb::ApplyOutcome::Created,
                            u32::from(!req.dry_run),
                            String::new(),
                        )
                    }
                };
                files.push(pb::AppliedFile {
                    source_name: file.source_name.clone(),
                    name,
                    app,
                    outcome: outcome as i32,
                    version,
                    stored_source: if req.dry_run {
                        stored_source
                    } else {
                        String::new()
                    },
                    warnings: Vec::new(),
                });
            }
            let mut deleted = Vec::new();
            if req.prune {
                for w in &s.workflows {
                    if w.app == req.app && !names.contains(&w.name) {
                        deleted.push(pb::RemovedWorkflow {
                            name: w.name.clone(),
                            app: w.app.clone(),
                            version: w.version,
                        });
                    }
                }
                if !req.dry_run {
                    s.workflows
                        .retain(|w| !deleted.iter().any(|d| d.name == w.name));
                }
            }
            pb::ApplyWorkflowsResponse {
                files,
                deleted,
                warnings: Vec::new(),
                dry_run: req.dry_run,
            }
        });
        Ok(Response::new(response))
    }

    /// Deletes a fake workflow; one called `busy` has unfinished runs unless cancelled.
    async fn delete_workflow(
        &self,
        request: Request<pb::DeleteWorkflowRequest>,
    ) -> Result<Response<pb::DeleteWorkflowResponse>, Status> {
        self.record("DeleteWorkflow");
        let req = request.into_inner();
        self.with(|s| {
            s.deletes.push(req.clone());
            let Some(index) = s.workflows.iter().position(|w| w.name == req.name) else {
                return Err(Status::not_found(format!(
                    "workflow \"{}\" not found",
                    req.name
                )));
            };
            if req.name == "busy" && !req.cancel_runs {
                return Err(Status::failed_precondition(
                    "workflow busy has unfinished runs (run 7 RUNNING)",
                ));
            }
            let w = s.workflows.remove(index);
            Ok(Response::new(pb::DeleteWorkflowResponse {
                workflow: Some(pb::RemovedWorkflow {
                    name: w.name,
                    app: w.app,
                    version: w.version,
                }),
                cancelled_runs: if req.cancel_runs { vec![7] } else { Vec::new() },
                warnings: Vec::new(),
            }))
        })
    }

    async fn list_workflows(
        &self,
        request: Request<pb::ListWorkflowsRequest>,
    ) -> Result<Response<pb::ListWorkflowsResponse>, Status> {
        self.record("ListWorkflows");
        let app = request.into_inner().app;
        let workflows = self.with(|s| {
            s.workflows
                .iter()
                .filter(|w| app.is_empty() || w.app == app)
                .cloned()
                .collect()
        });
        Ok(Response::new(pb::ListWorkflowsResponse { workflows }))
    }

    async fn get_workflow(
        &self,
        request: Request<pb::GetWorkflowRequest>,
    ) -> Result<Response<pb::Workflow>, Status> {
        self.record("GetWorkflow");
        let name = request.into_inner().name;
        self.with(|s| s.workflows.iter().find(|w| w.name == name).cloned())
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("workflow \"{name}\" not found")))
    }

    async fn pause_workflow(
        &self,
        request: Request<pb::PauseWorkflowRequest>,
    ) -> Result<Response<pb::Workflow>, Status> {
        self.record("PauseWorkflow");
        let name = request.into_inner().name;
        self.set_paused(&name, true)
    }

    async fn resume_workflow(
        &self,
        request: Request<pb::ResumeWorkflowRequest>,
    ) -> Result<Response<pb::Workflow>, Status> {
        self.record("ResumeWorkflow");
        let name = request.into_inner().name;
        self.set_paused(&name, false)
    }

    async fn trigger_workflow(
        &self,
        request: Request<pb::TriggerWorkflowRequest>,
    ) -> Result<Response<pb::TriggerWorkflowResponse>, Status> {
        self.record("TriggerWorkflow");
        let req = request.into_inner();
        self.with(|s| {
            s.triggers.push(req.clone());
            if let (left @ 1.., Some(overloaded)) = &mut s.refuse_triggers {
                *left -= 1;
                return Err(ax_proto::overloaded::status(
                    format!("workflow {:?} not triggered: the bound is met", req.name),
                    overloaded,
                ));
            }
            let Some(workflow) = s.workflows.iter().find(|w| w.name == req.name).cloned() else {
                return Err(Status::not_found(format!(
                    "workflow \"{}\" not found",
                    req.name
                )));
            };
            if let Some(id) = s.idempotency.get(&req.idempotency_key)
                && let Some(existing) = s.runs.iter().find(|r| r.run.id == *id)
            {
                return Ok(Response::new(pb::TriggerWorkflowResponse {
                    run: Some(existing.run.clone()),
                    created: false,
                }));
            }
            let id = FIRST_RUN_ID + s.runs.len() as i64;
            if !req.idempotency_key.is_empty() {
                s.idempotency.insert(req.idempotency_key.clone(), id);
            }
            let (ends_after, final_state) = s.run_script;
            let mut fake_run = FakeRun {
                run: pb::Run {
                    id,
                    workflow: workflow.name.clone(),
                    workflow_version: workflow.version,
                    state: pb::RunState::Running as i32,
                    trigger: pb::TriggerKind::Api as i32,
                    idempotency_key: req.idempotency_key.clone(),
                    params: req.params.clone(),
                    triggered_by: req.actor.clone(),
                    created_at_ms: 1_700_000_000_000,
                    ..Default::default()
                },
                polls: 0,
                ends_after,
                final_state,
            };
            fake_run.run.counts = Some(counts(&fake_run));
            let run = fake_run.run.clone();
            s.runs.push(fake_run);
            Ok(Response::new(pb::TriggerWorkflowResponse {
                run: Some(run),
                created: true,
            }))
        })
    }

    async fn list_runs(
        &self,
        request: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        self.record("ListRuns");
        let req = request.into_inner();
        let runs = self.with(|s| {
            s.list_runs.push(req.clone());
            s.runs
                .iter()
                .rev()
                .map(|r| r.run.clone())
                .filter(|r| req.workflow.is_empty() || r.workflow == req.workflow)
                .filter(|r| req.state == 0 || r.state == req.state)
                .take(if req.limit == 0 {
                    usize::MAX
                } else {
                    req.limit as usize
                })
                .collect()
        });
        Ok(Response::new(pb::ListRunsResponse {
            runs,
            ..Default::default()
        }))
    }

    async fn get_run(
        &self,
        request: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        self.record("GetRun");
        let id = request.into_inner().id;
        self.with(|s| {
            let Some(r) = s.runs.iter_mut().find(|r| r.run.id == id) else {
                return Err(Status::not_found(format!("run {id} not found")));
            };
            r.polls += 1;
            if r.polls >= r.ends_after && r.run.state == pb::RunState::Running as i32 {
                r.run.state = r.final_state as i32;
                r.run.finished_at_ms = r.run.created_at_ms + 4_200;
            }
            r.run.counts = Some(counts(r));
            Ok(Response::new(r.run.clone()))
        })
    }

    async fn cancel_run(
        &self,
        request: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        self.record("CancelRun");
        let id = request.into_inner().id;
        self.with(|s| {
            let Some(r) = s.runs.iter_mut().find(|r| r.run.id == id) else {
                return Err(Status::not_found(format!("run {id} not found")));
            };
            if r.run.state != pb::RunState::Running as i32 {
                return Err(Status::failed_precondition(format!(
                    "run {id} already ended"
                )));
            }
            r.run.state = pb::RunState::Cancelled as i32;
            Ok(Response::new(r.run.clone()))
        })
    }

    async fn list_instances(
        &self,
        request: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        self.record("ListInstances");
        let run_id = request.into_inner().run_id;
        let instances = self.with(|s| {
            s.instances
                .iter()
                .filter(|i| i.run_id == run_id)
                .cloned()
                .collect()
        });
        Ok(Response::new(pb::ListInstancesResponse {
            instances,
            ..Default::default()
        }))
    }

    async fn get_instance(
        &self,
        request: Request<pb::GetInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        self.record("GetInstance");
        let id = request.into_inner().id;
        self.with(|s| s.instances.iter().find(|i| i.id == id).cloned())
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("instance {id} not found")))
    }

    async fn cancel_instance(
        &self,
        request: Request<pb::CancelInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        self.record("CancelInstance");
        let id = request.into_inner().id;
        self.with(|s| {
            let Some(i) = s.instances.iter_mut().find(|i| i.id == id) else {
                return Err(Status::not_found(format!("instance {id} not found")));
            };
            i.state = pb::InstanceState::Cancelled as i32;
            Ok(Response::new(i.clone()))
        })
    }

    async fn retry_instance(
        &self,
        request: Request<pb::RetryInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        self.record("RetryInstance");
        let id = request.into_inner().id;
        self.with(|s| {
            let Some(i) = s.instances.iter_mut().find(|i| i.id == id) else {
                return Err(Status::not_found(format!("instance {id} not found")));
            };
            if i.state == pb::InstanceState::Success as i32 {
                return Err(Status::failed_precondition(format!(
                    "instance {id} is SUCCESS; only FAILED, TIMEOUT and CANCELLED instances can be retried"
                )));
            }
            i.state = pb::InstanceState::Waiting as i32;
            i.attempt += 1;
            Ok(Response::new(i.clone()))
        })
    }

    async fn mark_instance(
        &self,
        request: Request<pb::MarkInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        self.record("MarkInstance");
        let request = request.into_inner();
        if request.reason.trim().is_empty() {
            return Err(Status::invalid_argument(
                "a mark needs a reason (say why the task's outcome is overridden)",
            ));
        }
        let id = request.id;
        self.with(|s| {
            let Some(i) = s.instances.iter_mut().find(|i| i.id == id) else {
                return Err(Status::not_found(format!("instance {id} not found")));
            };
            i.state = request.state;
            Ok(Response::new(i.clone()))
        })
    }

    async fn rerun_run(
        &self,
        request: Request<pb::RerunRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        self.record("RerunRun");
        let id = request.into_inner().id;
        self.with(|s| {
            let Some(r) = s.runs.iter_mut().find(|r| r.run.id == id) else {
                return Err(Status::not_found(format!("run {id} not found")));
            };
            r.run.state = pb::RunState::Running as i32;
            Ok(Response::new(r.run.clone()))
        })
    }

    type WatchRunStream = ReceiverStream<Result<pb::Run, Status>>;

    async fn watch_run(
        &self,
        _request: Request<pb::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        // axctl polls GetRun; the fake answers as a server without WatchRun would.
        self.record("WatchRun");
        Err(Status::unimplemented("WatchRun"))
    }

    type GetLogsStream = ReceiverStream<Result<pb::LogChunk, Status>>;

    async fn get_logs(
        &self,
        request: Request<pb::GetLogsRequest>,
    ) -> Result<Response<Self::GetLogsStream>, Status> {
        self.record("GetLogs");
        let req = request.into_inner();
        let (attempt, lines) = self
            .with(|s| {
                let instance = s.instances.iter().find(|i| i.id == req.instance_id)?;
                let attempt = if req.attempt == 0 {
                    instance.attempt
                } else {
                    req.attempt
                };
                Some((
                    attempt,
                    s.logs.get(&req.instance_id).cloned().unwrap_or_default(),
                ))
            })
            .ok_or_else(|| Status::not_found(format!("instance {} not found", req.instance_id)))?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        // Two lines per chunk with a pause between chunks, so the client sees a real stream.
        tokio::spawn(async move {
            for chunk in lines.chunks(2) {
                let chunk = pb::LogChunk {
                    attempt,
                    lines: chunk.to_vec(),
                };
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.record("ListNodes");
        let (nodes, store_now_ms) = self.with(|s| (s.nodes.clone(), s.store_now_ms));
        let schema = self.with(|s| s.schema.clone());
        Ok(Response::new(pb::ListNodesResponse {
            nodes,
            store_now_ms,
            schema_release: schema.0,
            schema_migration: schema.1,
            schema_oldest_release: schema.2,
        }))
    }

    async fn list_workers(
        &self,
        _request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        self.record("ListWorkers");
        let workers = self.with(|s| s.workers.clone());
        Ok(Response::new(pb::ListWorkersResponse { workers }))
    }

    async fn get_dag(
        &self,
        request: Request<pb::GetDagRequest>,
    ) -> Result<Response<pb::Dag>, Status> {
        self.record("GetDag");
        let request = request.into_inner();
        self.with(|s| {
            s.views.dag_requests.push(request.clone());
            match &s.views.dag {
                Some(dag) if dag.workflow == request.workflow => Ok(Response::new(dag.clone())),
                _ => Err(Status::not_found(format!(
                    "workflow \"{}\" not found",
                    request.workflow
                ))),
            }
        })
    }

    async fn explain_workflow(
        &self,
        request: Request<pb::ExplainWorkflowRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        self.record("ExplainWorkflow");
        let request = request.into_inner();
        self.with(|s| {
            s.views.explain_requests.push(request.clone());
            match &s.views.explanation {
                Some(e) if e.workflow == request.name => Ok(Response::new(e.clone())),
                _ => Err(Status::not_found(format!(
                    "workflow \"{}\" not found",
                    request.name
                ))),
            }
        })
    }

    // axctl's token and secret commands and whoami are tested against a real scheduler
    // (integration-tests/tests/security/); the fake has no tokens.
    async fn who_am_i(
        &self,
        _request: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::Identity>, Status> {
        Err(Status::unimplemented("the fake has no tokens"))
    }

    async fn create_token(
        &self,
        _request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        Err(Status::unimplemented("the fake has no tokens"))
    }

    async fn list_tokens(
        &self,
        _request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        Err(Status::unimplemented("the fake has no tokens"))
    }

    async fn revoke_token(
        &self,
        _request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::Token>, Status> {
        Err(Status::unimplemented("the fake has no tokens"))
    }

    async fn set_secret(
        &self,
        _request: Request<pb::SetSecretRequest>,
    ) -> Result<Response<pb::Secret>, Status> {
        Err(Status::unimplemented("the fake has no secrets"))
    }

    async fn list_secrets(
        &self,
        _request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        Err(Status::unimplemented("the fake has no secrets"))
    }

    async fn delete_secret(
        &self,
        _request: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::Secret>, Status> {
        Err(Status::unimplemented("the fake has no secrets"))
    }

    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        self.record("ListAudit");
        let request = request.into_inner();
        self.with(|s| {
            s.views.audit_requests.push(request.clone());
            let entries = s
                .views
                .audit
                .iter()
                .filter(|e| request.action.is_empty() || e.action == request.action)
                .filter(|e| request.target.is_empty() || e.target == request.target)
                .filter(|e| request.actor.is_empty() || e.actor == request.actor)
                .take(request.limit as usize)
                .cloned()
                .collect();
            Ok(Response::new(pb::ListAuditResponse { entries }))
        })
    }

    async fn backfill_workflow(
        &self,
        request: Request<pb::BackfillWorkflowRequest>,
    ) -> Result<Response<pb::BackfillWorkflowResponse>, Status> {
        self.record("BackfillWorkflow");
        let req = request.into_inner();
        self.with(|s| s.backfills.push(req.clone()));
        // Every hour of the range, as a dry run would list them.
        let slots = (req.from_ms..=req.to_ms)
            .step_by(3_600_000)
            .map(|at| pb::BackfillSlot {
                logical_time_ms: at,
                run: None,
                created: false,
            })
            .collect();
        Ok(Response::new(pb::BackfillWorkflowResponse {
            slots,
            created: 0,
            existing: 0,
        }))
    }

    async fn get_grid(
        &self,
        _request: Request<pb::GetGridRequest>,
    ) -> Result<Response<pb::Grid>, Status> {
        self.record("GetGrid");
        Err(Status::unimplemented("axctl does not read the grid"))
    }

    async fn purge_runs(
        &self,
        request: Request<pb::PurgeRunsRequest>,
    ) -> Result<Response<pb::PurgeRunsResponse>, Status> {
        self.record("PurgeRuns");
        let req = request.into_inner();
        self.with(|s| {
            s.purges.push(req.clone());
            if !req.workflow.is_empty() && !s.workflows.iter().any(|w| w.name == req.workflow) {
                return Err(Status::not_found(format!(
                    "workflow \"{}\" not found",
                    req.workflow
                )));
            }
            // Canned counts: 12 runs of two tasks, each with a log chunk; one kept workflow.
            Ok(Response::new(pb::PurgeRunsResponse {
                runs: 12,
                instances: 24,
                attempts: 25,
                log_chunks: 24,
                decisions: 3,
                ended_before_ms: 1_767_225_600_000 - req.older_than_ms,
                dry_run: req.dry_run,
                kept_forever: if req.workflow.is_empty() {
                    vec!["ledger".into()]
                } else {
                    Vec::new()
                },
            }))
        })
    }
}

impl Fake {
    fn set_paused(&self, name: &str, paused: bool) -> Result<Response<pb::Workflow>, Status> {
        self.with(|s| {
            let Some(w) = s.workflows.iter_mut().find(|w| w.name == name) else {
                return Err(Status::not_found(format!("workflow \"{name}\" not found")));
            };
            w.paused = paused;
            Ok(Response::new(w.clone()))
        })
    }
}
