//! Folders of workflow files, end to end through the real `axctl` against a node with a worker:
//! `apply -f DIR` stores every file or none (a folder with one bad file stores nothing and
//! names every problem at its file and line; two files of one name, and an `after` loop across
//! two new files, are refused), `diff` shows what would change with its exit code, `apply
//! --prune --app` deletes only that app's workflows the folder lacks; `delete workflow` stops a
//! schedule, refuses a workflow with runs unless told to cancel them, keeps the runs and frees
//! the name; `import crontab` writes files that apply as they are and run. Every scenario runs
//! on SQLite, and on MySQL when `AX_TEST_MYSQL_URL` is set. Needs `cargo build --bins` first.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

/// A hang guard, not a timing assertion.
const AXCTL_GUARD: Duration = Duration::from_secs(60);

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        a_folder_is_applied_whole_or_not_at_all_and_prunes_only_its_app,
        a_deleted_workflow_stops_keeps_its_runs_and_frees_its_name,
        an_imported_crontab_applies_as_written_and_runs,
    )
}

async fn cluster(backend: Backend) -> (Cluster, TestClient) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 4)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

/// Runs axctl in `dir` on a blocking thread (the node it talks to lives in this runtime).
async fn axctl(cluster: &Cluster, dir: &Path, args: &[&str]) -> Output {
    let mut command =
        std::process::Command::new(ax_integration_tests::binary("axctl").expect("axctl is built"));
    command
        .args(args)
        .current_dir(dir)
        .env("AX_SERVER", cluster.endpoint())
        .env("RUST_LOG", "off");
    tokio::time::timeout(
        AXCTL_GUARD,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("axctl ends")
    .expect("axctl thread")
    .expect("axctl runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The exit code, after printing what axctl said (the binary shows a failing test's output).
fn code(args: &[&str], output: &Output) -> i32 {
    eprintln!(
        "axctl {args:?}: {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    output.status.code().expect("axctl exited, not killed")
}

fn write(dir: &Path, path: &str, content: &str) {
    let path = dir.join(path);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, content).expect("write");
}

fn workflow(name: &str, app: &str, extra: &str) -> String {
    format!("name: {name}\napp: {app}\n{extra}tasks:\n  - name: t\n    command: echo {name}\n")
}

/// The live workflows, as `name@app vN`.
async fn listed(client: &TestClient) -> Vec<String> {
    client
        .control()
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .workflows
        .iter()
        .map(|w| format!("{}@{} v{}", w.name, w.app, w.version))
        .collect()
}

async fn audit_actions(client: &TestClient, target: &str) -> Vec<String> {
    client
        .control()
        .list_audit(pb::ListAuditRequest {
            target: target.into(),
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner()
        .entries
        .iter()
        .map(|e| e.action.clone())
        .collect()
}

async fn a_folder_is_applied_whole_or_not_at_all_and_prunes_only_its_app(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    client
        .apply(&workflow("books", "finance", ""))
        .await
        .expect("finance's workflow");
    // `report` names `ingest`, a file of the same set: it exists once the set is applied.
    write(d, "wf/ingest.yaml", &workflow("ingest", "sales", ""));
    write(
        d,
        "wf/sub/report.yml",
        &workflow("report", "sales", "schedule:\n  after: [ingest]\n"),
    );
    write(d, "wf/.draft.yaml", "not: a workflow\n");
    let args = ["apply", "-f", "wf"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0);
    assert_eq!(
        text(&out.stdout),
        "workflow ingest created (version 1)\nworkflow report created (version 1)\n"
    );
    assert_eq!(text(&out.stderr), "", "no warning: ingest is in the set");
    let before = listed(&client).await;
    assert_eq!(
        before,
        ["books@finance v1", "ingest@sales v1", "report@sales v1"]
    );

    // One bad file among good ones, a name declared twice and a loop across two new files:
    // every problem named at its file and line, nothing stored.
    write(d, "bad/a-good.yaml", &workflow("fresh", "sales", ""));
    write(
        d,
        "bad/b-bad.yaml",
        "name: broken\napp: sales\ntasks:\n  - name: t\n    command: x\n    retries: many\n",
    );
    write(d, "bad/c-twin.yaml", &workflow("fresh", "sales", ""));
    write(
        d,
        "bad/d-loop.yaml",
        &workflow("left", "sales", "schedule:\n  after: [right]\n"),
    );
    write(
        d,
        "bad/e-loop.yaml",
        &workflow("right", "sales", "schedule:\n  after: [left]\n"),
    );
    let args = ["apply", "-f", "bad"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 4);
    let errors: Vec<String> = text(&out.stderr).lines().map(str::to_string).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].starts_with("bad/b-bad.yaml:6: tasks[0].retries: "),
        "{errors:?}"
    );
    assert_eq!(
        errors[1],
        "bad/c-twin.yaml:1: name: workflow \"fresh\" is also declared in bad/a-good.yaml; a \
         name is one workflow"
    );
    assert_eq!(listed(&client).await, before, "nothing stored");
    std::fs::remove_file(d.join("bad/b-bad.yaml")).expect("rm");
    std::fs::remove_file(d.join("bad/c-twin.yaml")).expect("rm");
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 4);
    let errors = text(&out.stderr);
    let errors: Vec<&str> = errors.lines().collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].starts_with("bad/d-loop.yaml:0: schedule.after: cycle across workflows: "),
        "{errors:?}"
    );
    assert!(
        errors[1].starts_with("bad/e-loop.yaml:0: schedule.after: cycle across workflows: "),
        "{errors:?}"
    );
    assert_eq!(listed(&client).await, before, "nothing stored");

    // A diff of the folder as applied: nothing to do (exit 0). Changed and pruned: exit 12,
    // with the file's diff, still nothing stored.
    let args = ["diff", "-f", "wf"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0);
    std::fs::remove_file(d.join("wf/sub/report.yml")).expect("rm");
    write(
        d,
        "wf/ingest.yaml",
        &workflow("ingest", "sales", "owner: data-team\n"),
    );
    let args = ["diff", "-f", "wf", "--prune", "--app", "sales"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 12);
    assert_eq!(
        text(&out.stdout),
        "\
workflow ingest: changed (version 1 to 2) by wf/ingest.yaml
--- workflow/ingest (version 1, stored)
+++ wf/ingest.yaml
@@ -1,5 +1,6 @@
 name: ingest
 app: sales
+owner: data-team
 tasks:
   - name: t
     command: echo ingest
workflow report: deleted (app sales, version 1: no file declares it; its runs are kept)
0 to create, 1 to change, 1 to delete, 0 unchanged
"
    );
    assert_eq!(listed(&client).await, before, "a diff stores nothing");

    // The prune deletes sales's workflow the folder lacks, and nothing of finance.
    let args = ["apply", "-f", "wf", "--prune", "--app", "sales"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0);
    assert_eq!(
        text(&out.stdout),
        "workflow ingest updated (version 2)\nworkflow report deleted (app sales, version 1: \
         no file declares it; its runs are kept)\n"
    );
    assert_eq!(
        listed(&client).await,
        ["books@finance v1", "ingest@sales v2"]
    );
    assert_eq!(
        audit_actions(&client, "workflow/report").await,
        ["delete", "apply"]
    );
    let args = ["diff", "-f", "wf", "--prune", "--app", "sales"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0, "applied: nothing left to do");
    cluster.shutdown().await.expect("shutdown");
}

async fn a_deleted_workflow_stops_keeps_its_runs_and_frees_its_name(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // Every second, and a long task: a run is going when the delete comes.
    client
        .apply(
            "name: ticker\napp: ops\nschedule:\n  cron: \"* * * * * *\"\n  overlap: skip\n\
             tasks:\n  - name: t\n    command: sleep 600\n",
        )
        .await
        .expect("apply");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let run = loop {
        let runs = client.runs("ticker").await.expect("runs");
        if let Some(run) = runs
            .iter()
            .find(|r| r.state == pb::RunState::Running as i32)
        {
            break run.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no cron run started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // A prune that would delete it is refused whole: nothing of the folder is stored.
    write(d, "keep/other.yaml", &workflow("other", "ops", ""));
    let args = ["apply", "-f", "keep", "--prune", "--app", "ops"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 6);
    assert!(
        text(&out.stderr).contains(&format!(
            "nothing applied: cannot prune: workflow ticker has unfinished runs (run {} RUNNING)",
            run.id
        )),
        "the refusal names the run"
    );
    assert_eq!(listed(&client).await, ["ticker@ops v1"], "nothing stored");

    let args = ["delete", "workflow", "ticker"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 6);
    assert!(
        text(&out.stderr).contains(&format!("run {} RUNNING", run.id)),
        "the refusal names the run"
    );
    let args = ["delete", "workflow", "ticker", "--cancel-runs"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0);
    assert!(
        text(&out.stdout).contains(&format!("run {} cancelled\n", run.id)),
        "the cancelled run is named"
    );
    assert!(
        text(&out.stdout).ends_with("workflow ticker deleted (version 1); its runs are kept\n")
    );

    // Gone from reads by name; the runs stay, readable by id, and run no more.
    let gone = client
        .control()
        .get_workflow(pb::GetWorkflowRequest {
            name: "ticker".into(),
        })
        .await
        .expect_err("deleted");
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert!(listed(&client).await.is_empty());
    let kept = client.get_run(run.id).await.expect("the run is kept");
    assert_eq!(kept.state, pb::RunState::Cancelled as i32);
    let all_runs = || async {
        client
            .control()
            .list_runs(pb::ListRunsRequest {
                limit: 1_000,
                ..Default::default()
            })
            .await
            .expect("runs")
            .into_inner()
            .runs
            .iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    let after_delete = all_runs().await;
    assert!(after_delete.contains(&run.id));
    let rerun = client
        .control()
        .rerun_run(pb::RerunRunRequest {
            id: run.id,
            failed: true,
            ..Default::default()
        })
        .await
        .expect_err("a deleted workflow runs no more");
    assert_eq!(rerun.code(), tonic::Code::FailedPrecondition);
    let dag = client
        .control()
        .get_dag(pb::GetDagRequest {
            workflow: "ticker".into(),
            run_id: run.id,
            ..Default::default()
        })
        .await
        .expect("a kept run's graph")
        .into_inner();
    assert_eq!(dag.nodes.len(), 1);
    // Its schedule fires no more: slots pass, and no run is added (a schedule that still fired
    // would add one every second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(all_runs().await, after_delete, "no run after the delete");

    // The name is free: a new workflow, version 1, with no runs.
    write(
        d,
        "again/ticker.yaml",
        "name: ticker\napp: ops\ntasks:\n  - name: t\n    command: echo again\n",
    );
    let args = ["apply", "-f", "again"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0);
    assert_eq!(text(&out.stdout), "workflow ticker created (version 1)\n");
    assert!(client.runs("ticker").await.expect("runs").is_empty());
    let (_, ended) = client.run_to_end("ticker").await.expect("run");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    assert_eq!(
        audit_actions(&client, "workflow/ticker").await,
        ["trigger", "apply", "delete", "apply"]
    );

    // The deleted workflow's runs are history like any: a purge of every workflow takes them.
    let purged = client
        .control()
        .purge_runs(pb::PurgeRunsRequest {
            older_than_ms: 1,
            ..Default::default()
        })
        .await
        .expect("purge")
        .into_inner();
    assert!(purged.runs >= 2, "{purged:?}");
    let gone = client
        .control()
        .get_run(pb::GetRunRequest { id: run.id })
        .await
        .expect_err("purged");
    assert_eq!(gone.code(), tonic::Code::NotFound);
    cluster.shutdown().await.expect("shutdown");
}

async fn an_imported_crontab_applies_as_written_and_runs(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    write(
        d,
        "crontab",
        "\
# m h dom mon dow command
MAILTO=ops@example.com
CRON_TZ=Europe/Paris
GREETING = \"hello  there\"
30 2 * * 1-5 /usr/local/bin/backup.sh --full > /dev/null 2>&1
@reboot /srv/start.sh
@hourly echo \"$GREETING\" on \\%d
SHELL=/bin/bash
0 0 1 * * echo $((40 + 2))%ignored input
",
    );
    let args = [
        "import", "crontab", "crontab", "-d", "jobs", "--app", "ops", "--prefix", "web1-",
    ];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0);
    assert_eq!(
        text(&out.stdout),
        "wrote jobs/web1-backup.yaml (line 5)\nwrote jobs/web1-echo-greeting.yaml (line 7)\n\
         wrote jobs/web1-echo-40.yaml (line 9)\n"
    );
    let warnings = text(&out.stderr);
    assert!(warnings.contains("crontab:2: MAILTO:"), "{warnings}");
    assert!(warnings.contains("crontab:6: @reboot:"), "{warnings}");

    let args = ["apply", "-f", "jobs"];
    let out = axctl(&cluster, d, &args).await;
    assert_eq!(code(&args, &out), 0, "the written files apply as they are");
    assert_eq!(text(&out.stderr), "");
    let backup = client
        .control()
        .get_workflow(pb::GetWorkflowRequest {
            name: "web1-backup".into(),
        })
        .await
        .expect("imported")
        .into_inner();
    let schedule = backup.schedule.expect("a schedule");
    assert_eq!(
        (
            schedule.cron.as_str(),
            schedule.timezone.as_str(),
            backup.app.as_str()
        ),
        ("30 2 * * 1-5", "Europe/Paris", "ops")
    );
    assert_eq!(backup.next_fires_ms.len(), 5);

    // The imported commands run as cron would run them: the environment line, `\%` as `%`,
    // SHELL as the interpreter and the text after `%` on standard input.
    for (workflow, line) in [
        ("web1-echo-greeting", "hello  there on %d"),
        ("web1-echo-40", "42"),
    ] {
        let (run, ended) = client.run_to_end(workflow).await.expect("run");
        assert_eq!(ended.state, pb::RunState::Success as i32, "{workflow}");
        let instance = client.instances(run.id).await.expect("instances")[0].id;
        let lines: Vec<String> = client
            .logs(instance)
            .await
            .expect("logs")
            .into_iter()
            .map(|l| l.text)
            .collect();
        assert_eq!(lines, [line], "{workflow}");
    }
    cluster.shutdown().await.expect("shutdown");
}
