//! The benchmark harness works: `ax-bench --quick --workload all --runs 1` on SQLite exits 0 and
//! its JSON reports every workload correct (all tasks SUCCESS, no attempt started twice, no log
//! line lost, nothing left running), and so do the cluster workloads (W1's and W9's three-node
//! passes, W10) on MySQL, and the browser workload U1. Speed is not asserted: this is a smoke
//! test of the harness.

use std::path::Path;
use std::process::Command;

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::requirements::{BROWSER, MYSQL};

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(quick_mode_runs_every_workload_correctly),
        trial!(quick_mode_measures_the_web_ui_in_a_browser).requires(&BROWSER),
        trial!(quick_mode_runs_the_cluster_workloads_on_mysql).requires(&MYSQL),
        trial!(unknown_workloads_and_unreachable_stores_are_refused_clearly),
    ]
}

/// Runs `ax-bench --quick --runs 1` on `workloads` (and `store`), and checks every workload's
/// report is correct and measured something.
fn quick_run(wanted: &[&str], store: Option<&str>, backend: &str) {
    let harness = Path::new(env!("CARGO_BIN_EXE_ax-bench"));
    // The scheduler and worker binaries sit next to the harness (`cargo test --workspace` or
    // `cargo build --bins` builds them); say so clearly when they do not.
    for name in ["ax-scheduler", "ax-worker"] {
        ax_integration_tests::binary(name).expect("the ax binaries are built");
    }
    let bin_dir = harness.parent().expect("the harness has a directory");
    let scratch = tempfile::tempdir().expect("scratch dir");
    let json = scratch.path().join("quick.json");
    let mut command = Command::new(harness);
    command
        .args(["--quick", "--runs", "1", "--workload", &wanted.join(",")])
        .arg("--json")
        .arg(&json)
        .arg("--bin-dir")
        .arg(bin_dir);
    if let Some(store) = store {
        command.args(["--store", store]);
    }
    let output = command.output().expect("ax-bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "ax-bench failed with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("valid json");
    assert_eq!(report["quick"], true);
    assert_eq!(report["backend"], backend);
    let workloads = report["workloads"].as_array().expect("workloads");
    let names: Vec<&str> = workloads
        .iter()
        .map(|w| w["workload"].as_str().expect("name"))
        .collect();
    assert_eq!(names, wanted);
    for workload in workloads {
        let name = workload["workload"].as_str().expect("name");
        assert_eq!(
            workload["status"], "ok",
            "{name} is not correct: {workload:#}\nstdout:\n{stdout}"
        );
        assert_eq!(workload["correctness_ok"], true, "{name}: {workload:#}");
        assert!(
            workload["checks_passed"].as_u64().expect("count") > 0,
            "{name} checked nothing: {workload:#}"
        );
        assert!(
            !workload["figures"].as_array().expect("figures").is_empty(),
            "{name} measured nothing"
        );
    }
    assert!(stdout.contains("| workload | backend | figure"), "{stdout}");
}

fn quick_mode_runs_every_workload_correctly() {
    // W10 runs three nodes, which SQLite cannot serve: it runs on MySQL below.
    let single_node = [
        "S0", "W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W11", "W12",
    ];
    quick_run(&single_node, None, "sqlite");
}

fn quick_mode_measures_the_web_ui_in_a_browser() {
    quick_run(&["U1"], None, "sqlite");
}

fn quick_mode_runs_the_cluster_workloads_on_mysql() {
    let server = ax_integration_tests::mysql_server_url().expect("AX_TEST_MYSQL_URL");
    quick_run(&["W1", "W9", "W10"], Some(&server), "mysql");
}

fn unknown_workloads_and_unreachable_stores_are_refused_clearly() {
    let harness = env!("CARGO_BIN_EXE_ax-bench");
    let output = Command::new(harness)
        .args(["--workload", "W1,W42", "--bin-dir", "/nonexistent"])
        .output()
        .expect("ax-bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown workload \"W42\""), "{stderr}");

    let bin_dir = Path::new(harness).parent().expect("dir");
    let output = Command::new(harness)
        .args(["--workload", "W1", "--store", "mysql://root@127.0.0.1:1"])
        .arg("--bin-dir")
        .arg(bin_dir)
        .output()
        .expect("ax-bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot reach the store mysql://root@127.0.0.1:1"),
        "{stderr}"
    );
}
