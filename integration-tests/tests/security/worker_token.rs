//! What a task sees of its worker's token. A real `ax-worker` with tokens on, given its token
//! in `AX_TOKEN`, in `AX_TOKEN_FILE` or as `--token`, runs a task that reads the environment
//! and arguments of its parent and of every ancestor up to the worker (`/proc/PID/environ`,
//! `/proc/PID/cmdline`) and of the worker's other children (the guardian): the stored log
//! never holds the token, though it shows the worker's other variables. With `--task-user
//! nobody` the task runs as nobody (its groups, HOME, USER, LOGNAME), writes its `$AX_OUTPUT`
//! (made for it in a directory it cannot list) and cannot read the token
//! file (mode 0600) nor the worker's environment; a worker that is not root refuses
//! `--task-user` at start. The `--task-user` checks need root and are ignored otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ax_core::access::Role;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::requirements::{MYSQL, Requirement};
use ax_integration_tests::{Backend, Cluster};
use ax_proto::client::{Bearer, ClientAuth};
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_client::ControlServiceClient;
use ax_scheduler::AuthMode;
use ax_scheduler::auth::tokens::{TokenRequest, create};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread) sqlite_a_task_does_not_find_the_workers_token),
        trial!(async(multi_thread) mysql_a_task_does_not_find_the_workers_token).requires(&MYSQL),
        trial!(async(multi_thread) with_task_user_a_task_runs_as_that_user_and_cannot_read_the_token_file).requires(&ROOT),
        trial!(async(multi_thread) a_worker_not_running_as_root_refuses_task_user).requires(&ROOT),
    ]
}

type Client = ControlServiceClient<InterceptedService<Channel, Bearer>>;

/// A hang guard: how long a worker may take to register, a run to end.
const GUARD: Duration = Duration::from_secs(60);

/// Prints what a task can find of its worker: the environment and arguments of each ancestor
/// up to the worker, and of the worker's other children.
const SNOOP: &str = r#"echo "parent $PPID environ:"; tr '\0' '\n' < /proc/$PPID/environ
echo "parent cmdline: $(tr '\0' ' ' < /proc/$PPID/cmdline)"
pid=$$
while [ "$pid" -gt 1 ]; do
  pid=$(awk '/^PPid:/ {print $2}' /proc/$pid/status)
  line=$(tr '\0' ' ' < /proc/$pid/cmdline)
  echo "ancestor $pid: $line"
  tr '\0' '\n' < /proc/$pid/environ
  case "$line" in *ax-worker*) worker=$pid; break;; esac
done
for status in /proc/[0-9]*/status; do
  dir=${status%/status}
  if [ "$(awk '/^PPid:/ {print $2}' $status 2>/dev/null)" = "$worker" ] && [ "$dir" != /proc/$$ ]; then
    echo "worker's child $dir: $(tr '\0' ' ' < $dir/cmdline 2>/dev/null)"
    tr '\0' '\n' < $dir/environ 2>/dev/null
  fi
done
echo "my environ:"; env
echo done-snooping"#;

struct Setup {
    cluster: Cluster,
    admin: Client,
    worker_token: String,
}

async fn setup(backend: Backend) -> Setup {
    let cluster = Cluster::builder(backend)
        .auth(AuthMode::Tokens)
        .start()
        .await
        .expect("cluster");
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let now = chrono::Utc::now().timestamp_millis();
    let token = async |name: &str, role: Role| {
        let request = TokenRequest {
            name: name.into(),
            role,
            app: None,
            lifetime_ms: None,
            created_by: "test".into(),
            worker: (role == Role::Worker).then(ax_core::worker_scope::WorkerScope::any),
        };
        create(store.as_ref(), request, now).await.expect("token").0
    };
    let admin_token = token("admin", Role::Admin).await;
    let worker_token = token("workers", Role::Worker).await;
    let auth = ClientAuth {
        token: Some(admin_token),
        ..ClientAuth::default()
    };
    let channel = auth
        .endpoint(&cluster.endpoint(), None)
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let admin = ControlServiceClient::with_interceptor(channel, auth.bearer().expect("bearer"));
    Setup {
        cluster,
        admin,
        worker_token,
    }
}

/// An `ax-worker` process with `id`, labelled `variant=<id>`, given `args` and `env` besides.
fn start_worker(
    setup: &Setup,
    dir: &Path,
    id: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> tokio::process::Child {
    let binary = ax_integration_tests::binary("ax-worker").expect("ax-worker is built");
    let mut command = tokio::process::Command::new(binary);
    command
        .args(["--scheduler", &setup.cluster.endpoint(), "--id", id])
        .args(["--label", &format!("variant={id}")])
        .args(["--heartbeat-interval", "500ms"])
        // Its own state directory: the default, under the shared temp dir, would hand it the
        // ends of an earlier test's worker of the same id.
        .arg("--state-dir")
        .arg(dir.join(format!("state-{id}")))
        .args(args)
        .env_remove("AX_TOKEN")
        .env_remove("AX_TOKEN_FILE")
        .env_remove("AX_SCHEDULER")
        // Seen in the worker's environment, so the task's reading of it is known to work.
        .env("AX_TEST_MARKER", "visible-to-the-task")
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command.spawn().expect("start ax-worker")
}

/// Waits until worker `id` is live, or fails with what the worker printed.
async fn wait_live(setup: &mut Setup, id: &str, worker: &mut tokio::process::Child) {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let workers = setup
            .admin
            .list_workers(pb::ListWorkersRequest {})
            .await
            .expect("workers")
            .into_inner()
            .workers;
        if workers
            .iter()
            .any(|w| w.id == id && w.state == pb::WorkerState::Live as i32)
        {
            return;
        }
        if let Ok(Some(status)) = worker.try_wait() {
            panic!("worker {id} exited: {status}");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker {id} not live"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Applies a workflow running `script` on the worker `id`, runs it and answers its log.
async fn run_on(setup: &mut Setup, id: &str, script: &str) -> (pb::Run, String) {
    let name = format!("snoop-{id}");
    let indented: Vec<String> = script.lines().map(|l| format!("      {l}")).collect();
    let source = format!(
        "name: {name}\ntasks:\n  - name: t\n    labels: {{variant: {id}}}\n    command: |\n{}\n",
        indented.join("\n")
    );
    setup
        .admin
        .apply_workflow(pb::ApplyWorkflowRequest {
            source,
            ..Default::default()
        })
        .await
        .expect("apply");
    let run = setup
        .admin
        .trigger_workflow(pb::TriggerWorkflowRequest {
            name,
            ..Default::default()
        })
        .await
        .expect("trigger")
        .into_inner()
        .run
        .expect("a run");
    let deadline = tokio::time::Instant::now() + GUARD;
    let run = loop {
        let run = setup
            .admin
            .get_run(pb::GetRunRequest { id: run.id })
            .await
            .expect("run")
            .into_inner();
        if run.finished_at_ms > 0 {
            break run;
        }
        assert!(tokio::time::Instant::now() < deadline, "run {run:?} hangs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let instance = setup
        .admin
        .list_instances(pb::ListInstancesRequest {
            run_id: run.id,
            ..Default::default()
        })
        .await
        .expect("instances")
        .into_inner()
        .instances
        .remove(0);
    let mut logs = setup
        .admin
        .get_logs(pb::GetLogsRequest {
            instance_id: instance.id,
            ..Default::default()
        })
        .await
        .expect("logs")
        .into_inner();
    let mut text = String::new();
    while let Some(chunk) = logs.message().await.expect("log chunk") {
        for line in chunk.lines {
            text.push_str(&line.text);
            text.push('\n');
        }
    }
    (run, text)
}

async fn stop(mut worker: tokio::process::Child) {
    let _ = worker.kill().await;
}

/// A directory others may enter, holding the token in a file of mode 0600.
fn token_file(dir: &Path, token: &str) -> String {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let path = dir.join("worker.token");
    std::fs::write(&path, format!("{token}\n")).expect("write the token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    path.display().to_string()
}

fn assert_hidden(log: &str, token: &str, how: &str) {
    assert!(
        log.contains("done-snooping"),
        "{how}: the task did not finish its reading:\n{log}"
    );
    assert!(
        log.contains("AX_TEST_MARKER=visible-to-the-task"),
        "{how}: the task could not read the worker's environment, so the check is void:\n{log}"
    );
    assert!(log.contains("ancestor"), "{how}: no ancestor read:\n{log}");
    assert!(
        !log.contains(token),
        "{how}: the task's log holds the worker's token:\n{log}"
    );
}

async fn a_task_does_not_find_the_workers_token(backend: Backend) {
    let mut setup = setup(backend).await;
    let token = setup.worker_token.clone();
    let dir = tempfile::tempdir().expect("dir");

    // In AX_TOKEN.
    let mut worker = start_worker(&setup, dir.path(), "env", &[], &[("AX_TOKEN", &token)]);
    wait_live(&mut setup, "env", &mut worker).await;
    let (run, log) = run_on(&mut setup, "env", SNOOP).await;
    assert_eq!(run.state, pb::RunState::Success as i32, "{log}");
    assert_hidden(&log, &token, "AX_TOKEN");
    stop(worker).await;

    // In a file named by AX_TOKEN_FILE.
    let file = token_file(dir.path(), &token);
    let mut worker = start_worker(&setup, dir.path(), "file", &[], &[("AX_TOKEN_FILE", &file)]);
    wait_live(&mut setup, "file", &mut worker).await;
    let (run, log) = run_on(&mut setup, "file", SNOOP).await;
    assert_eq!(run.state, pb::RunState::Success as i32, "{log}");
    assert_hidden(&log, &token, "AX_TOKEN_FILE");
    stop(worker).await;

    // As --token on the command line, which any user of the host reads in /proc.
    let mut worker = start_worker(&setup, dir.path(), "flag", &["--token", &token], &[]);
    wait_live(&mut setup, "flag", &mut worker).await;
    let (run, log) = run_on(&mut setup, "flag", SNOOP).await;
    assert_eq!(run.state, pb::RunState::Success as i32, "{log}");
    assert_hidden(&log, &token, "--token");
    assert!(
        log.contains("--token"),
        "the flag is there, not its value:\n{log}"
    );
    stop(worker).await;

    setup.cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_a_task_does_not_find_the_workers_token() {
    a_task_does_not_find_the_workers_token(Backend::Sqlite).await;
}

async fn mysql_a_task_does_not_find_the_workers_token() {
    a_task_does_not_find_the_workers_token(Backend::MySql).await;
}

/// Running as root, which `--task-user` needs.
static ROOT: Requirement = Requirement::custom(
    || {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        match euid {
            0 => Ok(()),
            _ => Err(format!("the tests run as uid {euid}, not root")),
        }
    },
    "run them as root to check --task-user",
);

async fn with_task_user_a_task_runs_as_that_user_and_cannot_read_the_token_file() {
    let mut setup = setup(Backend::Sqlite).await;
    let token = setup.worker_token.clone();
    let dir = tempfile::tempdir().expect("dir");
    let file = token_file(dir.path(), &token);
    let readable = dir.path().join("readable.txt");
    std::fs::write(&readable, "anyone reads this\n").expect("write");
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut worker = start_worker(
        &setup,
        dir.path(),
        "nobody",
        &["--task-user", "nobody"],
        &[("AX_TOKEN_FILE", &file)],
    );
    wait_live(&mut setup, "nobody", &mut worker).await;
    let script = format!(
        "echo \"uid $(id -u) gid $(id -g) groups $(id -G)\"\n\
         echo \"home=$HOME user=$USER logname=$LOGNAME\"\n\
         cat {readable}\n\
         cat {file} || echo token-file-refused\n\
         tr '\\0' '\\n' < /proc/$PPID/environ || echo worker-environ-refused\n\
         echo rows=7 >> \"$AX_OUTPUT\" && echo output-written\n\
         ls \"$(dirname \"$AX_OUTPUT\")\" || echo outputs-dir-unlisted\n\
         echo done",
        readable = readable.display(),
    );
    let (run, log) = run_on(&mut setup, "nobody", &script).await;
    assert_eq!(run.state, pb::RunState::Success as i32, "{log}");
    assert!(
        log.contains("uid 65534 gid 65534 groups 65534\n"),
        "the task runs as nobody:nogroup with nogroup alone:\n{log}"
    );
    assert!(
        log.contains("home=/nonexistent user=nobody logname=nobody\n"),
        "{log}"
    );
    assert!(
        log.contains("anyone reads this"),
        "the directory is open, so only the file's mode refuses:\n{log}"
    );
    assert!(log.contains("token-file-refused"), "{log}");
    assert!(log.contains("worker-environ-refused"), "{log}");
    assert!(!log.contains(&token), "{log}");
    // $AX_OUTPUT is made for the task's account, in a directory it cannot list, and what it
    // wrote is the attempt's outputs.
    assert!(log.contains("output-written"), "{log}");
    assert!(log.contains("outputs-dir-unlisted"), "{log}");
    let instances = setup
        .admin
        .list_instances(pb::ListInstancesRequest {
            run_id: run.id,
            attempts: true,
            ..Default::default()
        })
        .await
        .expect("instances")
        .into_inner()
        .instances;
    let outputs = &instances[0].attempts[0].outputs;
    assert_eq!(outputs.get("rows").map(String::as_str), Some("7"), "{log}");
    stop(worker).await;
    setup.cluster.shutdown().await.expect("shutdown");
}

/// A worker that is not root refuses `--task-user` at start, saying why.
async fn a_worker_not_running_as_root_refuses_task_user() {
    let binary = ax_integration_tests::binary("ax-worker").expect("ax-worker is built");
    let run = tokio::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(binary)
        .args(["--scheduler", "http://127.0.0.1:9", "--task-user", "nobody"])
        .env_remove("AX_TOKEN")
        .env_remove("AX_TOKEN_FILE")
        .output();
    let out = tokio::time::timeout(GUARD, run)
        .await
        .expect("the worker exits")
        .expect("setpriv runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--task-user needs the worker to run as root")
            && stderr.contains("uid 65534"),
        "{stderr}"
    );
}
