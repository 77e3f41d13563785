//! Triggers with parameters and idempotency keys, driven through the real `axctl trigger`
//! binary against an in-process scheduler with real workers. Every scenario runs on SQLite, and
//! on MySQL when `AX_TEST_MYSQL_URL` is set. Needs `cargo build --bins` first.

use std::process::Output;
use std::time::Duration;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

/// A hang guard, not a timing assertion.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// axctl's exit codes (ctl/src/error.rs).
const EXIT_USAGE: i32 = 2;
const EXIT_NOT_FOUND: i32 = 3;
const EXIT_INVALID_ARGUMENT: i32 = 4;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        every_task_sees_the_params_and_its_run_through_axctl,
        a_repeated_idempotency_key_returns_the_existing_run_through_axctl,
        bad_params_are_refused_with_their_name_and_create_nothing,
        declared_params_fill_triggers_and_the_runs_nobody_gave_params_to,
    )
}

async fn cluster(backend: Backend) -> (Cluster, TestClient) {
    let cluster = Cluster::builder(backend)
        .redis()
        .worker("w1", 4)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

/// Runs axctl on a blocking thread (the scheduler it talks to lives in this runtime).
async fn axctl(cluster: &Cluster, args: &[&str]) -> Output {
    let mut command =
        std::process::Command::new(ax_integration_tests::binary("axctl").expect("axctl is built"));
    command.args(args).env("AX_SERVER", cluster.endpoint());
    tokio::time::timeout(
        RUN_TIMEOUT,
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

fn code(output: &Output) -> i32 {
    output.status.code().expect("axctl exited, not killed")
}

/// `axctl trigger ARGS…` that must succeed; returns the run id it printed and its stderr.
async fn trigger_ok(cluster: &Cluster, args: &[&str]) -> (i64, String) {
    let mut full = vec!["trigger"];
    full.extend_from_slice(args);
    let out = axctl(cluster, &full).await;
    assert_eq!(
        code(&out),
        0,
        "axctl {full:?}\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let id = text(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a run id on stdout, got {:?}", text(&out.stdout)));
    (id, text(&out.stderr))
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("a valid time")
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// One line per task: the params and the facts about its attempt, as the task's shell sees them.
const SHOW: &str = r#"echo "city=$AX_PARAM_CITY note=$AX_PARAM_note run=$AX_RUN_ID instance=$AX_INSTANCE_ID attempt=$AX_ATTEMPT time=$AX_LOGICAL_TIME""#;

async fn every_task_sees_the_params_and_its_run_through_axctl(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    // `second` fails its first attempt on purpose, so AX_ATTEMPT is seen to change.
    let source = format!(
        "name: params
tasks:
  - name: first
    command: '{show}'
  - name: second
    upstream: [first]
    retries: 1
    retry_backoff: 0s
    command: '{show}; test \"$AX_ATTEMPT\" = 2'
",
        show = SHOW.replace('\'', "''")
    );
    client.apply(&source).await.expect("apply");
    // A value with spaces, quotes and a `$`: passed as data, never expanded again.
    let note = r#"a b "q" $HOME"#;
    let note_arg = format!("note={note}");
    let (id, stderr) = trigger_ok(
        &cluster,
        &[
            "params",
            "--param",
            "CITY=Lyon",
            "--param",
            &note_arg,
            "--idempotency-key",
            "order-1",
        ],
    )
    .await;
    assert!(stderr.contains("created"), "{stderr}");
    let run = client.wait_run(id).await.expect("run ends");
    assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
    assert_eq!(run.idempotency_key, "order-1");
    assert_eq!(run.params.get("CITY").map(String::as_str), Some("Lyon"));
    assert_eq!(run.params.get("note").map(String::as_str), Some(note));

    let instances = client.instances(id).await.expect("instances");
    assert_eq!(instances.len(), 2);
    for instance in &instances {
        let attempt = if instance.task == "second" { 2 } else { 1 };
        assert_eq!(instance.attempt, attempt, "{}", instance.task);
        let lines = client.logs(instance.id).await.expect("logs");
        let lines: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        let expected = format!(
            "city=Lyon note={note} run={id} instance={} attempt={attempt} time={}",
            instance.id,
            rfc3339(run.logical_time_ms)
        );
        assert_eq!(lines, [expected.as_str()], "{}", instance.task);
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn a_repeated_idempotency_key_returns_the_existing_run_through_axctl(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    client
        .apply("name: keyed\ntasks:\n  - name: a\n    command: 'echo $AX_PARAM_N'\n")
        .await
        .expect("apply");
    let (first, stderr) = trigger_ok(
        &cluster,
        &["keyed", "--param", "N=1", "--idempotency-key", "order-42"],
    )
    .await;
    assert!(stderr.contains("created"), "{stderr}");

    // The same key again, while the run may still be going: the same run, said so, exit 0.
    let (again, stderr) = trigger_ok(
        &cluster,
        &["keyed", "--param", "N=1", "--idempotency-key", "order-42"],
    )
    .await;
    assert_eq!(again, first);
    assert!(
        stderr.contains("already existed") && stderr.contains("order-42"),
        "{stderr}"
    );
    let ended = client.wait_run(first).await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);

    // After the run ended, and with other params: still that run; the key decides, and the
    // first trigger's params stay.
    let out = axctl(
        &cluster,
        &[
            "-o",
            "json",
            "trigger",
            "keyed",
            "--param",
            "N=2",
            "--idempotency-key",
            "order-42",
        ],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
    assert_eq!(view["created"], false, "{view}");
    assert_eq!(view["run"]["id"], first, "{view}");
    let runs = client.runs("keyed").await.expect("runs");
    assert_eq!(runs.len(), 1, "nothing new was created: {runs:?}");
    assert_eq!(runs[0].params.get("N").map(String::as_str), Some("1"));
    let instances = client.instances(first).await.expect("instances");
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].attempts.len(), 1, "the task ran once");

    // Another key is another run.
    let (other, _) = trigger_ok(&cluster, &["keyed", "--idempotency-key", "order-43"]).await;
    assert_ne!(other, first);
    assert_eq!(client.runs("keyed").await.expect("runs").len(), 2);
    client.wait_run(other).await.expect("run ends");
    cluster.shutdown().await.expect("shutdown");
}

async fn bad_params_are_refused_with_their_name_and_create_nothing(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    client
        .apply("name: strict\ntasks:\n  - name: a\n    command: 'true'\n")
        .await
        .expect("apply");

    // A name that cannot be an environment variable: axctl refuses it before any call.
    for bad in ["1ABC", "bad-name", "A.B"] {
        let param = format!("{bad}=x");
        let out = axctl(
            &cluster,
            &["trigger", "strict", "--param", &param, "--param", "OK=1"],
        )
        .await;
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), EXIT_USAGE, "{stderr}");
        assert!(stderr.contains(&format!("{bad:?}")), "{stderr}");
        assert!(stderr.contains("environment variable name"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    // The server refuses it too, for clients other than axctl.
    let status = client
        .control()
        .trigger_workflow(pb::TriggerWorkflowRequest {
            name: "strict".into(),
            params: [("bad-name".to_string(), "x".to_string())].into(),
            idempotency_key: "k".into(),
            actor: "tester".into(),
            logical_time_ms: 0,
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("\"bad-name\""),
        "{}",
        status.message()
    );

    // Limits the server enforces, each an invalid-argument exit naming what was wrong.
    let many: Vec<String> = (0..257).map(|i| format!("P{i}=x")).collect();
    let mut too_many = vec!["trigger", "strict"];
    for param in &many {
        too_many.extend(["--param", param.as_str()]);
    }
    let big = format!("BIG={}", "v".repeat(64 * 1024 + 1));
    let chunk = "v".repeat(60 * 1024);
    let parts: Vec<String> = (0..5).map(|i| format!("PART{i}={chunk}")).collect();
    let mut too_large_in_all = vec!["trigger", "strict"];
    for param in &parts {
        too_large_in_all.extend(["--param", param.as_str()]);
    }
    let long_key = "k".repeat(256);
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            too_many,
            EXIT_INVALID_ARGUMENT,
            "too many params: 257 (max 256)",
        ),
        (
            vec!["trigger", "strict", "--param", &big],
            EXIT_INVALID_ARGUMENT,
            "param \"BIG\": the value is 65537 bytes (max 65536)",
        ),
        (
            too_large_in_all,
            EXIT_INVALID_ARGUMENT,
            "in all (max 262144)",
        ),
        (
            vec!["trigger", "strict", "--idempotency-key", &long_key],
            EXIT_INVALID_ARGUMENT,
            "idempotency_key is 256 bytes",
        ),
        (
            vec!["trigger", "ghost", "--param", "A=1"],
            EXIT_NOT_FOUND,
            "ghost",
        ),
    ];
    for (args, exit, message) in cases {
        let out = axctl(&cluster, &args).await;
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), exit, "{message}: {stderr}");
        assert!(stderr.contains(message), "expected {message:?} in {stderr}");
        assert!(out.stdout.is_empty());
    }
    assert!(
        client.runs("strict").await.expect("runs").is_empty(),
        "no refused trigger created a run"
    );

    // At the limits: accepted.
    let at_limit = format!("BIG={}", "v".repeat(64 * 1024));
    let (id, _) = trigger_ok(&cluster, &["strict", "--param", &at_limit]).await;
    let run = client.wait_run(id).await.expect("run ends");
    assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
    cluster.shutdown().await.expect("shutdown");
}

/// A workflow's declared params: `axctl get workflow` lists them (table and JSON), a trigger's
/// missing ones take their defaults (its tasks see them), a missing required one or a value
/// outside the choices is refused naming it and creates nothing; a cron run and the dependency run it starts get their own defaults; a cron
/// workflow may not require a param.
async fn declared_params_fill_triggers_and_the_runs_nobody_gave_params_to(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    client
        .apply(
            r#"name: declared
params:
  region: {default: eu, description: Where}
  env: {required: true, choices: [staging, prod]}
tasks:
  - name: show
    command: echo "region=$AX_PARAM_region env=$AX_PARAM_env"
"#,
        )
        .await
        .expect("apply");
    // `axctl get workflow` lists the declarations in file order, in its table and its JSON.
    let out = axctl(&cluster, &["get", "workflow", "declared"]).await;
    let shown = text(&out.stdout);
    assert_eq!(code(&out), 0, "{shown}{}", text(&out.stderr));
    let rows: Vec<&str> = shown
        .lines()
        .skip_while(|line| !line.starts_with("PARAM"))
        .take(3)
        .collect();
    assert_eq!(
        rows,
        [
            "PARAM    DEFAULT   REQUIRED   CHOICES         DESCRIPTION",
            "region   eu        no         -               Where",
            "env      -         yes        staging, prod   -",
        ],
        "{shown}"
    );
    let out = axctl(&cluster, &["-o", "json", "get", "workflow", "declared"]).await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("axctl's JSON");
    assert_eq!(
        json["params"],
        serde_json::json!([
            {"name": "region", "description": "Where", "default": "eu", "required": false, "choices": []},
            {"name": "env", "description": "", "default": null, "required": true, "choices": ["staging", "prod"]},
        ]),
        "{json}"
    );
    let (id, _) = trigger_ok(&cluster, &["declared", "--param", "env=prod"]).await;
    let run = client.wait_run(id).await.expect("run ends");
    assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
    let params: Vec<(&str, &str)> = run
        .params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect();
    assert_eq!(params, [("env", "prod"), ("region", "eu")]);
    let instances = client.instances(id).await.expect("instances");
    let lines = client.logs(instances[0].id).await.expect("logs");
    assert_eq!(lines[0].text, "region=eu env=prod");
    for (args, message) in [
        (
            vec!["trigger", "declared"],
            "missing required param \"env\"",
        ),
        (
            vec!["trigger", "declared", "--param", "env="],
            "param \"env\" is required and must not be empty",
        ),
        (
            vec!["trigger", "declared", "--param", "env=qa"],
            "param \"env\": \"qa\" is not one of its choices (staging, prod)",
        ),
    ] {
        let out = axctl(&cluster, &args).await;
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), EXIT_INVALID_ARGUMENT, "{message}: {stderr}");
        assert!(stderr.contains(message), "expected {message:?} in {stderr}");
    }
    assert_eq!(client.runs("declared").await.expect("runs").len(), 1);

    // A required param on a cron workflow is refused at apply, naming it.
    let refused = client
        .apply(
            "name: cron-required\nschedule: {cron: '0 2 * * *'}\nparams:\n  env: {required: true}\n\
             tasks: [{name: a, command: 'true'}]\n",
        )
        .await
        .expect_err("refused");
    // (The status's message is shown quoted, its quotes escaped.)
    let refused = format!("{refused:#}");
    assert!(
        refused.contains("params.env: param ") && refused.contains("is required without a default"),
        "{refused}"
    );

    // Runs nobody gave params to: each gets its workflow's own defaults.
    client
        .apply(
            "name: declared-dep\nschedule: {after: [declared-cron]}\nparams:\n  day: {default: d1}\n\
             tasks: [{name: a, command: 'true'}]\n",
        )
        .await
        .expect("apply dependent");
    client
        .apply(
            "name: declared-cron\nschedule: {cron: '* * * * * *'}\nparams:\n  region: {default: eu}\n\
             concurrency: {key: '${region}'}\ntasks: [{name: a, command: 'true'}]\n",
        )
        .await
        .expect("apply cron");
    let deadline = tokio::time::Instant::now() + RUN_TIMEOUT;
    let dependent = loop {
        let runs = client.runs("declared-dep").await.expect("runs");
        if let Some(run) = runs.into_iter().next() {
            break run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dependency run within {RUN_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    client.pause("declared-cron").await.expect("pause");
    let fired = client.runs("declared-cron").await.expect("runs");
    assert!(!fired.is_empty());
    for run in &fired {
        assert_eq!(run.trigger, pb::TriggerKind::Cron as i32);
        let params: Vec<(&str, &str)> = run
            .params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(params, [("region", "eu")], "run {}", run.id);
    }
    assert_eq!(dependent.trigger, pb::TriggerKind::Dependency as i32);
    assert_eq!(
        dependent.params.get("day").map(String::as_str),
        Some("d1"),
        "{dependent:?}"
    );
    assert_eq!(dependent.params.len(), 1, "{dependent:?}");
    cluster.shutdown().await.expect("shutdown");
}
