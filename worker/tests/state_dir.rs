//! One `ax-worker` process per state directory: a second process on a directory in use is
//! refused, naming the directory and the first process; once the first is killed (-9) the
//! directory is free again.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An address nothing listens on: the workers keep retrying it, which is all they need to do.
const NOBODY: &str = "http://127.0.0.1:9";

fn worker(state: &Path, id: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ax-worker"))
        .args(["--scheduler", NOBODY, "--id", id, "--state-dir"])
        .arg(state)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ax-worker")
}

/// Waits (at most 30 s, a bound that only catches a hang) until the lock file names `child`.
fn wait_holding(state: &Path, child: &Child) {
    let expected = format!("pid {}", child.id());
    let started = Instant::now();
    while std::fs::read_to_string(state.join("lock")).unwrap_or_default() != expected {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "worker {} never took the state directory",
            child.id()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_worker_process_on_a_state_dir_in_use_is_refused_and_a_killed_one_frees_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let mut first = worker(&state, "w1");
    wait_holding(&state, &first);

    let second = worker(&state, "w1");
    let out = second.wait_with_output().expect("the second worker ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second worker ran: {stderr}");
    assert!(
        stderr.contains("is in use by another worker process")
            && stderr.contains(&format!("pid {}", first.id()))
            && stderr.contains(&state.display().to_string()),
        "the refusal does not name the directory and the first process: {stderr}"
    );

    first.kill().expect("kill -9 the first");
    first.wait().expect("reap the first");
    let mut third = worker(&state, "w1");
    wait_holding(&state, &third);
    third.kill().expect("kill the third");
    third.wait().expect("reap the third");
}
