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
