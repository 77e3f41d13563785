//! The deploy files are real: `deploy/docker-compose.yml` is a valid Compose file for a
//! three-node cluster (checked with `docker compose config` or `docker-compose config` where
//! either exists: `.ci/run` installs `docker-compose`), and every `AX_*` setting it names is one
//! that `ax-scheduler`, `ax-worker` or `axctl` reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(name)
}

/// The `AX_*` names a binary's flags read from the environment, from its source.
fn env_names(source: &str) -> BTreeSet<String> {
    source
        .split("env = \"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_string)
        .collect()
}

/// The `AX_*` names a text sets (`AX_NAME:` in YAML).
fn names_set_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("AX_"))
        .map(str::to_string)
        .collect()
}

/// `docker compose` or `docker-compose`, whichever works here.
fn compose() -> Option<Vec<&'static str>> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|out| out.status.success())
    };
    if works("docker", &["compose", "version"]) {
        Some(vec!["docker", "compose"])
    } else if works("docker-compose", &["version"]) {
        Some(vec!["docker-compose"])
    } else {
        None
    }
}

#[test]
fn the_compose_file_sets_only_settings_the_binaries_read() {
    let compose = std::fs::read_to_string(deploy_file("docker-compose.yml")).expect("compose");
    let mut known = env_names(include_str!("../../scheduler/src/config.rs"));
    known.extend(env_names(include_str!("../../worker/src/main.rs")));
    known.extend(env_names(include_str!("../../ctl/src/main.rs")));
    assert!(known.contains("AX_NODE_ID") && known.contains("AX_SCHEDULER"));
    let unknown: Vec<String> = names_set_in(&compose).difference(&known).cloned().collect();
    assert!(unknown.is_empty(), "settings no binary reads: {unknown:?}");
}

#[test]
fn the_compose_file_is_a_valid_three_node_cluster() {
    let Some(program) = compose() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but neither `docker compose` nor `docker-compose` is installed"
        );
        eprintln!("no docker compose here; skipping");
        return;
    };
    let file = deploy_file("docker-compose.yml");
    let out = Command::new(program[0])
        .args(&program[1..])
        .arg("-f")
        .arg(&file)
        .arg("config")
        .output()
        .expect("compose runs");
    let resolved = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each node has its own id and advertises its own address; the workers know all three.
    for node in ["scheduler-1", "scheduler-2", "scheduler-3"] {
        assert!(
            resolved.contains(&format!("AX_NODE_ID: {node}")),
            "{node} lacks its id:\n{resolved}"
        );
        assert!(
            resolved.contains(&format!("AX_ADVERTISE: http://{node}:7070")),
            "{node} does not advertise itself:\n{resolved}"
        );
    }
    assert!(
        resolved
            .contains("http://scheduler-1:7070,http://scheduler-2:7070,http://scheduler-3:7070"),
        "the workers do not know every node:\n{resolved}"
    );
    assert!(
        resolved.contains("AX_STORE: mysql://"),
        "the nodes share MySQL"
    );
}
