//! The test client of the control API: one scheduler endpoint, the calls the tests make, and
//! waits that give up after the caller's hang guard with an error naming what they waited for
//! and what they saw last. The in-process [`crate::Cluster`] and the process-based
//! [`crate::process::ProcessCluster`] both hand it out; a test of several nodes holds one per
//! node.
//!
//! Waits poll. While the scheduler does not answer (it may be restarting) they keep polling
//! until their guard; an answer that refuses the request itself (an unknown id, a bad argument)
//! ends them at once.

use std::time::Duration;

use anyhow::{Context, bail};
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_client::ControlServiceClient;
use tonic::transport::Channel;

/// How long a whole run may take before a test gives up. A hang guard, not a measurement.
pub const RUN_GUARD: Duration = Duration::from_secs(120);

/// How long a connection attempt to the scheduler may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Answers of up to this size are accepted: a 10,000-task workflow comes back larger than
/// tonic's default of 4 MiB.
const MAX_DECODING: usize = 64 << 20;

/// How often a wait polls.
const POLL: Duration = Duration::from_millis(50);

/// Who the test's mutating calls are recorded as, in the audit log.
const ACTOR: &str = "tester";

/// The file name an applied source is reported under (`test.yaml:5: tasks[0]…`).
const SOURCE_NAME: &str = "test.yaml";

/// A client of the control API of the scheduler at one endpoint. Cloning it shares the
/// connection, which reconnects by itself after the scheduler restarts.
#[derive(Clone)]
pub struct TestClient {
    endpoint: String,
    control: ControlServiceClient<Channel>,
}

impl std::fmt::Debug for TestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestClient")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl TestClient {
    /// Connects to the scheduler at `endpoint` (`http://127.0.0.1:PORT`).
    pub async fn connect(endpoint: &str) -> anyhow::Result<TestClient> {
        let channel = Channel::from_shared(endpoint.to_string())
            .with_context(|| format!("{endpoint:?} is not an endpoint"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .connect()
            .await
            .with_context(|| format!("connecting to {endpoint}"))?;
        Ok(TestClient {
            endpoint: endpoint.to_string(),
            control: ControlServiceClient::new(channel).max_decoding_message_size(MAX_DECODING),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The generated client on the same connection, for calls a test makes once, or whose
    /// raw answer or status it checks.
    pub fn control(&self) -> ControlServiceClient<Channel> {
        self.control.clone()
    }

    // -----------------------------------------------------------------------------------------
    // Workflows.

    /// Applies a workflow file's text. A refusal is the error, as a [`tonic::Status`].
    pub async fn apply(&self, source: &str) -> anyhow::Result<pb::ApplyWorkflowResponse> {
        let request = pb::ApplyWorkflowRequest {
            source: source.into(),
            source_name: SOURCE_NAME.into(),
            dry_run: false,
            actor: ACTOR.into(),
        };
        Ok(self.control().apply_workflow(request).await?.into_inner())
    }

    pub async fn pause(&self, workflow: &str) -> anyhow::Result<pb::Workflow> {
        let request = pb::PauseWorkflowRequest {
            name: workflow.into(),
            actor: ACTOR.into(),
        };
        Ok(self.control().pause_workflow(request).await?.into_inner())
    }

    pub async fn resume(&self, workflow: &str) -> anyhow::Result<pb::Workflow> {
        let request = pb::ResumeWorkflowRequest {
            name: workflow.into(),
            actor: ACTOR.into(),
        };
        Ok(self.control().resume_workflow(request).await?.into_inner())
    }

    // -----------------------------------------------------------------------------------------
    // Runs.

    /// Triggers `name` with `params` and an idempotency key (`""` for none). A refusal is the
    /// error, as a [`tonic::Status`].
    pub async fn trigger(
        &self,
        name: &str,
        params: &[(&str, &str)],
        key: &str,
    ) -> anyhow::Result<pb::TriggerWorkflowResponse> {
        let request = pb::TriggerWorkflowRequest {
            name: name.into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            idempotency_key: key.into(),
            actor: ACTOR.into(),
            logical_time_ms: 0,
        };
        Ok(self.control().trigger_workflow(request).await?.into_inner())
    }

    /// Triggers `name` without params or key; returns the run as created.
    pub async fn trigger_run(&self, name: &str) -> anyhow::Result<pb::Run> {
        self.trigger(name, &[], "")
            .await?
            .run
            .with_context(|| format!("the trigger of {name} returned no run"))
    }

    /// Triggers `name` for the logical time `logical_time_ms` (0: now); returns the run.
    pub async fn trigger_at(&self, name: &str, logical_time_ms: i64) -> anyhow::Result<pb::Run> {
        let request = pb::TriggerWorkflowRequest {
            name: name.into(),
            actor: ACTOR.into(),
            logical_time_ms,
            ..Default::default()
        };
        self.control()
            .trigger_workflow(request)
            .await?
            .into_inner()
            .run
            .with_context(|| format!("the trigger of {name} returned no run"))
    }

    pub async fn get_run(&self, id: i64) -> anyhow::Result<pb::Run> {
        Ok(self
            .control()
            .get_run(pb::GetRunRequest { id })
            .await?
            .into_inner())
    }

    /// The runs of `workflow` (all of them, up to the server's limit of 1,000), in the
    /// server's order.
    pub async fn runs(&self, workflow: &str) -> anyhow::Result<Vec<pb::Run>> {
        let request = pb::ListRunsRequest {
            workflow: workflow.into(),
            limit: 1_000,
            state: 0,
            ..Default::default()
        };
        Ok(self.control().list_runs(request).await?.into_inner().runs)
    }

    pub async fn cancel_run(&self, id: i64, reason: &str) -> anyhow::Result<pb::Run> {
        let request = pb::CancelRunRequest {
            id,
            actor: ACTOR.into(),
            reason: reason.into(),
        };
        Ok(self.control().cancel_run(request).await?.into_inner())
    }

    /// Waits until run `id` is SUCCESS, FAILED or CANCELLED, and returns it; fails after
    /// [`RUN_GUARD`] naming the run and the state and counts it saw last.
    pub async fn wait_run(&self, id: i64) -> anyhow::Result<pb::Run> {
        self.wait_run_within(id, RUN_GUARD).await
    }

    /// [`TestClient::wait_run`] under a guard of the caller's, for a run longer than
    /// [`RUN_GUARD`] allows.
    pub async fn wait_run_within(&self, id: i64, timeout: Duration) -> anyhow::Result<pb::Run> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match self.control().get_run(pb::GetRunRequest { id }).await {
                Ok(run) => {
                    let run = run.into_inner();
                    if is_terminal(run.state()) {
                        return Ok(run);
                    }
                    format!("{:?} with counts {:?}", run.state(), run.counts)
                }
                Err(status) if is_refusal(&status) => {
                    return Err(anyhow::Error::new(status).context(format!("waiting for run {id}")));
                }
                Err(status) => format!("no answer from {}: {status}", self.endpoint),
            };
            if tokio::time::Instant::now() > deadline {
                bail!("run {id} did not end within {timeout:?}; last seen: {last}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Triggers `name` without params and waits until the run ends (under [`RUN_GUARD`]);
    /// returns the run as created and as it ended.
    pub async fn run_to_end(&self, name: &str) -> anyhow::Result<(pb::Run, pb::Run)> {
        let run = self.trigger_run(name).await?;
        let ended = self.wait_run(run.id).await?;
        Ok((run, ended))
    }

    // -----------------------------------------------------------------------------------------
    // Instances and logs.

    /// The run's instances as listed (without attempts) and the status of every task.
    pub async fn list_instances(&self, run: i64) -> anyhow::Result<pb::ListInstancesResponse> {
        let request = pb::ListInstancesRequest {
            run_id: run,
            attempts: false,
            ..Default::default()
        };
        Ok(self.control().list_instances(request).await?.into_inner())
    }

    /// Every instance of the run, each read in full (with its attempts).
    pub async fn instances(&self, run: i64) -> anyhow::Result<Vec<pb::Instance>> {
        let mut control = self.control();
        let listed = self.list_instances(run).await?.instances;
        let mut full = Vec::with_capacity(listed.len());
        for instance in listed {
            let request = pb::GetInstanceRequest { id: instance.id };
            full.push(control.get_instance(request).await?.into_inner());
        }
        Ok(full)
    }

    /// Polls the run's instances (in full) until `done` holds, and returns them; fails after
    /// [`RUN_GUARD`] saying `what` was awaited and what was seen last.
    pub async fn wait_instances(
        &self,
        run: i64,
        what: &str,
        done: impl Fn(&[pb::Instance]) -> bool,
    ) -> anyhow::Result<Vec<pb::Instance>> {
        let timeout = RUN_GUARD;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match self.instances(run).await {
                Ok(instances) if done(&instances) => return Ok(instances),
                Ok(instances) => summary(&instances),
                Err(err) => match err.downcast_ref::<tonic::Status>() {
                    Some(status) if is_refusal(status) => {
                        return Err(err.context(format!("waiting for run {run}: {what}")));
                    }
                    _ => format!("no answer from {}: {err:#}", self.endpoint),
                },
            };
            if tokio::time::Instant::now() > deadline {
                bail!("run {run}: not {what} after {timeout:?}; last seen:\n{last}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the run has an instance of `task` in `state`, and returns it.
    pub async fn wait_instance(
        &self,
        run: i64,
        task: &str,
        state: pb::InstanceState,
    ) -> anyhow::Result<pb::Instance> {
        let is_it = |i: &pb::Instance| i.task == task && i.state() == state;
        let what = format!("{task} {state:?}");
        let instances = self
            .wait_instances(run, &what, |all| all.iter().any(is_it))
            .await?;
        Ok(instances
            .into_iter()
            .find(is_it)
            .expect("the wait returned once it was there"))
    }

    /// The stored log lines (stdout and stderr, in their order) of the instance's latest
    /// attempt.
    pub async fn logs(&self, instance: i64) -> anyhow::Result<Vec<pb::StoredLogLine>> {
        self.attempt_logs(instance, 0).await
    }

    /// The stored log lines of one attempt of the instance (0: its latest).
    pub async fn attempt_logs(
        &self,
        instance: i64,
        attempt: u32,
    ) -> anyhow::Result<Vec<pb::StoredLogLine>> {
        let request = pb::GetLogsRequest {
            instance_id: instance,
            attempt,
            follow: false,
            after_seq: 0,
            ..Default::default()
        };
        let mut stream = self.control().get_logs(request).await?.into_inner();
        let mut lines = Vec::new();
        while let Some(chunk) = stream.message().await? {
            lines.extend(chunk.lines);
        }
        Ok(lines)
    }

    // -----------------------------------------------------------------------------------------
    // Workers.

    pub async fn workers(&self) -> anyhow::Result<Vec<pb::WorkerInfo>> {
        let request = pb::ListWorkersRequest {};
        Ok(self
            .control()
            .list_workers(request)
            .await?
            .into_inner()
            .workers)
    }

    /// Waits until at least `count` workers are LIVE.
    pub async fn wait_for_workers(&self, count: usize, timeout: Duration) -> anyhow::Result<()> {
        self.wait_workers(&format!("{count} workers LIVE"), timeout, |workers| {
            workers.iter().filter(|w| is_live(w)).count() >= count
        })
        .await
    }

    /// Waits until worker `id` is LIVE.
    pub async fn wait_worker_live(&self, id: &str, timeout: Duration) -> anyhow::Result<()> {
        self.wait_workers(&format!("worker {id} LIVE"), timeout, |workers| {
            workers.iter().any(|w| w.id == id && is_live(w))
        })
        .await
    }

    async fn wait_workers(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[pb::WorkerInfo]) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match self.workers().await {
                Ok(workers) if done(&workers) => return Ok(()),
                Ok(workers) => {
                    let seen: Vec<String> = workers
                        .iter()
                        .map(|w| format!("{} {:?}", w.id, w.state()))
                        .collect();
                    format!("[{}]", seen.join(", "))
                }
                Err(err) => format!("no answer from {}: {err:#}", self.endpoint),
            };
            if tokio::time::Instant::now() > deadline {
                bail!("not {what} after {timeout:?}; last seen: {last}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

fn is_terminal(state: pb::RunState) -> bool {
    matches!(
        state,
        pb::RunState::Success | pb::RunState::Failed | pb::RunState::Cancelled
    )
}

fn is_live(worker: &pb::WorkerInfo) -> bool {
    worker.state() == pb::WorkerState::Live
}

/// Whether the scheduler answered and refused the request itself, which asking again cannot
/// change; anything else (no connection, a connection cut, a node busy starting) can pass.
fn is_refusal(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Unauthenticated
    )
}

/// One line per instance: id, task, state and each attempt's state, worker and message.
pub fn summary(instances: &[pb::Instance]) -> String {
    instances
        .iter()
        .map(|i| {
            let attempts: Vec<String> = i
                .attempts
                .iter()
                .map(|a| {
                    format!(
                        "#{} {:?} on {} ({})",
                        a.attempt,
                        a.state(),
                        a.worker_id,
                        a.message
                    )
                })
                .collect();
            format!(
                "{} {} {:?}: {}",
                i.id,
                i.task,
                i.state(),
                attempts.join("; ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
