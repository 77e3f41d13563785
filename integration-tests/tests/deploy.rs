//! The deploy files are real:
//! - every `AX_*` setting a file under `deploy/` names (Compose, Kubernetes manifests, systemd
//!   units and their environment files, scripts) is one that `ax-scheduler`, `ax-worker` or
//!   `axctl` reads;
//! - `deploy/docker-compose.yml` is a valid Compose file for a three-node cluster with TLS and
//!   tokens (checked with `docker compose config` or `docker-compose config`: `.ci/run` installs
//!   `docker-compose`);
//! - the manifests in `deploy/kubernetes` pass the schema validator `kubernetes-validate` (from
//!   `.ci/requirements.txt`, run by the venv's Python in `AX_TEST_PYTHON`) for the oldest and the
//!   newest Kubernetes they are meant for, the kustomization lists exactly them and no Secret,
//!   the optional client-certificate component names files that are there, and the example
//!   Secrets hold only placeholders; a broken manifest is rejected, so the check can fail;
//! - the systemd units pass `systemd-analyze verify` without a warning.
//!
//! Outside CI a missing tool makes its test ignored, saying so; under `CI=true` it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::requirements::{PYTHON, Requirement};

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(every_deploy_file_sets_only_settings_the_binaries_read),
        trial!(the_compose_file_is_a_valid_three_node_cluster_with_tls_and_tokens)
            .requires(&COMPOSE),
        trial!(the_kubernetes_manifests_pass_the_schema_validator).requires(&PYTHON),
        trial!(the_kustomization_applies_every_manifest_but_no_secret).requires(&PYTHON),
        trial!(the_example_secrets_hold_only_placeholders).requires(&PYTHON),
        trial!(the_schema_validator_rejects_a_broken_manifest).requires(&PYTHON),
        trial!(the_systemd_units_pass_systemd_analyze_verify).requires(&SYSTEMD_ANALYZE),
    ]
}

/// The Kubernetes versions the manifests are validated against: the oldest they support (the
/// scheduler's `preStop: sleep` needs 1.30) and the newest the validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the integration tests live in the workspace")
        .to_path_buf()
}

fn deploy_file(name: &str) -> PathBuf {
    repo_root().join("deploy").join(name)
}

/// Every file under `dir`, recursively, skipping the directories named in `skip`.
fn files_under(dir: &Path, skip: &[&Path]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                if !skip.contains(&path.as_path()) {
                    pending.push(path);
                }
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The `AX_*` names a binary's flags read from the environment, from its source.
fn env_names(source: &str) -> BTreeSet<String> {
    // Flags' `env = "AX_…"`, and the few settings read from the environment alone
    // (`env::var("AX_SECRET_KEY")`: a key on the command line would show in `ps`).
    ["env = \"", "env::var(\""]
        .iter()
        .flat_map(|opening| source.split(opening).skip(1))
        .filter_map(|rest| rest.split('"').next())
        .filter(|name| name.starts_with("AX_"))
        .map(str::to_string)
        .collect()
}

/// The `AX_*` names a text mentions (`AX_NAME:` in YAML, `AX_NAME=` in an environment file,
/// `name: AX_NAME` in a manifest, or in a comment).
fn names_set_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("AX_") && word.len() > "AX_".len())
        .map(str::to_string)
        .collect()
}

/// Every setting the three binaries read, from every source file of their crates (flags may
/// be declared outside `main.rs`).
fn settings_the_binaries_read() -> BTreeSet<String> {
    let mut known = BTreeSet::new();
    for krate in ["scheduler", "worker", "ctl"] {
        for file in files_under(&repo_root().join(krate).join("src"), &[]) {
            if file.extension().is_some_and(|ext| ext == "rs") {
                let source = std::fs::read_to_string(&file).expect("source file");
                known.extend(env_names(&source));
            }
        }
    }
    known
}

fn every_deploy_file_sets_only_settings_the_binaries_read() {
    let known = settings_the_binaries_read();
    assert!(known.contains("AX_NODE_ID") && known.contains("AX_SCHEDULER"));
    let deploy = repo_root().join("deploy");
    // Certificates and keys made by deploy/tls/make-dev-certs.sh are no deploy file.
    let generated = deploy.join("tls/out");
    let files = files_under(&deploy, &[generated.as_path()]);
    for expected in [
        "docker-compose.yml",
        "kubernetes/scheduler-deployment.yaml",
        "kubernetes/worker-deployment.yaml",
        "systemd/ax-scheduler.service",
        "systemd/ax-worker.service",
    ] {
        assert!(
            files.contains(&deploy.join(expected)),
            "{expected} was not among the files checked: {files:?}"
        );
    }
    let mut unknown: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &files {
        // Binary files name no setting.
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for name in names_set_in(&text).difference(&known) {
            let relative = file.strip_prefix(&deploy).unwrap_or(file);
            unknown
                .entry(name.clone())
                .or_default()
                .push(relative.display().to_string());
        }
    }
    assert!(
        unknown.is_empty(),
        "settings no binary reads, with the deploy files naming them: {unknown:#?}"
    );
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

/// `docker compose` or `docker-compose`.
static COMPOSE: Requirement = Requirement::custom(
    || {
        compose()
            .map(|_| ())
            .ok_or_else(|| "neither `docker compose` nor `docker-compose` works here".into())
    },
    "install docker-compose to check the Compose file",
);

static SYSTEMD_ANALYZE: Requirement = Requirement::program(
    "systemd-analyze",
    &["--version"],
    "install systemd (systemd-analyze) to check the systemd units",
);

fn the_compose_file_is_a_valid_three_node_cluster_with_tls_and_tokens() {
    let program = compose().expect("docker compose or docker-compose");
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
    // Each node has its own id, advertises its own TLS address and serves its certificate.
    for node in ["scheduler-1", "scheduler-2", "scheduler-3"] {
        assert!(
            resolved.contains(&format!("AX_NODE_ID: {node}")),
            "{node} lacks its id:\n{resolved}"
        );
        assert!(
            resolved.contains(&format!("AX_ADVERTISE: https://{node}:7070")),
            "{node} does not advertise itself over TLS:\n{resolved}"
        );
    }
    for setting in [
        "AX_TLS_CERT: /etc/ax/tls/scheduler.crt",
        "AX_TLS_KEY: /etc/ax/tls/scheduler.key",
        "AX_SECRET_KEY_FILE: /etc/ax/tls/secret-key",
        "AX_OPS_LISTEN: 0.0.0.0:7071",
    ] {
        assert_eq!(
            resolved.matches(setting).count(),
            3,
            "every node should have {setting}:\n{resolved}"
        );
    }
    // The workers know all three nodes over TLS, trust the CA and present a worker token and
    // a certificate of their own.
    assert_eq!(
        resolved
            .matches(
                "AX_SCHEDULER: https://scheduler-1:7070,https://scheduler-2:7070,https://scheduler-3:7070"
            )
            .count(),
        2,
        "the workers do not know every node over TLS:\n{resolved}"
    );
    for setting in [
        "AX_TOKEN_FILE: /etc/ax/tls/worker.token",
        "AX_TLS_CERT: /etc/ax/tls/worker-1.crt",
        "AX_TLS_CERT: /etc/ax/tls/worker-2.crt",
    ] {
        assert!(
            resolved.contains(setting),
            "a worker lacks {setting}:\n{resolved}"
        );
    }
    assert!(
        !resolved.contains("http://"),
        "something is reached without TLS:\n{resolved}"
    );
    assert!(
        resolved.contains("AX_STORE: mysql://"),
        "the nodes share MySQL"
    );
}

/// The venv's Python (`AX_TEST_PYTHON`: the test requires [`PYTHON`]).
fn test_python() -> PathBuf {
    PathBuf::from(std::env::var_os("AX_TEST_PYTHON").expect("AX_TEST_PYTHON"))
}

/// `kubernetes-validate --strict` on `files` for every version in [`KUBERNETES_VERSIONS`].
fn kubernetes_validate(python: &Path, files: &[PathBuf]) -> Output {
    let mut command = Command::new(python);
    command.args(["-m", "kubernetes_validate", "--strict"]);
    for version in KUBERNETES_VERSIONS {
        command.args(["-k", version]);
    }
    command
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()))
}

/// Runs a Python program with the venv's interpreter and returns what it printed.
fn python_output(python: &Path, program: &str, args: &[&Path]) -> String {
    let out = Command::new(python)
        .arg("-c")
        .arg(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{program}\nfailed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubernetes_dir() -> PathBuf {
    deploy_file("kubernetes")
}

/// Every manifest in deploy/kubernetes: its YAML files but the kustomization, which is
/// kustomize's own file and has no Kubernetes schema. Its subdirectories are kustomize
/// components, whose patches are fragments of manifests.
fn kubernetes_manifests() -> Vec<PathBuf> {
    let dir = kubernetes_dir();
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    let mut manifests: Vec<PathBuf> = entries
        .map(|entry| entry.expect("directory entry").path())
        .filter(|file| file.extension().is_some_and(|ext| ext == "yaml"))
        .filter(|file| !file.ends_with("kustomization.yaml"))
        .collect();
    manifests.sort();
    manifests
}

fn the_kubernetes_manifests_pass_the_schema_validator() {
    let python = test_python();
    let manifests = kubernetes_manifests();
    assert!(
        manifests.len() >= 6,
        "expected the namespace, config, Deployments, Services, PDB and example Secrets: {manifests:?}"
    );
    let out = kubernetes_validate(&python, &manifests);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubernetes-validate failed:\n{stdout}{stderr}"
    );
    // A kind it has no schema for (a typo in `kind:`, say) is only a warning to it.
    for line in stdout.lines().chain(stderr.lines()) {
        assert!(
            line.starts_with("INFO ") && line.contains(" passed for resource "),
            "kubernetes-validate did not pass everything: {line}\n{stdout}{stderr}"
        );
    }
    for manifest in &manifests {
        for version in KUBERNETES_VERSIONS {
            let version = version.trim_end_matches(".0");
            assert!(
                stdout.lines().any(|line| line
                    .starts_with(&format!("INFO {} passed", manifest.display()))
                    && line.ends_with(&format!("against version {version}"))),
                "{} was not validated for Kubernetes {version}:\n{stdout}",
                manifest.display()
            );
        }
    }
}

fn the_kustomization_applies_every_manifest_but_no_secret() {
    let python = test_python();
    let dir = kubernetes_dir();
    let listed = python_output(
        &python,
        "import sys, yaml\n\
         k = yaml.safe_load(open(sys.argv[1]))\n\
         assert k['kind'] == 'Kustomization', k['kind']\n\
         print(k.get('namespace', ''))\n\
         print('\\n'.join(k['resources']))",
        &[&dir.join("kustomization.yaml")],
    );
    let mut lines = listed.lines();
    assert_eq!(lines.next(), Some("ax"), "the kustomization's namespace");
    let resources: BTreeSet<PathBuf> = lines.map(|name| dir.join(name)).collect();
    // The example Secrets are a template with placeholders; everything else is applied.
    let expected: BTreeSet<PathBuf> = kubernetes_manifests()
        .into_iter()
        .filter(|file| !file.ends_with("secrets.example.yaml"))
        .collect();
    assert_eq!(resources, expected, "kustomization.yaml's resources");
    let kinds = python_output(
        &python,
        "import sys, yaml\n\
         for path in sys.argv[1:]:\n\
         \x20   for doc in yaml.safe_load_all(open(path)):\n\
         \x20       print(path, doc['kind'], doc['metadata'].get('namespace', '-'))",
        &resources.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
    );
    for line in kinds.lines() {
        assert!(
            !line.contains(" Secret "),
            "the kustomization would install a Secret (there must be no default secret): {line}"
        );
        assert!(
            line.ends_with(" ax") || line.contains(" Namespace "),
            "a resource outside the ax namespace: {line}"
        );
    } // The optional client-certificate component names files that exist, and patches only the
    // two Deployments.
    let component = dir.join("client-certificates");
    let listed = python_output(
        &python,
        "import sys, yaml\n\
         k = yaml.safe_load(open(sys.argv[1]))\n\
         assert k['kind'] == 'Component', k['kind']\n\
         print('\\n'.join(k['resources'] + [p['path'] for p in k['patches']]))",
        &[&component.join("kustomization.yaml")],
    );
    for name in listed.lines() {
        assert!(
            component.join(name).is_file(),
            "client-certificates/kustomization.yaml names {name}, which is not there"
        );
    }
    let patched = python_output(
        &python,
        "import sys, yaml\n\
         for path in sys.argv[1:]:\n\
         \x20   doc = yaml.safe_load(open(path))\n\
         \x20   print(doc['kind'], doc['metadata']['name'])",
        &[
            &component.join("scheduler-patch.yaml"),
            &component.join("worker-patch.yaml"),
        ],
    );
    assert_eq!(patched, "Deployment ax-scheduler\nDeployment ax-worker\n");
}

fn the_example_secrets_hold_only_placeholders() {
    let python = test_python();
    let values = python_output(
        &python,
        "import sys, yaml\n\
         for doc in yaml.safe_load_all(open(sys.argv[1])):\n\
         \x20   assert doc['kind'] == 'Secret', doc['kind']\n\
         \x20   assert 'data' not in doc, doc['metadata']['name'] + ' has base64 data'\n\
         \x20   for key, value in doc['stringData'].items():\n\
         \x20       print(doc['metadata']['name'] + '/' + key + '\\t' + ' '.join(value.split()))",
        &[&kubernetes_dir().join("secrets.example.yaml")],
    );
    let mut names = Vec::new();
    for line in values.lines() {
        let (name, value) = line.split_once('\t').expect("name and value");
        // A placeholder says so; a real PEM block would end with an END line.
        assert!(
            value.contains("REPLACE-ME") && !value.contains("-----END"),
            "{name} looks like a real value: {value}"
        );
        names.push(name.to_string());
    }
    // The Secrets the Deployments mount, each with the keys they read.
    for expected in [
        "ax-scheduler/store",
        "ax-scheduler/redis",
        "ax-scheduler/secret-key",
        "ax-scheduler-tls/tls.crt",
        "ax-scheduler-tls/tls.key",
        "ax-ca/ca.crt",
        "ax-worker-token/token",
    ] {
        assert!(
            names.iter().any(|name| name == expected),
            "the example lacks {expected}: {names:?}"
        );
    }
}

fn the_schema_validator_rejects_a_broken_manifest() {
    let python = test_python();
    let dir = tempfile::tempdir().expect("temp dir");
    let deployment = std::fs::read_to_string(kubernetes_dir().join("scheduler-deployment.yaml"))
        .expect("scheduler deployment");
    // The real scheduler Deployment, broken three ways, one per file: a wrong type, a field
    // Kubernetes does not have (a typo), and a required field left out.
    let broken = [
        (
            "replicas: 3",
            "replicas: \"three\"",
            "'three' is not of type 'integer'",
        ),
        (
            "terminationGracePeriodSeconds: 40",
            "terminationGracePeriodSecond: 40",
            "'terminationGracePeriodSecond' was unexpected",
        ),
        (
            "  selector:\n    matchLabels:\n      app.kubernetes.io/name: ax-scheduler\n",
            "",
            "'selector' is a required property",
        ),
    ];
    for (index, (good, bad, message)) in broken.into_iter().enumerate() {
        assert!(deployment.contains(good), "the Deployment has {good:?}");
        let file = dir.path().join(format!("broken-{index}.yaml"));
        std::fs::write(&file, deployment.replacen(good, bad, 1)).expect("write");
        let out = kubernetes_validate(&python, std::slice::from_ref(&file));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !out.status.success(),
            "a Deployment with {bad:?} passed:\n{stdout}"
        );
        assert!(
            stdout.contains("ERROR") && stdout.contains(message),
            "the validator should say {message:?}:\n{stdout}"
        );
    }
}

fn the_systemd_units_pass_systemd_analyze_verify() {
    let dir = tempfile::tempdir().expect("temp dir");
    let verify = |units: &[(&str, String)]| {
        let mut paths = Vec::new();
        for (name, text) in units {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write unit");
            paths.push(path);
        }
        Command::new("systemd-analyze")
            .arg("verify")
            .args(&paths)
            .output()
            .expect("systemd-analyze runs")
    };
    let units: Vec<(&str, String)> = ["ax-scheduler.service", "ax-worker.service"]
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(deploy_file("systemd").join(name)).expect("unit");
            // The binaries are not installed here; verify checks that ExecStart's program runs.
            let text = text
                .replace("/usr/local/bin/ax-scheduler", "/bin/true")
                .replace("/usr/local/bin/ax-worker", "/bin/true");
            (name, text)
        })
        .collect();
    let out = verify(&units);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    // systemd ignores an unknown directive with a warning, which the check above turns into a
    // failure.
    let typo = vec![(
        "ax-scheduler.service",
        units[0].1.replace("ProtectHome=yes", "ProtectHomme=yes"),
    )];
    let out = verify(&typo);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Unknown key 'ProtectHomme'"),
        "systemd-analyze did not notice a typo: {stderr}"
    );
}
