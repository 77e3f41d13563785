//! The README's tour, run as a newcomer runs it: `axctl dev --run examples/etl.yaml` (the quick
//! start), then every line of the tour's block, in order, through `sh`, from a directory holding
//! the examples. Each line must exit as its comment says: `(exit N)` when the comment has one,
//! else 0. The ids the tour names are those a fresh `axctl dev` gives, so a line that acts on
//! the wrong run (a cancel of a run that already ended, a retry of a task that succeeded) fails
//! here before a reader meets it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::free_port;
use ax_integration_tests::{TestClient, binary};

/// How long one line may take (a hang guard: `--wait` lines wait for runs of a few seconds).
const LINE_GUARD: Duration = Duration::from_secs(120);

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(tour_lines_carry_their_promised_exit_codes),
        trial!(async(multi_thread = 2) the_tour_runs_as_written_on_a_fresh_dev_server),
    ]
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration-tests lives in the repository")
        .to_path_buf()
}

/// A line of a README shell block: the command and the exit code its comment promises.
#[derive(Debug, PartialEq)]
struct TourLine {
    command: String,
    exit: i32,
}

/// The lines of the first `sh` block after `heading`.
fn shell_block(readme: &str, heading: &str) -> Vec<TourLine> {
    let after = &readme[readme.find(heading).expect("the README has the heading")..];
    let block = &after[after.find("```sh\n").expect("a sh block") + 6..];
    let block = &block[..block.find("```").expect("the block ends")];
    block
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (command, comment) = match line.find(" # ") {
                Some(at) => (&line[..at], &line[at + 3..]),
                None => (line, ""),
            };
            let exit = comment
                .split("(exit ")
                .nth(1)
                .and_then(|rest| rest.split_once(')'))
                .and_then(|(code, _)| code.parse().ok())
                .unwrap_or(0);
            TourLine {
                command: command.trim().to_string(),
                exit,
            }
        })
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

async fn the_tour_runs_as_written_on_a_fresh_dev_server() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let tour = shell_block(&readme, "## A short tour");
    assert!(tour.len() > 20, "the tour has {} lines", tour.len());

    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&repo_root().join("examples"), &dir.path().join("examples"));
    // What `crontab -l > my.crontab` would have written: a job that never fires during the test.
    std::fs::write(
        dir.path().join("my.crontab"),
        "MAILTO=ops@example.com\n0 3 1 1 * /usr/local/bin/rotate-archives --keep 30\n",
    )
    .expect("crontab");
    let axctl = binary("axctl").expect("axctl is built (cargo build --bins)");
    let bin_dir = axctl.parent().expect("bin dir").to_path_buf();
    let port = free_port().expect("a free port");
    let server = format!("http://127.0.0.1:{port}");

    // The quick start, on a port of its own.
    let log_path = dir.path().join("dev.log");
    let log = std::fs::File::create(&log_path).expect("dev log");
    let mut dev = tokio::process::Command::new(&axctl)
        .args([
            "dev",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--run",
            "examples/etl.yaml",
        ])
        .current_dir(dir.path())
        .env_remove("AX_SERVER")
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("axctl dev starts");
    let client = connect(&server, &log_path).await;
    let first = client
        .wait_run_within(1, LINE_GUARD)
        .await
        .expect("the quick start's run ends");
    assert_eq!(
        first.state,
        ax_proto::v1::RunState::Success as i32,
        "{first:?}"
    );

    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut failures = Vec::new();
    for line in &tour {
        let mut command = tokio::process::Command::new("sh");
        command
            .args(["-c", &line.command])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("AX_SERVER", &server)
            .env_remove("AX_TOKEN")
            .env_remove("AX_TOKEN_FILE")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(LINE_GUARD, command.output())
            .await
            .unwrap_or_else(|_| panic!("`{}` did not end", line.command))
            .expect("sh runs");
        let code = output.status.code().unwrap_or(-1);
        if code != line.exit {
            failures.push(format!(
                "`{}` exited {code}, not {}:\n--- stdout\n{}--- stderr\n{}",
                line.command,
                line.exit,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    dev.start_kill().expect("stop axctl dev");
    let _ = dev.wait().await;
    assert!(
        failures.is_empty(),
        "{} of {} tour lines did not do what the README says:\n\n{}",
        failures.len(),
        tour.len(),
        failures.join("\n\n")
    );
    // The crontab became a workflow file.
    assert!(
        std::fs::read_dir(dir.path().join("jobs"))
            .expect("jobs/ was written")
            .count()
            >= 1
    );
}

async fn connect(server: &str, log: &Path) -> TestClient {
    let until = tokio::time::Instant::now() + LINE_GUARD;
    loop {
        if let Ok(client) = TestClient::connect(server).await
            && client.get_run(1).await.is_ok()
        {
            return client;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "axctl dev did not serve run 1:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn tour_lines_carry_their_promised_exit_codes() {
    let readme = "## A short tour\n\n```sh\naxctl a        # fine\naxctl b  # FAILED (exit 10): x\n\naxctl c && axctl d   # (exit 12 when something)\n```\n";
    assert_eq!(
        shell_block(readme, "## A short tour"),
        [
            TourLine {
                command: "axctl a".into(),
                exit: 0
            },
            TourLine {
                command: "axctl b".into(),
                exit: 10
            },
            TourLine {
                command: "axctl c && axctl d".into(),
                exit: 0
            },
        ]
    );
}
