//! The `axctl` binary against an in-process fake `ControlService`: what it prints, what it sends
//! and the exit codes scripts rely on.

mod fake;

use std::collections::HashMap;
use std::path::Path;

use ax_proto::v1 as pb;
use fake::Fake;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `axctl --server SERVER --actor tester@host ARGS` in `dir`.
async fn axctl_in(dir: &Path, server: &str, args: &[&str]) -> Out {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_axctl"))
        .current_dir(dir)
        .env_remove("AX_SERVER")
        .env("RUST_LOG", "off")
        .args(["--server", server, "--actor", "tester@host"])
        .args(args)
        .output()
        .await
        .unwrap();
    Out {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

async fn axctl(server: &str, args: &[&str]) -> Out {
    axctl_in(&std::env::temp_dir(), server, args).await
}

/// A fake that knows workflow `etl` (version 1) with a finished run 100 and its two instances.
async fn seeded() -> (Fake, String) {
    let fake = Fake::default();
    fake.with(|s| {
        s.workflows.push(fake::workflow("etl", 1));
        s.instances = vec![
            fake::instance(1, 100, "extract", pb::InstanceState::Success, Some(0)),
            fake::instance(2, 100, "load", pb::InstanceState::Failed, Some(3)),
        ];
        s.logs
            .insert(1, fake::lines(&["one", "!two", "three", "four", "!five"]));
        s.workers.push(pb::WorkerInfo {
            id: "w1".into(),
            version: "0.1.0".into(),
            labels: HashMap::from([("gpu".into(), "true".into())]),
            capacity: 20,
            running: 3,
            hostname: "box-1".into(),
            state: pb::WorkerState::Live as i32,
            scheduler_node: "node-1".into(),
            ..Default::default()
        });
    });
    let server = fake.clone().start().await;
    (fake, server)
}

/// Triggers `etl` once through the fake so run 100 exists, finished as `state`.
async fn finished_run(fake: &Fake, server: &str, state: pb::RunState) {
    fake.with(|s| s.run_script = (1, state));
    let out = axctl(server, &["trigger", "etl", "--wait"]).await;
    assert!(out.code == 0 || out.code >= 10, "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_reports_created_unchanged_updated_and_valid() {
    let fake = Fake::default();
    let server = fake.clone().start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wf.yaml"), "name: etl\n").unwrap();

    let out = axctl_in(dir.path(), &server, &["apply", "-f", "wf.yaml"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "workflow etl created (version 1)\n"),
        "{out:?}"
    );
    let out = axctl_in(dir.path(), &server, &["apply", "-f", "wf.yaml"]).await;
    assert_eq!(
        out.stdout, "workflow etl unchanged (version 1)\n",
        "{out:?}"
    );

    std::fs::write(dir.path().join("wf.yaml"), "name: etl\n# deprecated key\n").unwrap();
    let out = axctl_in(dir.path(), &server, &["apply", "-f", "wf.yaml"]).await;
    assert_eq!(out.stdout, "workflow etl updated (version 2)\n", "{out:?}");
    assert!(
        out.stderr
            .starts_with("warning: `schedule.cron_tz` is deprecated"),
        "{out:?}"
    );

    let out = axctl_in(
        dir.path(),
        &server,
        &["apply", "--dry-run", "-f", "wf.yaml"],
    )
    .await;
    assert_eq!(out.stdout, "workflow etl is valid\n", "{out:?}");

    let applies = fake.with(|s| s.applies.clone());
    assert_eq!(applies.len(), 4);
    assert_eq!(applies[0].source, "name: etl\n");
    assert_eq!(applies[0].source_name, "wf.yaml");
    assert_eq!(applies[0].actor, "tester@host");
    assert!(!applies[0].dry_run && applies[3].dry_run);
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_error_from_server_is_printed_verbatim_with_exit_4() {
    let fake = Fake::default();
    let server = fake.clone().start().await;
    let dir = tempfile::tempdir().unwrap();
    let text = "name: etl\ntasks:\n  - name: load\n    upstream: [nope]\n";
    std::fs::write(dir.path().join("bad.yaml"), text).unwrap();

    let out = axctl_in(dir.path(), &server, &["apply", "-f", "bad.yaml"]).await;
    assert_eq!(out.code, 4, "{out:?}");
    assert_eq!(
        out.stderr,
        "bad.yaml:4: tasks.load.upstream: unknown task \"nope\"\n"
    );
    assert_eq!(out.stdout, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_of_a_missing_file_names_it_and_sends_nothing() {
    let fake = Fake::default();
    let server = fake.clone().start().await;
    let out = axctl(&server, &["apply", "-f", "no/such/wf.yaml"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr
            .contains("cannot read workflow file no/such/wf.yaml"),
        "{out:?}"
    );
    assert!(fake.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn not_found_exits_3() {
    let (_fake, server) = seeded().await;
    let out = axctl(&server, &["get", "workflow", "nosuch"]).await;
    assert_eq!(out.code, 3, "{out:?}");
    assert_eq!(out.stderr, "error: workflow \"nosuch\" not found\n");
    for args in [
        &["get", "run", "999"][..],
        &["logs", "999"],
        &["pause", "nosuch"],
        &["trigger", "nosuch"],
    ] {
        let out = axctl(&server, args).await;
        assert_eq!(out.code, 3, "{args:?}: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_server_exits_5_and_names_the_address() {
    // Bind then drop a listener: the port is free and nothing answers on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let server = format!("http://{addr}");
    let out = axctl(&server, &["get", "workflows"]).await;
    assert_eq!(out.code, 5, "{out:?}");
    assert!(
        out.stderr
            .starts_with(&format!("error: cannot reach the ax server at {server}")),
        "{out:?}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn server_comes_from_ax_server_env_when_no_flag() {
    let (fake, server) = seeded().await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_axctl"))
        .env("AX_SERVER", server.trim_start_matches("http://"))
        .args(["get", "workflows"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(fake.calls(), ["ListWorkflows"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn trigger_refuses_a_bad_param_name_before_any_rpc() {
    let (fake, server) = seeded().await;
    let out = axctl(
        &server,
        &[
            "trigger",
            "etl",
            "--param",
            "DATE=1",
            "--param",
            "bad-name=x",
        ],
    )
    .await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr
            .contains("\"bad-name\" is not a valid environment variable name"),
        "{out:?}"
    );
    let out = axctl(&server, &["trigger", "etl", "--param", "novalue"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    let out = axctl(&server, &["trigger", "etl", "-p", "A=1", "-p", "A=2"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("\"A\" is given more than once"),
        "{out:?}"
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[tokio::test(flavor = "multi_thread")]
async fn trigger_prints_the_run_id_and_says_when_it_already_existed() {
    let (fake, server) = seeded().await;
    let args = [
        "trigger",
        "etl",
        "--param",
        "DATE=2024-05-01",
        "--idempotency-key",
        "k1",
    ];
    let out = axctl(&server, &args).await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "100\n"), "{out:?}");
    assert!(out.stderr.contains("run 100 created"), "{out:?}");
    let out = axctl(&server, &args).await;
    assert_eq!(out.stdout, "100\n", "{out:?}");
    assert!(out.stderr.contains("run 100 already existed"), "{out:?}");

    let triggers = fake.with(|s| s.triggers.clone());
    assert_eq!(
        triggers[0].params,
        HashMap::from([("DATE".into(), "2024-05-01".into())])
    );
    assert_eq!(triggers[0].idempotency_key, "k1");
    assert_eq!(triggers[0].actor, "tester@host");

    let out = axctl(
        &server,
        &["-o", "json", "trigger", "etl", "--idempotency-key", "k1"],
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["created"], false);
    assert_eq!(json["run"]["id"], 100);
}

#[tokio::test(flavor = "multi_thread")]
async fn trigger_refused_for_load_waits_as_hinted_says_so_and_gives_up_with_exit_8() {
    let (fake, server) = seeded().await;
    let overloaded = pb::Overloaded {
        bound: "app".into(),
        app: "etl".into(),
        waiting: 5,
        limit: 5,
        retry_after_ms: 300,
    };
    fake.with(|s| s.refuse_triggers = (2, Some(overloaded.clone())));
    let started = std::time::Instant::now();
    let out = axctl(&server, &["trigger", "etl"]).await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "100\n"), "{out:?}");
    // Two waits of at least the hint each, both said on stderr.
    assert!(started.elapsed() >= std::time::Duration::from_millis(600));
    let waits: Vec<&str> = out
        .stderr
        .lines()
        .filter(|line| line.starts_with("trigger etl: refused for load ("))
        .collect();
    assert_eq!(waits.len(), 2, "{out:?}");
    assert!(waits[0].contains("the bound is met"), "{out:?}");
    assert!(waits[0].contains("trying again in "), "{out:?}");
    assert!(
        waits[1].contains("(refusal 2, giving up after 1m)"),
        "{out:?}"
    );
    assert!(out.stderr.contains("run 100 created"), "{out:?}");
    assert_eq!(fake.with(|s| s.triggers.len()), 3);

    // Still refused when --retry-for is spent: exit 8, nothing created.
    fake.with(|s| s.refuse_triggers = (100, Some(overloaded)));
    let out = axctl(&server, &["trigger", "etl", "--retry-for", "1s"]).await;
    assert_eq!(out.code, 8, "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(out.stderr.contains("--retry-for waits longer"), "{out:?}");
    let out = axctl(&server, &["trigger", "etl", "--retry-for", "0"]).await;
    assert_eq!(out.code, 8, "{out:?}");
    assert!(!out.stderr.contains("trying again"), "{out:?}");
    assert!(out.stderr.contains("(refused once; "), "{out:?}");
    assert_eq!(fake.with(|s| s.runs.len()), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn trigger_wait_exit_code_follows_the_run() {
    for (state, code, name) in [
        (pb::RunState::Success, 0, "SUCCESS"),
        (pb::RunState::Failed, 10, "FAILED"),
        (pb::RunState::Cancelled, 11, "CANCELLED"),
    ] {
        let (fake, server) = seeded().await;
        fake.with(|s| s.run_script = (4, state));
        let out = axctl(&server, &["trigger", "etl", "--wait"]).await;
        assert_eq!(out.code, code, "{out:?}");
        // stderr is a pipe here, so progress is a line per change, not a redrawn line.
        let progress: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.starts_with("run 100 "))
            .collect();
        assert_eq!(
            progress.first(),
            Some(&"run 100 RUNNING: 0 success, 0 running, 1 waiting, 0 failed, 1 pending"),
            "{out:?}"
        );
        assert!(progress.iter().any(|l| l.contains(" 1 running")), "{out:?}");
        assert!(
            progress
                .last()
                .unwrap()
                .starts_with(&format!("run 100 {name}: ")),
            "{out:?}"
        );
        assert!(!out.stderr.contains('\r'), "{out:?}");
        let table = out.stdout.lines().nth(1).unwrap_or_default();
        assert!(table.starts_with("100 ") && table.contains(name), "{out:?}");
        let polls = fake.calls().iter().filter(|c| *c == "GetRun").count();
        assert_eq!(polls, 4);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_print_lines_in_order_with_optional_prefixes() {
    let (fake, server) = seeded().await;
    let out = axctl(&server, &["logs", "1"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "one\ntwo\nthree\nfour\nfive\n"),
        "{out:?}"
    );
    let out = axctl(&server, &["logs", "1", "--streams", "--attempt", "1", "-f"]).await;
    assert_eq!(
        out.stdout, "out|one\nerr|two\nout|three\nout|four\nerr|five\n",
        "{out:?}"
    );
    let out = axctl(&server, &["logs", "1", "--timestamps"]).await;
    let first = out.stdout.lines().next().unwrap();
    assert!(
        first.ends_with(" one") && first.len() == "2023-11-14 22:13:21 +00:00 one".len(),
        "{out:?}"
    );
    let out = axctl(&server, &["-o", "json", "logs", "1"]).await;
    let seqs: Vec<u64> = out
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(fake.calls().iter().filter(|c| *c == "GetLogs").count(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn json_and_yaml_output_parse_back() {
    let (fake, server) = seeded().await;
    finished_run(&fake, &server, pb::RunState::Failed).await;

    let out = axctl(&server, &["-o", "json", "get", "workflows"]).await;
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json[0]["name"], "etl");
    assert_eq!(json[0]["schedule"]["timezone"], "Europe/Paris");
    assert_eq!(json[0]["tasks"][1]["upstream"][0], "extract");
    assert_eq!(json[0]["next_fires"][0], "2023-11-15T01:00:00.000Z");

    let out = axctl(&server, &["-o", "yaml", "get", "run", "100"]).await;
    let docs = yaml_rust2::YamlLoader::load_from_str(&out.stdout).unwrap();
    let run = &docs[0];
    assert_eq!(run["id"].as_i64(), Some(100), "{out:?}");
    assert_eq!(run["state"].as_str(), Some("FAILED"));
    assert_eq!(run["counts"]["failed"].as_i64(), Some(1));
    assert_eq!(run["instances"][1]["task"].as_str(), Some("load"));
    assert_eq!(run["instances"][1]["exit_code"].as_i64(), Some(3));

    let out = axctl(&server, &["-o", "yaml", "get", "instance", "2"]).await;
    let docs = yaml_rust2::YamlLoader::load_from_str(&out.stdout).unwrap();
    assert_eq!(
        docs[0]["attempts"][0]["pid"].as_i64(),
        Some(4242),
        "{out:?}"
    );
    assert!(docs[0]["attempts"][0]["signal"].is_null());

    let out = axctl(&server, &["-o", "json", "workers"]).await;
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json[0]["state"], "LIVE");
    assert_eq!(json[0]["labels"]["gpu"], "true");

    let out = axctl(&server, &["-o", "json", "get", "runs"]).await;
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json[0]["triggered_by"], "tester@host");
}

#[tokio::test(flavor = "multi_thread")]
async fn tables_show_what_matters() {
    let (fake, server) = seeded().await;
    finished_run(&fake, &server, pb::RunState::Failed).await;

    let out = axctl(&server, &["get", "workflows"]).await;
    let header = out.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("NAME   APP    VERSION   SCHEDULE"),
        "{out:?}"
    );
    assert!(out.stdout.contains("0 2 * * * (Europe/Paris)"), "{out:?}");

    let out = axctl(&server, &["get", "workflow", "etl"]).await;
    assert!(out.stdout.contains("Time zone:    Europe/Paris"), "{out:?}");
    assert!(out.stdout.contains("load      extract"), "{out:?}");
    assert!(out.stdout.contains("Next fires:"), "{out:?}");

    let out = axctl(
        &server,
        &[
            "list",
            "runs",
            "--workflow",
            "etl",
            "--state",
            "failed",
            "--limit",
            "5",
        ],
    )
    .await;
    assert!(out.stdout.contains("1/2 success, 1 failed"), "{out:?}");
    let request = fake.with(|s| s.list_runs[0].clone());
    assert_eq!(
        (request.workflow.as_str(), request.state, request.limit),
        ("etl", pb::RunState::Failed as i32, 5)
    );

    let out = axctl(&server, &["get", "instances", "--run", "100"]).await;
    let rows: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{out:?}");
    assert!(
        rows[2].starts_with("2    load      FAILED    1         w1       3      "),
        "{out:?}"
    );

    let out = axctl(&server, &["get", "instance", "2"]).await;
    assert!(out.stdout.contains("ATTEMPT   STATE"), "{out:?}");
    assert!(out.stdout.contains("4242"), "{out:?}");

    let out = axctl(&server, &["workers"]).await;
    assert!(out.stdout.contains("3/20"), "{out:?}");
    assert!(out.stdout.contains("gpu=true"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_lists_the_nodes_on_the_store_clock() {
    let fake = Fake::default();
    let now = 1_767_225_600_000; // 2026-01-01T00:00:00Z
    fake.with(|s| {
        s.store_now_ms = now;
        s.nodes = vec![
            pb::NodeInfo {
                node_id: "n1".into(),
                address: "http://10.0.0.1:7070".into(),
                version: "0.1.0".into(),
                started_at_ms: now - 3_600_000,
                renewed_at_ms: now - 2_000,
                expires_at_ms: now + 8_000,
                clock_offset_ms: -35_000,
                live: true,
                workers: 3,
                pools: "etl=4".into(),
            },
            pb::NodeInfo {
                node_id: "n2".into(),
                address: "http://10.0.0.2:7070".into(),
                version: "0.1.0".into(),
                started_at_ms: now - 7_200_000,
                renewed_at_ms: now - 70_000,
                expires_at_ms: now - 60_000,
                clock_offset_ms: 4,
                live: false,
                workers: 0,
                pools: String::new(),
            },
        ];
        s.schema = ("0.2.0".into(), 22, "0.1.0".into());
        s.workers = vec![
            pb::WorkerInfo {
                id: "w-new".into(),
                version: "0.2.0".into(),
                state: pb::WorkerState::Live as i32,
                scheduler_node: "n1".into(),
                ..Default::default()
            },
            pb::WorkerInfo {
                id: "w-silent".into(),
                state: pb::WorkerState::Live as i32,
                scheduler_node: "n1".into(),
                ..Default::default()
            },
        ];
    });
    let server = fake.clone().start().await;
    let out = axctl(&server, &["cluster"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[0].starts_with("NODE") && lines[0].contains("CLOCK OFFSET"),
        "{out:?}"
    );
    assert!(
        lines[1].contains("n1")
            && lines[1].contains("LIVE")
            && lines[1].contains("renewed 2s ago")
            && lines[1].contains("-35000 ms")
            && lines[1].ends_with("etl=4"),
        "{out:?}"
    );
    assert!(
        lines[2].contains("n2") && lines[2].contains("GONE") && lines[2].contains("expired 1m ago"),
        "{out:?}"
    );
    // Each worker with its node and release; one that sent none is unknown.
    assert!(
        lines[4].starts_with("WORKER") && lines[4].contains("VERSION"),
        "{out:?}"
    );
    assert!(
        lines[5].starts_with("w-new") && lines[5].contains("0.2.0"),
        "{out:?}"
    );
    assert!(
        lines[6].starts_with("w-silent") && lines[6].contains("unknown"),
        "{out:?}"
    );
    assert_eq!(
        lines[8], "store schema: ax 0.2.0 (migration 22); nodes of ax 0.1.0 or later may run on it",
        "{out:?}"
    );
    let out = axctl(&server, &["-o", "json", "cluster"]).await;
    let nodes: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(nodes[0]["node_id"], "n1");
    assert_eq!(nodes[0]["clock_offset_ms"], -35_000);
    assert_eq!(nodes[1]["live"], false);
    assert_eq!(nodes[0]["pools"], "etl=4");
    assert_eq!(nodes[0]["store_now"], "2026-01-01T00:00:00.000Z");
    assert_eq!(nodes[0]["worker_versions"]["0.2.0"], 1);
    assert_eq!(nodes[0]["worker_versions"]["unknown"], 1);
    assert_eq!(nodes[1]["worker_versions"], serde_json::json!({}));
    assert_eq!(nodes[0]["schema_release"], "0.2.0");
    assert_eq!(nodes[0]["schema_oldest_release"], "0.1.0");
    assert_eq!(
        fake.with(|s| s.calls.clone()),
        ["ListNodes", "ListWorkers", "ListNodes", "ListWorkers"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_resume_and_cancel() {
    let (fake, server) = seeded().await;
    let out = axctl(&server, &["pause", "etl"]).await;
    assert_eq!(out.stdout, "workflow etl paused\n", "{out:?}");
    assert!(fake.with(|s| s.workflows[0].paused));
    let out = axctl(&server, &["resume", "etl"]).await;
    assert_eq!(out.stdout, "workflow etl resumed\n", "{out:?}");
    assert!(!fake.with(|s| s.workflows[0].paused));

    // A run still going can be cancelled; one that ended is a conflict (exit 6).
    fake.with(|s| s.run_script = (1000, pb::RunState::Success));
    axctl(&server, &["trigger", "etl"]).await;
    let out = axctl(&server, &["cancel", "run", "100", "--reason", "test"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "run 100 CANCELLED\n"),
        "{out:?}"
    );
    let out = axctl(&server, &["cancel", "run", "100"]).await;
    assert_eq!(out.code, 6, "{out:?}");
    assert_eq!(out.stderr, "error: run 100 already ended\n");
    let out = axctl(&server, &["cancel", "instance", "1"]).await;
    assert_eq!(out.stdout, "instance 1 CANCELLED\n", "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn mark_sets_a_state_with_a_reason_and_refuses_one_without() {
    let (fake, server) = seeded().await;
    let out = axctl(&server, &["mark", "1", "--success"]).await;
    assert_eq!(out.code, 2, "clap wants --reason: {out:?}");
    assert!(out.stderr.contains("--reason"), "{out:?}");
    let out = axctl(
        &server,
        &["mark", "1", "--failed", "--success", "--reason", "x"],
    )
    .await;
    assert_eq!(out.code, 2, "one state only: {out:?}");
    let out = axctl(
        &server,
        &["mark", "1", "--success", "--reason", "fixed by hand"],
    )
    .await;
    assert_eq!(out.stdout, "instance 1 SUCCESS (attempt 1)\n", "{out:?}");
    let out = axctl(&server, &["mark", "1", "--failed", "--reason", " "]).await;
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("needs a reason"), "{out:?}");
    assert_eq!(
        fake.calls().iter().filter(|c| *c == "MarkInstance").count(),
        2
    );
}

/// The diamond of `ax_core::render`'s golden files (workflow `etl` version 3, run 7), as the
/// server sends it.
fn diamond_dag(with_run: bool) -> pb::Dag {
    let node = |task: &str, upstream: &[&str], state: &str, id: i64| pb::DagNode {
        task: task.into(),
        state: if with_run {
            state.into()
        } else {
            String::new()
        },
        instance_id: if with_run { id } else { 0 },
        upstream: upstream.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let nodes = vec![
        node("extract", &[], "SUCCESS", 1),
        node("clean", &["extract"], "RUNNING", 2),
        node("audit", &["extract"], "FAILED", 3),
        node("load", &["clean", "audit"], "UPSTREAM_FAILED", 0),
        node("report", &["load"], "UPSTREAM_FAILED", 0),
    ];
    let edges = nodes
        .iter()
        .flat_map(|n| {
            n.upstream.iter().map(|up| pb::DagEdge {
                from: up.clone(),
                to: n.task.clone(),
            })
        })
        .collect();
    pb::Dag {
        workflow: "etl".into(),
        version: 3,
        run_id: if with_run { 7 } else { 0 },
        nodes,
        edges,
        ..Default::default()
    }
}

fn core_golden(name: &str) -> String {
    let path = format!(
        "{}/../scheduler/core/tests/golden/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn dag_prints_every_format_as_the_golden_files_say() {
    let fake = Fake::default();
    let server = fake.clone().start().await;
    for (with_run, golden) in [(false, "diamond"), (true, "diamond_run")] {
        fake.with(|s| s.views.dag = Some(diamond_dag(with_run)));
        let run_args: &[&str] = if with_run { &["--run", "7"] } else { &[] };
        for (format, ext) in [
            (None, "txt"),
            (Some("ascii"), "txt"),
            (Some("dot"), "dot"),
            (Some("mermaid"), "mmd"),
            (Some("json"), "json"),
        ] {
            let mut args = vec!["dag", "etl"];
            args.extend(run_args);
            if let Some(format) = format {
                args.extend(["-o", format]);
            }
            let out = axctl(&server, &args).await;
            assert_eq!(out.code, 0, "{out:?}");
            // Not a terminal: no colours, whatever the states.
            assert_eq!(
                out.stdout,
                core_golden(&format!("{golden}.{ext}")),
                "{args:?}"
            );
        }
    }
    let requests = fake.with(|s| s.views.dag_requests.clone());
    assert_eq!(requests.last().unwrap().run_id, 7);
    assert_eq!(requests[0].run_id, 0);

    let out = axctl(&server, &["dag", "etl", "-o", "yaml"]).await;
    assert!(out.stdout.contains("workflow: etl"), "{out:?}");
    let out = axctl(&server, &["dag", "nope"]).await;
    assert_eq!(out.code, 3, "{out:?}");
    // The graph formats belong to `dag` alone, and nothing is called with them elsewhere.
    let out = axctl(&server, &["workers", "-o", "dot"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(!fake.calls().contains(&"ListWorkers".to_string()));
}

fn explanation() -> pb::Explanation {
    pb::Explanation {
        workflow: "etl".into(),
        version: 1,
        at_ms: 1_769_823_000_000,
        timezone: "Europe/Paris".into(),
        schedule: Some(pb::ExplainedSchedule {
            trigger: pb::TriggerKind::Cron as i32,
            cron: "30 2 * * *".into(),
            timezone: "Europe/Paris".into(),
            misfire: "fire_once".into(),
            overlap: "skip".into(),
            previous_slot_ms: 1_769_823_000_000,
            next_slot_ms: 1_769_909_400_000,
            ..Default::default()
        }),
        verdict: vec![
            "the slot at 2026-01-31 02:30:00 CET was skipped: an earlier run was still active"
                .into(),
        ],
        decisions: vec![pb::DecisionEntry {
            at_ms: 1_769_823_000_000,
            slot_at_ms: 1_769_823_000_000,
            kind: "skipped_overlap".into(),
            detail: "run 40 still running".into(),
            text: "slot 2026-01-31 02:30:00 CET: skipped_overlap: run 40 still running".into(),
            ..Default::default()
        }],
        run: Some(pb::Run {
            id: 40,
            workflow: "etl".into(),
            state: pb::RunState::Running as i32,
            trigger: pb::TriggerKind::Cron as i32,
            logical_time_ms: 1_769_736_600_000,
            ..Default::default()
        }),
        tasks: vec![
            pb::ExplainedTask {
                task: "extract".into(),
                state: "RUNNING".into(),
                instance_id: 11,
                attempt: 1,
                worker_id: "w1".into(),
                reason: "running".into(),
                text: "running on worker w1 since 2026-01-30 02:30:01 CET".into(),
            },
            pb::ExplainedTask {
                task: "load".into(),
                state: "PENDING".into(),
                reason: "waiting_upstream".into(),
                text: "waiting on upstream extract (RUNNING)".into(),
                ..Default::default()
            },
        ],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn why_prints_one_screen_and_reads_at_in_the_workflow_time_zone() {
    let (fake, server) = seeded().await;
    fake.with(|s| s.views.explanation = Some(explanation()));
    let out = axctl(&server, &["why", "etl"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    for expected in [
        "Workflow:       etl (version 1)\n",
        "Schedule:       cron \"30 2 * * *\" in Europe/Paris, misfire fire_once, overlap skip\n",
        "State:          active\n",
        "Previous slot:  2026-01-31 02:30:00 CET\n",
        "  - the slot at 2026-01-31 02:30:00 CET was skipped: an earlier run was still active\n",
        "skipped_overlap   slot 2026-01-31 02:30:00 CET: skipped_overlap: run 40 still running\n",
        "Run 40 (cron, logical time 2026-01-30 02:30:00 CET): RUNNING\n",
        "extract   RUNNING   11 (attempt 1)   w1       running on worker w1 since",
        "load      PENDING   -                -        waiting on upstream extract (RUNNING)\n",
    ] {
        assert!(
            out.stdout.contains(expected),
            "{expected:?} missing in\n{}",
            out.stdout
        );
    }
    assert_eq!(fake.with(|s| s.views.explain_requests[0].at_ms), 0, "now");

    // --utc: the same screen with every time in UTC, and tables too.
    let out = axctl(&server, &["--utc", "why", "etl"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout
            .contains("Previous slot:  2026-01-31 01:30:00 UTC\n"),
        "{}",
        out.stdout
    );
    let out = axctl(&server, &["--utc", "get", "instance", "1"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains(" +00:00"), "{}", out.stdout);
    // AX_UTC=1 does as --utc (a shell's way of saying yes).
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_axctl"))
        .env("AX_UTC", "1")
        .env("RUST_LOG", "off")
        .args(["--server", &server, "why", "etl"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("Previous slot:  2026-01-31 01:30:00 UTC\n"),
        "{output:?}"
    );

    // A wall time is read in the workflow's zone (Europe/Paris, UTC+1 in January).
    let out = axctl(&server, &["why", "etl", "--at", "2026-01-31T02:30"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = axctl(
        &server,
        &["why", "etl", "--at", "2026-01-31T01:30:00Z", "-o", "json"],
    )
    .await;
    let value: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(value["tasks"][1]["reason"], "waiting_upstream");
    assert_eq!(value["decisions"][0]["kind"], "skipped_overlap");
    assert_eq!(value["run"]["id"], 40);
    let asked: Vec<i64> = fake.with(|s| s.views.explain_requests.iter().map(|r| r.at_ms).collect());
    // (The first three are the screens of now: in the zone, with --utc and with AX_UTC.)
    assert_eq!(asked[3..], [1_769_823_000_000, 1_769_823_000_000]);

    let out = axctl(&server, &["why", "etl", "--at", "yesterday"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--at \"yesterday\""), "{out:?}");
    // 1970 would be at_ms 0, which the server reads as "now": refused, nothing asked.
    let before = fake.with(|s| s.views.explain_requests.len());
    let out = axctl(&server, &["why", "etl", "--at", "1970-01-01T00:00:00Z"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("before 1971-01-01T00:00:00Z"),
        "{out:?}"
    );
    assert_eq!(fake.with(|s| s.views.explain_requests.len()), before);
    let out = axctl(&server, &["why", "nope"]).await;
    assert_eq!(out.code, 3, "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_lists_rows_and_passes_its_filters() {
    let fake = Fake::default();
    fake.with(|s| {
        s.views.audit = vec![
            pb::AuditEntry {
                at_ms: 1_700_000_002_000,
                actor: "bob@box".into(),
                action: "pause".into(),
                target: "workflow/etl".into(),
                detail: String::new(),
                remote: "10.0.0.2:5555".into(),
                token: "ops".into(),
            },
            pb::AuditEntry {
                at_ms: 1_700_000_001_000,
                actor: "alice@box".into(),
                action: "trigger".into(),
                target: "workflow/etl".into(),
                detail: "run 7".into(),
                remote: "10.0.0.1:4444".into(),
                token: String::new(),
            },
        ];
    });
    let server = fake.clone().start().await;
    let out = axctl(&server, &["audit"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out:?}");
    assert!(
        lines[0].starts_with("WHEN") && lines[0].ends_with("DETAIL"),
        "{out:?}"
    );
    assert!(
        lines[0].contains("WHO") && lines[0].contains("FROM"),
        "{out:?}"
    );
    assert!(
        lines[1].contains("bob@box") && lines[1].contains("10.0.0.2:5555"),
        "{out:?}"
    );
    assert!(lines[2].ends_with("run 7"), "{out:?}");

    let args = [
        "audit",
        "--action",
        "trigger",
        "--target",
        "workflow/etl",
        "--by",
        "alice@box",
        "--limit",
        "5",
        "-o",
        "json",
    ];
    let out = axctl(&server, &args).await;
    let value: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(value.as_array().unwrap().len(), 1);
    assert_eq!(value[0]["remote"], "10.0.0.1:4444");
    let request = fake.with(|s| s.views.audit_requests[1].clone());
    assert_eq!(
        (
            request.limit,
            request.action.as_str(),
            request.target.as_str(),
            request.actor.as_str()
        ),
        (5, "trigger", "workflow/etl", "alice@box")
    );
    assert_eq!(axctl(&server, &["audit", "--limit", "0"]).await.code, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn backfill_reads_times_in_the_workflow_time_zone_and_refuses_bad_ones() {
    let (fake, server) = seeded().await;
    // `etl` runs in Europe/Paris: midnight there is 23:00 UTC the day before.
    let out = axctl(
        &server,
        &[
            "backfill",
            "etl",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01T02:00",
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("dry run: 3 slots of etl"), "{out:?}");
    let sent = fake.with(|s| s.backfills.clone());
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (
            sent[0].from_ms,
            sent[0].to_ms,
            sent[0].dry_run,
            sent[0].max_runs
        ),
        (1_767_222_000_000, 1_767_229_200_000, true, 0)
    );
    assert_eq!(sent[0].actor, "tester@host");

    // A bare date as --to takes in its whole day: January, given as its first and last days,
    // ends a millisecond before February begins in Paris.
    let out = axctl(
        &server,
        &[
            "backfill",
            "etl",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-31",
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let sent = fake.with(|s| s.backfills.clone());
    assert_eq!(
        (sent[1].from_ms, sent[1].to_ms),
        (1_767_222_000_000, 1_769_900_400_000 - 1)
    );

    let out = axctl(
        &server,
        &[
            "backfill",
            "etl",
            "--from",
            "last week",
            "--to",
            "2026-01-01",
        ],
    )
    .await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--from \"last week\""), "{out:?}");
    let out = axctl(
        &server,
        &[
            "backfill",
            "nope",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    )
    .await;
    assert_eq!(out.code, 3, "{out:?}");
    let out = axctl(
        &server,
        &[
            "backfill",
            "etl",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--max",
            "0",
        ],
    )
    .await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--max 0: give at least 1"), "{out:?}");
    let help = axctl(&server, &["audit", "--help"]).await;
    assert!(help.stdout.contains("backfill"), "{help:?}");
    assert_eq!(
        fake.with(|s| s.backfills.len()),
        2,
        "refusals send no backfill"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_sends_the_age_and_shows_the_counts_and_refuses_bad_ages() {
    let (fake, server) = seeded().await;
    let out = axctl(&server, &["purge", "--older-than", "90d", "--dry-run"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("dry run:"), "{out:?}");
    assert!(out.stdout.contains("nothing was deleted"), "{out:?}");
    for line in [
        "runs:        12",
        "instances:   24",
        "attempts:    25",
        "log chunks:  24",
        "decisions:   3",
    ] {
        assert!(out.stdout.contains(line), "{line:?} in {out:?}");
    }
    assert!(out.stdout.contains("kept (retention: forever"), "{out:?}");
    assert!(out.stdout.contains("ledger"), "{out:?}");

    let out = axctl(
        &server,
        &[
            "purge",
            "--older-than",
            "1d12h",
            "--workflow",
            "etl",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let value: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(value["dry_run"], false);
    assert_eq!(value["runs"], 12);
    assert_eq!(value["log_chunks"], 24);
    assert_eq!(value["ended_before"], "2025-12-30T12:00:00.000Z");
    let sent = fake.with(|s| s.purges.clone());
    assert_eq!(sent.len(), 2);
    assert_eq!(
        (
            sent[0].older_than_ms,
            sent[0].dry_run,
            sent[0].workflow.as_str()
        ),
        (90 * 86_400_000, true, "")
    );
    assert_eq!(
        (
            sent[1].older_than_ms,
            sent[1].dry_run,
            sent[1].workflow.as_str()
        ),
        (36 * 3_600_000, false, "etl")
    );
    assert_eq!(sent[1].actor, "tester@host");

    let out = axctl(
        &server,
        &["purge", "--older-than", "90d", "--workflow", "nope"],
    )
    .await;
    assert_eq!(out.code, 3, "{out:?}");
    for (age, says) in [
        ("90", "has no unit"),
        ("0d", "more than zero"),
        ("soon", "invalid duration"),
    ] {
        let out = axctl(&server, &["purge", "--older-than", age]).await;
        assert_eq!(out.code, 2, "{age}: {out:?}");
        assert!(out.stderr.contains(says), "{age}: {out:?}");
    }
    let out = axctl(&server, &["purge"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--older-than"), "{out:?}");
    assert_eq!(
        fake.with(|s| s.purges.len()),
        3,
        "refused ages send no purge"
    );
}

/// Runs `axctl --server SERVER ARGS` with stdout and stderr on a pseudo-terminal, and answers
/// its exit code and the bytes the terminal received (the line discipline's output processing
/// off, so they are the bytes axctl wrote).
async fn axctl_on_terminal(server: &str, args: &[&str]) -> (i32, Vec<u8>) {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_axctl"));
    command
        .env_remove("AX_SERVER")
        .env("RUST_LOG", "off")
        .args(["--server", server])
        .args(args)
        .stdin(std::process::Stdio::null());
    let run = tokio::task::spawn_blocking(move || {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty writes two new descriptors; the null pointers ask for defaults.
        let opened = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors are fresh and owned here alone.
        let (mut master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                std::fs::File::from_raw_fd(slave),
            )
        };
        // SAFETY: termios is plain data, filled in by tcgetattr on our own terminal.
        unsafe {
            use std::os::fd::AsRawFd;
            let mut modes: libc::termios = std::mem::zeroed();
            assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut modes), 0);
            modes.c_oflag &= !libc::OPOST;
            assert_eq!(libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &modes), 0);
        }
        command.stdout(slave.try_clone().unwrap()).stderr(slave);
        let mut child = command.spawn().unwrap();
        // Only the child holds the terminal now: reading ends (EIO) once it exits.
        drop(command);
        let mut out = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match master.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buffer[..n]),
                Err(err) if err.raw_os_error() == Some(libc::EIO) => break,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => panic!("reading the terminal: {err}"),
            }
        }
        let status = child.wait().unwrap();
        (status.code().unwrap_or(-1), out)
    });
    tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("axctl ends")
        .unwrap()
}

/// What a task or a caller can send that a terminal would act on: a window title (OSC 0), a
/// clear screen, a clipboard write (OSC 52), a carriage return forging a stderr line, a
/// bidirectional override.
const HOSTILE: [&str; 5] = [
    "\x1b]0;pwned-title\x07hello",
    "\x1b[2J\x1b[Hcleared",
    "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07copied",
    "x\rerr|forged",
    "bidi \u{202e}txt.exe",
];

fn has_control(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.chars()
        .any(|c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c))
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_terminal_logs_audit_and_runs_show_control_characters_escaped() {
    let (fake, server) = seeded().await;
    fake.with(|s| {
        s.logs.insert(1, fake::lines(&HOSTILE));
        s.views.audit = vec![pb::AuditEntry {
            at_ms: 1_700_000_002_000,
            actor: "eve\x1b]0;admin\x07@box".into(),
            action: "trigger".into(),
            target: "workflow/etl".into(),
            detail: "\x1b]52;c;cm0gLXJmIH4=\x07".into(),
            remote: "10.0.0.2:5555".into(),
            token: "ops".into(),
        }];
        s.runs.push(fake::FakeRun {
            run: pb::Run {
                id: 7,
                workflow: "etl".into(),
                state: pb::RunState::Success as i32,
                triggered_by: "mallory\r\x1b[2K".into(),
                params: [("note".to_string(), "a\nb\x1b[31m".to_string())].into(),
                ..Default::default()
            },
            polls: 0,
            ends_after: 0,
            final_state: pb::RunState::Success,
        });
    });

    let (code, out) = axctl_on_terminal(&server, &["logs", "1"]).await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out));
    let text = String::from_utf8(out.clone()).unwrap();
    assert!(!has_control(&out), "{text:?}");
    // On a terminal each line says its stream; a forged prefix is text after the real one.
    assert_eq!(
        text,
        "out|\\u001b]0;pwned-title\\u0007hello\n\
         out|\\u001b[2J\\u001b[Hcleared\n\
         out|\\u001b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\u0007copied\n\
         out|x\\u000derr|forged\n\
         out|bidi \\u202etxt.exe\n"
    );
    let (_, out) = axctl_on_terminal(&server, &["logs", "1", "--raw"]).await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("\x1b]0;pwned-title\x07hello\n"),
        "--raw writes the bytes as stored, without prefixes"
    );

    // `--raw` keeps the bytes, on a terminal too.
    let (_, out) = axctl_on_terminal(&server, &["logs", "1", "--raw"]).await;
    assert_eq!(out, format!("{}\n", HOSTILE.join("\n")).into_bytes());

    // Piped, a plain log is the task's bytes; with a prefix it is escaped.
    let piped = axctl(&server, &["logs", "1"]).await;
    assert_eq!(piped.stdout, format!("{}\n", HOSTILE.join("\n")));
    let piped = axctl(&server, &["logs", "1", "--streams"]).await;
    assert!(!has_control(piped.stdout.as_bytes()), "{piped:?}");
    assert!(
        piped.stdout.contains("out|x\\u000derr|forged\n"),
        "{piped:?}"
    );

    for args in [
        &["audit"][..],
        &["audit", "-o", "json"],
        &["get", "runs"],
        &["get", "run", "7"],
        &["get", "run", "7", "-o", "yaml"],
    ] {
        let (code, out) = axctl_on_terminal(&server, args).await;
        let text = String::from_utf8_lossy(&out);
        assert_eq!(code, 0, "{args:?}: {text}");
        assert!(!has_control(&out), "{args:?}: {text:?}");
        assert!(text.contains("\\u001b"), "{args:?}: {text:?}");
    }
    // A table's cells are escaped in a pipe too: a line break cannot forge a row.
    let piped = axctl(&server, &["get", "runs"]).await;
    assert!(
        piped.stdout.contains("mallory\\u000d\\u001b[2K"),
        "{piped:?}"
    );
    let (_, out) = axctl_on_terminal(&server, &["audit", "--raw"]).await;
    assert!(
        String::from_utf8_lossy(&out).contains("\x1b]52;c;cm0gLXJmIH4=\x07"),
        "--raw keeps the audit detail's bytes"
    );
}

/// Writes `files` (path, text) under `dir`, making folders as needed.
fn write_tree(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_of_a_folder_sends_its_workflow_files_in_one_call_in_path_order() {
    let fake = Fake::default();
    let server = fake.clone().start().await;
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[
            ("wf/z.yaml", "name: zeta\n"),
            ("wf/sub/a.yml", "name: alpha\n"),
            ("wf/b.yaml", "name: beta\n"),
            ("wf/.hidden.yaml", "name: hidden\n"),
            ("wf/.git/c.yaml", "name: in-git\n"),
            ("wf/notes.txt", "name: notes\n"),
        ],
    );
    let out = axctl_in(dir.path(), &server, &["apply", "-f", "wf"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout,
        "workflow beta created (version 1)\nworkflow alpha created (version 1)\n\
         workflow zeta created (version 1)\n"
    );
    let sets = fake.with(|s| s.set_applies.clone());
    assert_eq!(fake.calls(), ["ApplyWorkflows"]);
    let sent: Vec<(&str, &str)> = sets[0]
        .files
        .iter()
        .map(|f| (f.source_name.as_str(), f.source.as_str()))
        .collect();
    assert_eq!(
        sent,
        [
            ("wf/b.yaml", "name: beta\n"),
            ("wf/sub/a.yml", "name: alpha\n"),
            ("wf/z.yaml", "name: zeta\n")
        ]
    );
    assert!(!sets[0].dry_run && !sets[0].prune && sets[0].actor == "tester@host");

    // Again: nothing changes, said per workflow; as JSON, a view of the set.
    let out = axctl_in(dir.path(), &server, &["-o", "json", "apply", "-f", "wf"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["files"][0]["outcome"], "UNCHANGED");
    assert_eq!(json["files"][0]["file"], "wf/b.yaml");

    // A dry run says what applying would do, storing nothing.
    write_tree(dir.path(), &[("wf/b.yaml", "name: beta\nowner: me\n")]);
    let out = axctl_in(dir.path(), &server, &["apply", "--dry-run", "-f", "wf"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout,
        "workflow beta would be updated (version 1 to 2)\nworkflow alpha unchanged (version 1)\n\
         workflow zeta unchanged (version 1)\n"
    );
    assert!(fake.with(|s| s.set_applies[2].dry_run));

    // An empty folder is refused before any call (with --prune it would delete everything).
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let out = axctl_in(dir.path(), &server, &["apply", "-f", "empty"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr
            .contains("no workflow files (.yaml, .yml) under empty")
    );
    assert_eq!(fake.calls().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_folder_with_bad_files_prints_every_error_on_its_line_and_exits_4() {
    let fake = Fake::default();
    let server = fake.clone().start().await;
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[
            ("wf/a.yaml", "name: a\ntasks: [nope]\n"),
            ("wf/b.yaml", "name: b\n"),
            ("wf/c.yaml", "tasks: []\n"),
        ],
    );
    let out = axctl_in(dir.path(), &server, &["apply", "-f", "wf"]).await;
    assert_eq!(out.code, 4, "{out:?}");
    assert_eq!(
        out.stderr,
        "wf/a.yaml:2: tasks.load.upstream: unknown task \"nope\"\nwf/c.yaml:1: name: missing\n"
    );
    assert!(fake.with(|s| s.workflows.is_empty()), "nothing stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_needs_an_app_and_deletes_that_apps_workflows_the_folder_lacks() {
    let (fake, server) = seeded().await;
    fake.with(|s| {
        let mut other = fake::workflow("books", 1);
        other.app = "finance".into();
        s.workflows.push(other);
    });
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &[("wf/new.yaml", "name: fresh\napp: data\n")]);
    let out = axctl_in(dir.path(), &server, &["apply", "-f", "wf", "--prune"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--app"), "{out:?}");

    let out = axctl_in(
        dir.path(),
        &server,
        &["apply", "-f", "wf", "--prune", "--app", "data"],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout,
        "workflow fresh created (version 1)\nworkflow etl deleted (app data, version 1: no file \
         declares it; its runs are kept)\n"
    );
    let sets = fake.with(|s| s.set_applies.clone());
    assert!(sets[0].prune && sets[0].app == "data");
    let names: Vec<String> = fake.with(|s| s.workflows.iter().map(|w| w.name.clone()).collect());
    assert_eq!(names, ["books", "fresh"], "finance's workflow is kept");
}

#[tokio::test(flavor = "multi_thread")]
async fn diff_shows_what_apply_would_change_and_exits_12_until_it_is_applied() {
    let (fake, server) = seeded().await;
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[
            ("wf/etl.yaml", "name: etl\ntasks: [a, b]\n"),
            ("wf/new.yaml", "name: new\n"),
        ],
    );
    fake.with(|s| s.workflows[0].source = "name: etl\ntasks: [a]\n".into());
    let out = axctl_in(
        dir.path(),
        &server,
        &["diff", "-f", "wf", "--prune", "--app", "data"],
    )
    .await;
    assert_eq!(out.code, 12, "{out:?}");
    assert_eq!(
        out.stdout,
        "\
workflow etl: changed (version 1 to 2) by wf/etl.yaml
--- workflow/etl (version 1, stored)
+++ wf/etl.yaml
@@ -1,2 +1,2 @@
 name: etl
-tasks: [a]
+tasks: [a, b]
workflow new: created from wf/new.yaml
--- /dev/null
+++ wf/new.yaml
@@ -0,0 +1 @@
+name: new
1 to create, 1 to change, 0 to delete, 0 unchanged
"
    );
    let sets = fake.with(|s| s.set_applies.clone());
    assert!(sets[0].dry_run, "a diff stores nothing");
    assert_eq!(fake.with(|s| s.workflows.len()), 1);

    let out = axctl_in(dir.path(), &server, &["apply", "-f", "wf"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = axctl_in(dir.path(), &server, &["diff", "-f", "wf"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout
            .ends_with("0 to create, 0 to change, 0 to delete, 2 unchanged\n"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_workflow_deletes_and_refuses_one_with_runs_unless_told_to_cancel_them() {
    let (fake, server) = seeded().await;
    fake.with(|s| s.workflows.push(fake::workflow("busy", 3)));
    let out = axctl(&server, &["delete", "workflow", "etl"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout,
        "workflow etl deleted (version 1); its runs are kept\n"
    );
    let out = axctl(&server, &["delete", "workflow", "etl"]).await;
    assert_eq!(out.code, 3, "{out:?}");
    let out = axctl(&server, &["delete", "workflow", "busy"]).await;
    assert_eq!(out.code, 6, "{out:?}");
    assert!(out.stderr.contains("unfinished runs"), "{out:?}");
    let out = axctl(&server, &["delete", "workflow", "busy", "--cancel-runs"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout,
        "run 7 cancelled\nworkflow busy deleted (version 3); its runs are kept\n"
    );
    let deletes = fake.with(|s| s.deletes.clone());
    assert_eq!(deletes.len(), 4);
    assert!(deletes[3].cancel_runs && deletes[3].actor == "tester@host");
}

#[tokio::test(flavor = "multi_thread")]
async fn import_crontab_writes_a_file_per_entry_warns_and_refuses_bad_lines() {
    let fake = Fake::default();
    let server = fake.clone().start().await;
    let dir = tempfile::tempdir().unwrap();
    let crontab = "\
MAILTO=ops@example.com
CRON_TZ=Asia/Shanghai
# backups
30 2 * * * /usr/local/bin/backup.sh --full
@reboot /srv/start.sh
@hourly php artisan schedule:run
";
    write_tree(dir.path(), &[("crontab", crontab)]);
    let out = axctl_in(
        dir.path(),
        &server,
        &["import", "crontab", "crontab", "-d", "jobs", "--app", "ops"],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout,
        "wrote jobs/backup.yaml (line 4)\nwrote jobs/artisan-schedule-run.yaml (line 6)\n"
    );
    let warnings: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(warnings.len(), 2, "{out:?}");
    assert!(warnings[0].starts_with("warning: crontab:1: MAILTO:"));
    assert!(warnings[1].starts_with("warning: crontab:5: @reboot:"));
    let backup = std::fs::read_to_string(dir.path().join("jobs/backup.yaml")).unwrap();
    assert!(backup.contains("name: backup\napp: ops\n"), "{backup}");
    assert!(backup.contains("  cron: \"30 2 * * *\"\n  timezone: \"Asia/Shanghai\"\n"));
    assert!(backup.contains("    command: \"/usr/local/bin/backup.sh --full\"\n"));
    assert!(fake.calls().is_empty(), "an import is offline");

    // The files are there: a second import refuses to overwrite them, writing nothing.
    let out = axctl_in(
        dir.path(),
        &server,
        &["import", "crontab", "crontab", "--output-dir", "jobs"],
    )
    .await;
    assert_eq!(out.code, 6, "{out:?}");
    assert!(
        out.stderr
            .contains("exist already (--force overwrites them)")
    );

    // A line that does not parse: every error with its line, no file written.
    write_tree(
        dir.path(),
        &[("bad", "0 2 * * * ok\n61 * * * * x\n0 2 *\n")],
    );
    let out = axctl_in(
        dir.path(),
        &server,
        &["import", "crontab", "bad", "-d", "bad-out"],
    )
    .await;
    assert_eq!(out.code, 4, "{out:?}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines[0].starts_with("bad:2: schedule: "), "{out:?}");
    assert!(lines[1].starts_with("bad:3: entry: "), "{out:?}");
    assert!(!dir.path().join("bad-out").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_command_says_what_it_does_in_the_help() {
    let out = axctl("http://127.0.0.1:1", &["--help"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let commands: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .collect();
    assert!(commands.len() > 20, "{out:?}");
    for line in commands {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default();
        assert!(
            words.next().is_some(),
            "`axctl {name}` has no description in --help:\n{}",
            out.stdout
        );
    }
}
