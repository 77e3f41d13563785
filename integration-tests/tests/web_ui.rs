//! The web UI in a real browser: Debian's chromium, driven by playwright-core from
//! `integration-tests/browser/ui.test.mjs`, against a real scheduler and worker on a fresh
//! store (SQLite always, MySQL when `AX_TEST_MYSQL_URL` is set). This test applies the
//! fixtures and runs the suite; the checks are in the suite. Each check leaves a screenshot in
//! `target/ui-screenshots/<backend>/`.
//!
//! Needs `node`, `npm ci` in `integration-tests/browser` and chromium (`AX_CHROMIUM`, default
//! `/usr/bin/chromium`); `.ci/run` installs them. Without them the tests are ignored, except
//! under `CI=true`, where a missing tool is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ax_integration_tests::browser;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::on_every_backend;
use ax_integration_tests::requirements::BROWSER;
use ax_integration_tests::workflows::layered;
use ax_integration_tests::{Backend, Cluster};

pub(crate) fn tests() -> Vec<Test> {
    [
        vec![trial!(async(multi_thread) the_web_ui_signs_in_with_a_token).requires(&BROWSER)],
        on_every_backend!(requires(&BROWSER); the_web_ui_passes_its_browser_checks),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Applies `source`, again while the node answers that it is cut off from its store: the
/// fixtures (a 10,000-task workflow among them) go in while the rest of the suite loads the
/// database, and a node whose lease renewal waits past its 2 s cut-off refuses until the next
/// renewal, by design. Any other refusal fails the test.
async fn apply_while_cut_off(client: &ax_integration_tests::TestClient, name: &str, source: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match client.apply(source).await {
            Ok(_) => return,
            Err(err)
                if tokio::time::Instant::now() < deadline
                    && err
                        .downcast_ref::<tonic::Status>()
                        .is_some_and(ax_proto::cut_off::is_cut_off) =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => panic!("{name}: {err:#}"),
        }
    }
}

/// The suite's own checks have their own time limits; this only catches a hang.
const SUITE_GUARD: Duration = Duration::from_secs(600);

async fn the_web_ui_passes_its_browser_checks(backend: Backend) {
    let chromium = browser::tools().unwrap_or_else(|missing| panic!("{missing}"));
    let cluster = Cluster::builder(backend)
        .worker("ui-worker", 8)
        // ax-worker's own line limit (1 MiB): ui-logs checks a longer line is cut there.
        .start()
        .await
        .expect("cluster");
    let client = cluster.client().await.expect("client");
    let fixtures = browser::dir().join("fixtures");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .expect("fixtures")
        .map(|entry| entry.expect("entry").path())
        .collect();
    names.sort();
    let mut sources: Vec<(String, String)> = names
        .iter()
        .map(|path| {
            let source = std::fs::read_to_string(path).expect("fixture");
            (path.display().to_string(), source)
        })
        .collect();
    for (name, layers, width) in [("ui-big", 50, 40), ("ui-huge", 100, 100)] {
        sources.push((name.to_string(), layered(name, layers, width)));
    }
    for (name, source) in sources {
        apply_while_cut_off(&client, &name, &source).await;
    }

    let label = match backend {
        Backend::Sqlite => "sqlite",
        Backend::MySql => "mysql",
    };
    let shots = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/ui-screenshots")
        .join(label);
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let base = format!("http://{}", cluster.addr);
    let (files, checks) = ui_suites();
    let suite = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .args(["--test", "--test-reporter=spec"])
            .args(&files)
            .current_dir(browser::dir())
            .env("AX_UI_URL", &base)
            .env("AX_UI_SHOTS", &shots)
            .env("AX_CHROMIUM", &chromium)
            .output()
    });
    let output = tokio::time::timeout(SUITE_GUARD, suite)
        .await
        .expect("the browser suite hung")
        .expect("join")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        output.status.success(),
        "the browser suite failed on {label}:\n{stdout}\n{stderr}"
    );
    // Every check ran and passed (a suite that found no test, or skipped one, would pass
    // silently).
    let passed = stdout
        .lines()
        .find_map(|line| line.strip_prefix("ℹ pass "))
        .and_then(|count| count.trim().parse::<usize>().ok());
    assert_eq!(passed, Some(checks), "{stdout}");
}

/// The browser suites (`browser/ui*.test.mjs`; `AX_UI_SUITE=name` runs only the files whose
/// name contains it) and how many checks they hold.
fn ui_suites() -> (Vec<String>, usize) {
    let only = std::env::var("AX_UI_SUITE").unwrap_or_default();
    let mut files: Vec<String> = std::fs::read_dir(browser::dir())
        .expect("browser dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| {
            name.starts_with("ui") && name.ends_with(".test.mjs") && name.contains(&only)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no browser suite matches {only:?}");
    let checks = files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(browser::dir().join(file)).expect("suite");
            text.lines()
                .filter(|line| line.starts_with("test("))
                .count()
        })
        .sum();
    (files, checks)
}

/// A node that asks for tokens: the page asks for one, and the browser keeps it for its
/// session only (`browser/sign-in.test.mjs`).
async fn the_web_ui_signs_in_with_a_token() {
    let chromium = browser::tools().unwrap_or_else(|missing| panic!("{missing}"));
    let cluster = Cluster::builder(Backend::Sqlite)
        .auth(ax_scheduler::AuthMode::Tokens)
        .start()
        .await
        .expect("cluster");
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let make = async |name: &str, role| {
        let request = ax_scheduler::auth::tokens::TokenRequest {
            name: name.into(),
            role,
            app: None,
            lifetime_ms: None,
            created_by: "test".into(),
            worker: None,
        };
        ax_scheduler::auth::tokens::create(store.as_ref(), request, 1)
            .await
            .expect("token")
            .0
    };
    let admin = make("ui-admin", ax_core::access::Role::Admin).await;
    let viewer = make("ui-viewer", ax_core::access::Role::Viewer).await;
    let auth = ax_proto::client::ClientAuth {
        token: Some(admin),
        ..Default::default()
    };
    let channel = auth
        .endpoint(&cluster.endpoint(), None)
        .unwrap()
        .connect()
        .await
        .unwrap();
    ax_proto::v1::control_service_client::ControlServiceClient::with_interceptor(
        channel,
        auth.bearer().unwrap(),
    )
    .apply_workflow(ax_proto::v1::ApplyWorkflowRequest {
        source: "name: signed-in-wf\ntasks:\n  - name: t\n    command: echo hi\n".into(),
        ..Default::default()
    })
    .await
    .expect("apply");

    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ui-screenshots/sign-in");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let base = format!("http://{}", cluster.addr);
    let suite = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .args(["--test", "--test-reporter=spec", "sign-in.test.mjs"])
            .current_dir(browser::dir())
            .env("AX_UI_URL", &base)
            .env("AX_UI_TOKEN", &viewer)
            .env("AX_UI_SHOTS", &shots)
            .env("AX_CHROMIUM", &chromium)
            .output()
    });
    let output = tokio::time::timeout(SUITE_GUARD, suite)
        .await
        .expect("the sign-in check hung")
        .expect("join")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("ℹ pass 1"), "{stdout}");
    cluster.shutdown().await.expect("shutdown");
}
