//! The README's commands, run as a reader runs them.
//!
//! The tour: `axctl dev --run examples/etl.yaml` (the quick start), then every line of the
//! tour's block, in order, through `sh`, from a directory holding the examples. Each line must
//! exit as its comment says: `(exit N)` when the comment has one, else 0. The ids the tour names
//! are those a fresh `axctl dev` gives, so a line that acts on the wrong run (a cancel of a run
//! that already ended, a retry of a task that succeeded) fails here before a reader meets it.
//!
//! The cluster section: its SQL on the MySQL server, then its shell block line by line, with
//! only the host names, ports, database and state directory replaced by this machine's (the
//! node certificate names `localhost` too): the node starts with TLS and tokens, the worker
//! registers with its worker token, and a task routed by its label runs on it. A line that
//! finds the node still starting (axctl's exit 5) is tried again, as a reader would.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::free_port;
use ax_integration_tests::requirements::{MYSQL, REDIS, Requirement};
use ax_integration_tests::{TestClient, binary, mysql_server_url, redis_url};
use sqlx::Connection;

/// `openssl`, which `deploy/tls/make-dev-certs.sh` runs.
static OPENSSL: Requirement = Requirement::program(
    "openssl",
    &["version"],
    "install openssl to run the README's cluster section (its certificates)",
);

/// How long one line may take (a hang guard: `--wait` lines wait for runs of a few seconds).
const LINE_GUARD: Duration = Duration::from_secs(120);

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(tour_lines_carry_their_promised_exit_codes),
        trial!(async(multi_thread = 2) the_tour_runs_as_written_on_a_fresh_dev_server),
        trial!(async(multi_thread = 2) the_cluster_section_works_when_copied)
            .requires(&MYSQL)
            .requires(&REDIS)
            .requires(&OPENSSL),
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

/// The text of the first block in `language` after `heading`.
fn block<'a>(readme: &'a str, heading: &str, language: &str) -> &'a str {
    let after = &readme[readme.find(heading).expect("the README has the heading")..];
    let fence = format!("```{language}\n");
    let block = &after[after.find(&fence).expect("a block") + fence.len()..];
    &block[..block.find("```").expect("the block ends")]
}

/// The lines of the first `sh` block after `heading`.
fn shell_block(readme: &str, heading: &str) -> Vec<TourLine> {
    block(readme, heading, "sh")
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

/// The commands of a shell block: continuation lines joined, comments cut.
fn commands(block: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = match line.find(" # ") {
            Some(at) => &line[..at],
            None => line,
        };
        match line.trim_end().strip_suffix('\\') {
            Some(continued) => current.push_str(continued),
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    commands.push(current.trim().to_string());
                }
                current.clear();
            }
        }
    }
    commands
}

async fn the_cluster_section_works_when_copied() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let sql = block(&readme, "## Running a cluster", "sql");
    let shell = commands(block(&readme, "## Running a cluster", "sh"));

    let unique = format!("ax_readme_{}_{}", std::process::id(), rand_suffix());
    let server = mysql_server_url().expect("AX_TEST_MYSQL_URL");
    let host = server.rsplit('@').next().expect("a host").to_string();
    let mut admin = sqlx::MySqlConnection::connect(&server)
        .await
        .expect("the MySQL server");
    let sql = sql
        .replace("DATABASE ax ", &format!("DATABASE {unique} "))
        .replace("ON ax.*", &format!("ON {unique}.*"))
        .replace("'ax'@'%'", &format!("'{unique}'@'%'"));
    for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_string()))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("the README's SQL `{statement}`: {e}"));
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("worker-state");
    let (node, away) = (free_port().expect("port"), free_port().expect("port"));
    let shell: Vec<String> = shell
        .iter()
        .map(|line| {
            line.replace(
                "deploy/tls/make-dev-certs.sh",
                &repo_root()
                    .join("deploy/tls/make-dev-certs.sh")
                    .display()
                    .to_string(),
            )
            .replace(
                "mysql://ax:change-me@db:3306/ax",
                &format!("mysql://{unique}:change-me@{host}/{unique}"),
            )
            .replace(
                "redis://cache:6379",
                &format!(
                    "{} --redis-namespace {unique}",
                    redis_url().expect("AX_TEST_REDIS_URL")
                ),
            )
            .replace("0.0.0.0:7070", &format!("0.0.0.0:{node}"))
            .replace("scheduler-1:7070", &format!("localhost:{node}"))
            .replace("scheduler-2:7070", &format!("localhost:{away}"))
            .replace("/var/lib/ax-worker", &state.display().to_string())
        })
        .collect();
    for line in &shell {
        for kept in ["db:3306", "cache:6379", "scheduler-1:", "/var/lib/"] {
            assert!(!line.contains(kept), "`{kept}` left in `{line}`");
        }
    }

    let bin_dir = binary("axctl")
        .expect("axctl is built")
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let mut env: Vec<(String, String)> = vec![(
        "PATH".into(),
        format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    )];
    let mut background = Vec::new();
    let mut failures = Vec::new();
    for line in &shell {
        if let Some(assignments) = line.strip_prefix("export ") {
            for assignment in assignments.split_whitespace() {
                let (key, value) = assignment.split_once('=').expect("KEY=VALUE");
                env.push((key.into(), value.into()));
            }
            continue;
        }
        if let Some(service) = line.strip_suffix('&') {
            let log =
                std::fs::File::create(dir.path().join(format!("bg-{}.log", background.len())))
                    .expect("log");
            let child = shell_command(service, dir.path(), &env)
                .stdout(Stdio::from(log.try_clone().expect("log")))
                .stderr(Stdio::from(log))
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .expect("sh");
            background.push(child);
            continue;
        }
        let until = tokio::time::Instant::now() + LINE_GUARD;
        loop {
            let output =
                tokio::time::timeout(LINE_GUARD, shell_command(line, dir.path(), &env).output())
                    .await
                    .unwrap_or_else(|_| panic!("`{line}` did not end"))
                    .expect("sh runs");
            let code = output.status.code().unwrap_or(-1);
            // 5: axctl found no node there yet (it is still starting).
            if code == 5 && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            if code != 0 {
                failures.push(format!(
                    "`{line}` exited {code}:\n--- stdout\n{}--- stderr\n{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
            break;
        }
    }

    // The node serves with TLS and tokens; the worker registered with its worker token; a task
    // routed to it by its label runs there.
    let ran = if failures.is_empty() {
        let run = |line: &str| {
            let mut command = shell_command(line, dir.path(), &env);
            async move { command.output().await.expect("sh runs") }
        };
        let apply = run(
            "printf 'name: readme-etl\\ntasks:\\n  - name: t\\n    command: echo on $(hostname)\\n    labels: {pool: etl}\\n' > etl.yaml && axctl apply -f etl.yaml",
        )
        .await;
        assert!(apply.status.success(), "{apply:?}");
        let triggered = run("axctl trigger readme-etl --wait -o json").await;
        Some(triggered)
    } else {
        None
    };
    let logs: Vec<String> = (0..background.len())
        .map(|i| {
            std::fs::read_to_string(dir.path().join(format!("bg-{i}.log"))).unwrap_or_default()
        })
        .collect();
    for child in &mut background {
        if let Some(pid) = child.id() {
            // The service and what its shell started: the group the test gave it.
            // SAFETY: kill(2) with a negative pid signals that process group; no memory is shared.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
        }
        let _ = child.wait().await;
    }
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS `{unique}`; DROP USER IF EXISTS '{unique}'@'%'"
    )))
    .execute(&mut admin)
    .await;
    assert!(
        failures.is_empty(),
        "the README's cluster section failed as written:\n\n{}\n\nthe services' logs:\n{}",
        failures.join("\n\n"),
        logs.join("\n---\n")
    );
    let triggered = ran.expect("ran");
    let text = String::from_utf8_lossy(&triggered.stdout);
    assert!(
        triggered.status.success(),
        "the run on the README's worker: {triggered:?}\n{}",
        logs.join("\n---\n")
    );
    let run: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(run["state"], "SUCCESS", "{run}");
}

fn shell_command(line: &str, dir: &Path, env: &[(String, String)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("sh");
    command
        .args(["-c", line])
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, _) in std::env::vars() {
        if key.starts_with("AX_") {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    command
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
