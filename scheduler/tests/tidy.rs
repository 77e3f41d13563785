//! Tidy checks: architecture rules that the compiler does not enforce.

/// The core takes time, inputs and random numbers and returns decisions; it must not grow I/O
/// dependencies or draw randomness itself.
#[test]
fn the_core_depends_on_no_runtime_network_or_database_crate() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/core/Cargo.toml"))
        .expect("core manifest");
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    for forbidden in [
        "tokio", "tonic", "sqlx", "redis", "hyper", "reqwest", "ax-store", "ax-proto", "rand",
    ] {
        let listed = dependencies
            .lines()
            .any(|line| line.split(['=', '.', ' ']).next() == Some(forbidden));
        assert!(!listed, "ax-core must not depend on {forbidden}");
    }
}

/// The example configuration in deploy/ must stay loadable.
#[test]
fn the_example_config_parses() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/scheduler.example.toml"
    );
    let options = ax_scheduler::config::Args::parse_from(["ax-scheduler", "--config", path])
        .into_options()
        .expect("example config");
    assert_eq!(options.node_id, "scheduler-1");
    assert_eq!(options.redis_url.as_deref(), Some("redis://127.0.0.1:6379"));
    let channels: Vec<&str> = options
        .alerts
        .iter()
        .map(|channel| channel.name.as_str())
        .collect();
    assert_eq!(channels, vec!["ops-feishu", "pager"]);
    assert_eq!(options.pools.get("etl"), Some(&4));
}

/// The Python SDK is released with ax: its version (one place, `version.py`, which
/// pyproject.toml reads) is the workspace's, and the changelog has a section for it.
#[test]
fn the_python_sdk_and_the_changelog_carry_the_workspace_version() {
    let version = env!("CARGO_PKG_VERSION");
    let sdk = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sdk/python/src/ax_sdk/version.py"
    ))
    .expect("the SDK's version.py");
    assert!(
        sdk.lines()
            .any(|line| line.trim() == format!("__version__ = \"{version}\"")),
        "sdk/python/src/ax_sdk/version.py does not say __version__ = \"{version}\""
    );
    let pyproject = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sdk/python/pyproject.toml"
    ))
    .expect("the SDK's pyproject.toml");
    assert!(
        pyproject.contains("attr = \"ax_sdk.version.__version__\""),
        "pyproject.toml must take its version from ax_sdk/version.py"
    );
    let changelog =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../CHANGELOG.md"))
            .expect("CHANGELOG.md");
    assert!(
        changelog
            .lines()
            .any(|line| line == format!("## {version}")),
        "CHANGELOG.md has no section `## {version}`"
    );
}
