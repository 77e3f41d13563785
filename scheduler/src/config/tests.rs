use std::collections::BTreeMap;

use super::*;
use crate::connections::ConnectionLimits;

/// One row of [`each_layer_overrides_the_one_before`]: the file, the environment, the flags,
/// and the `timeout_grace` that results or the error that names the setting's source.
type LayerRow = (
    Option<&'static str>,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
    Result<Duration, &'static str>,
);

const LAYERS: &[LayerRow] = &[
    (None, &[], &[], Ok(Duration::from_secs(15))),
    (
        Some("timeout_grace = \"1s\""),
        &[],
        &[],
        Ok(Duration::from_secs(1)),
    ),
    (
        Some("timeout_grace = \"1s\""),
        &[("AX_TIMEOUT_GRACE", "2s")],
        &[],
        Ok(Duration::from_secs(2)),
    ),
    (
        Some("timeout_grace = \"1s\""),
        &[("AX_TIMEOUT_GRACE", "2s")],
        &["--timeout-grace", "1.5s"],
        Ok(Duration::from_millis(1500)),
    ),
    (
        None,
        &[("AX_TIMEOUT_GRACE", "2s")],
        &[],
        Ok(Duration::from_secs(2)),
    ),
    (
        Some("timeout_grace = \"1s\""),
        &[],
        &["--timeout-grace", "3s"],
        Ok(Duration::from_secs(3)),
    ),
    (
        Some("node_lease = \"2s\""),
        &[("AX_NODE_LEASE", "500ms")],
        &[],
        Err("node_lease must be at least 1s (AX_NODE_LEASE)"),
    ),
    (
        Some("node_lease = \"2s\""),
        &[("AX_NODE_LEASE", "5s")],
        &["--node-lease", "100ms"],
        Err("node_lease must be at least 1s (--node-lease)"),
    ),
    (
        Some("listen = \"127.0.0.1:7070\"\n  node_lease = \"200ms\""),
        &[],
        &[],
        Err("node_lease must be at least 1s (config file PATH: line 2, column 16)"),
    ),
    (
        None,
        &[("AX_HEARTBEAT_INTERVAL", "soon")],
        &[],
        Err("AX_HEARTBEAT_INTERVAL: invalid duration \"soon\""),
    ),
];

/// Defaults < file < environment < flags, one setting at a time; a value out of range names
/// the layer that set it. Each row runs in a child process of this test binary with the
/// row's environment: clap reads the process's, which the other tests share.
#[test]
fn each_layer_overrides_the_one_before() {
    const ROW: &str = "AX_SETTINGS_TEST_ROW";
    if let Ok(row) = std::env::var(ROW) {
        let (file, _, flags, want) = LAYERS[row.parse::<usize>().unwrap()];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        let mut argv = vec!["ax-scheduler".to_string()];
        if let Some(text) = file {
            std::fs::write(&path, text).unwrap();
            argv.extend(["--config".to_string(), path.display().to_string()]);
        }
        argv.extend(flags.iter().map(|flag| flag.to_string()));
        let got = Args::try_parse_from(argv)
            .map_err(|err| err.to_string())
            .and_then(|args| args.into_options().map_err(|err| format!("{err:#}")))
            .map(|options| options.timeout_grace)
            .map_err(|err| err.replace(&path.display().to_string(), "PATH"));
        match want {
            Ok(grace) => assert_eq!(got, Ok(grace), "row {row}"),
            Err(says) => {
                let err = got.unwrap_err();
                assert!(err.contains(says), "row {row}: {err}");
            }
        }
        return;
    }
    let test = "config::tests::each_layer_overrides_the_one_before";
    for (row, (_, environment, _, _)) in LAYERS.iter().enumerate() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args([test, "--exact", "--test-threads=1"])
            .env(ROW, row.to_string());
        for (name, _) in LAYERS.iter().flat_map(|(_, env, _, _)| env.iter()) {
            child.env_remove(name);
        }
        child.envs(environment.iter().copied());
        let out = child.output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "row {row}:\n{said}");
        assert!(said.contains("1 passed"), "row {row} ran no test:\n{said}");
    }
}

#[test]
fn flags_beat_the_file_and_the_file_beats_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(
        &path,
        "store = \"mysql://root@127.0.0.1/ax\"\nstrategy = \"random\"\nheartbeat_interval = \"2s\"\n",
    )
    .unwrap();
    let args = Args::parse_from([
        "ax-scheduler",
        "--config",
        path.to_str().unwrap(),
        "--strategy",
        "round_robin",
    ]);
    let options = args.into_options().unwrap();
    assert_eq!(options.store_url, "mysql://root@127.0.0.1/ax");
    assert_eq!(options.strategy, Strategy::RoundRobin);
    assert_eq!(options.heartbeat_interval, Duration::from_secs(2));
    assert_eq!(options.task_heartbeat_interval, Duration::from_secs(30));
}

#[test]
fn pool_limits_come_from_the_file_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(&path, "[pools]\netl = 4\ngpu = 2\n").unwrap();
    let options = Args::parse_from([
        "ax-scheduler",
        "--config",
        path.to_str().unwrap(),
        "--pool",
        "gpu=1",
        "--pool",
        "io=8",
    ])
    .into_options()
    .unwrap();
    let want: BTreeMap<String, u32> = [("etl", 4), ("gpu", 1), ("io", 8)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(options.pools, want);
    let err = Args::try_parse_from(["ax-scheduler", "--pool", "etl"]).unwrap_err();
    assert!(err.to_string().contains("expected NAME=LIMIT"), "{err}");
    let err = Args::try_parse_from(["ax-scheduler", "--pool", "etl=many"]).unwrap_err();
    assert!(err.to_string().contains("whole number"), "{err}");
    std::fs::write(&path, "[pools]\netl = \"four\"\n").unwrap();
    let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("ax.toml: line 2, column 7: invalid type: string, expected u32"),
        "{text}"
    );
}

#[test]
fn the_ops_listener_comes_from_flags_or_the_file_and_is_off_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(&path, "ops_listen = \"0.0.0.0:7071\"\n").unwrap();
    let args = ["ax-scheduler", "--config", path.to_str().unwrap()];
    let from_file = Args::parse_from(args).into_options().unwrap();
    assert_eq!(from_file.ops_listen, Some(([0, 0, 0, 0], 7071).into()));
    let flag = Args::parse_from([&args[..], &["--ops-listen", "127.0.0.1:9100"]].concat())
        .into_options()
        .unwrap();
    assert_eq!(flag.ops_listen, Some(([127, 0, 0, 1], 9100).into()));
    let off = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
    assert_eq!(off.ops_listen, None);
    let err = Args::try_parse_from(["ax-scheduler", "--ops-listen", "7071"]).unwrap_err();
    assert!(err.to_string().contains("--ops-listen"), "{err}");
}

#[test]
fn retention_comes_from_flags_or_the_file_and_keeps_runs_forever_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(&path, "retention = \"90d\"\npurge_interval = \"1m\"\n").unwrap();
    let args = ["ax-scheduler", "--config", path.to_str().unwrap()];
    let from_file = Args::parse_from(args).into_options().unwrap();
    assert_eq!(from_file.retention, Some(Duration::from_secs(90 * 86_400)));
    assert_eq!(from_file.purge_interval, Duration::from_secs(60));
    let flag = Args::parse_from([&args[..], &["--retention", "forever"]].concat())
        .into_options()
        .unwrap();
    assert_eq!(flag.retention, None);
    let defaults = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
    assert_eq!(
        (defaults.retention, defaults.purge_interval),
        (None, Duration::from_secs(600))
    );
    for (bad, says) in [
        ("90", "has no unit"),
        ("0d", "more than zero"),
        ("a while", "invalid duration"),
    ] {
        let err = Args::try_parse_from(["ax-scheduler", "--retention", bad]).unwrap_err();
        assert!(err.to_string().contains(says), "{bad}: {err}");
    }
    std::fs::write(&path, "retention = \"90\"\n").unwrap();
    let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("ax.toml") && text.contains("has no unit"),
        "{text}"
    );
}

#[test]
fn connection_limits_come_from_flags_or_the_file_and_have_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(
        &path,
        "max_connections = 500\nfirst_request_timeout = \"3s\"\nidle_connection_timeout = \"1m\"\nkeepalive_interval = \"5s\"\nkeepalive_timeout = \"7s\"\n",
    )
    .unwrap();
    let args = ["ax-scheduler", "--config", path.to_str().unwrap()];
    let from_file = Args::parse_from(args).into_options().unwrap().connections;
    assert_eq!(
        from_file,
        ConnectionLimits {
            max_connections: 500,
            first_request_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(7),
        }
    );
    let flags = Args::parse_from(
        [
            &args[..],
            &[
                "--max-connections",
                "64",
                "--first-request-timeout",
                "1s",
                "--idle-connection-timeout",
                "2s",
            ],
        ]
        .concat(),
    )
    .into_options()
    .unwrap()
    .connections;
    assert_eq!(
        (
            flags.max_connections,
            flags.first_request_timeout,
            flags.idle_timeout,
            flags.keepalive_timeout
        ),
        (
            64,
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::from_secs(7)
        )
    );
    let defaults = Args::parse_from(["ax-scheduler"])
        .into_options()
        .unwrap()
        .connections;
    assert_eq!(defaults, ConnectionLimits::default());
    assert_eq!(defaults.max_connections, 10_000);
    assert_eq!(defaults.first_request_timeout, Duration::from_secs(10));
    for (flag, value, says) in [
        (
            "--max-connections",
            "0",
            "max_connections must be at least 1",
        ),
        (
            "--first-request-timeout",
            "0s",
            "first_request_timeout must be at least 100ms",
        ),
        (
            "--idle-connection-timeout",
            "10ms",
            "idle_connection_timeout must be at least 100ms",
        ),
    ] {
        let err = Args::parse_from(["ax-scheduler", flag, value])
            .into_options()
            .unwrap_err();
        assert!(err.to_string().contains(says), "{flag} {value}: {err}");
    }
    std::fs::write(&path, "idle_connection_timeout = \"soon\"\n").unwrap();
    let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap_err();
    assert!(err.to_string().contains("idle_connection_timeout"), "{err}");
}

#[test]
fn a_bad_file_names_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(&path, "heartbeat_interval = \"soon\"\n").unwrap();
    let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "config file {}: line 1, column 22: heartbeat_interval: invalid duration \"soon\": \
             expected a form like 500ms, 1.5s, 10m, 2h, 1h30m, 90d or a number of seconds",
            path.display()
        )
    );
    std::fs::write(
        &path,
        "[pools]\netl = 4\n[alerts]\nchannels = []\nstrategy = \"x\"\n",
    )
    .unwrap();
    let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap_err();
    assert!(
        err.to_string().contains("line 5, column 1: unknown key"),
        "{err}"
    );
    std::fs::write(&path, "listen = \"127.0.0.1:7070\"\ncolour = \"blue\"\n").unwrap();
    let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("ax.toml: line 2, column 1: unknown key, expected one of `listen`"),
        "{text}"
    );
}

/// `--config` given a file that is not TOML (a key, a token) says what is wrong and where,
/// never what the file holds.
#[test]
fn a_file_that_is_not_toml_is_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret.key");
    let secrets = [
        "AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nmore\n",
        "axt_5hG7kQ2mN9pR4sT8vW1xY3zA6bC0dE=\n",
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n",
        "password: hunter2-very-secret\n",
        "[section\nsecret = 'sk_prod_4eC39HqLyjWDarjtT1zdp7dc\n",
        "sk_prod_4eC39HqLyjWDarjtT1zdp7dc = \"a\"\n",
        "listen = \"sk_prod_4eC39HqLyjWDarjtT1zdp7dc\"\n",
        "\u{feff}é sëcrét-ünïcødé-1234\n",
    ];
    for secret in secrets {
        std::fs::write(&path, secret).unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.starts_with(&format!("config file {}: line ", path.display())),
            "{text}"
        );
        assert!(text.contains(", column "), "{text}");
        let said = &text[format!("config file {}: ", path.display()).len()..];
        let chars: Vec<char> = secret.chars().filter(|c| !c.is_whitespace()).collect();
        for piece in chars.windows(4) {
            let piece: String = piece.iter().collect();
            assert!(
                !said.contains(&piece),
                "{said:?} quotes {piece:?} of {secret:?}"
            );
        }
    }
    std::fs::write(&path, secrets[0]).unwrap();
    let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        format!(
            "config file {}: line 1, column 22: key with no value, expected `=`",
            path.display()
        )
    );
}

#[test]
fn the_lease_settings_come_from_flags_or_the_file_and_a_short_lease_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(
        &path,
        "advertise = \"http://sched-1:7070\"\nnode_lease = \"6s\"\nmax_clock_offset = \"250ms\"\n",
    )
    .unwrap();
    let options = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap();
    assert_eq!(options.advertise.as_deref(), Some("http://sched-1:7070"));
    assert_eq!(options.node_lease, Duration::from_secs(6));
    assert_eq!(options.max_clock_offset, Duration::from_millis(250));
    let defaults = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
    assert_eq!(defaults.node_lease, Duration::from_secs(10));
    assert_eq!(defaults.advertise, None);
    assert_eq!(defaults.spread_interval, Some(Duration::from_secs(10)));
    let err = Args::parse_from(["ax-scheduler", "--node-lease", "500ms"])
        .into_options()
        .unwrap_err();
    assert!(
        err.to_string().contains("node_lease must be at least 1s"),
        "{err}"
    );
}

#[test]
fn the_bounds_on_waiting_instances_come_from_flags_or_the_file_and_zero_is_no_bound() {
    use ax_core::admission::Bounds;
    let defaults = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
    assert_eq!(defaults.admission, Bounds::DEFAULT);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(
        &path,
        "max_waiting = 800
max_waiting_per_app = 300
",
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let from_file = Args::parse_from(["ax-scheduler", "--config", file])
        .into_options()
        .unwrap();
    assert_eq!(
        from_file.admission,
        Bounds {
            total: Some(800),
            per_app: Some(300)
        }
    );
    let off = Args::parse_from([
        "ax-scheduler",
        "--config",
        file,
        "--max-waiting-per-app",
        "0",
    ])
    .into_options()
    .unwrap();
    assert_eq!(
        off.admission,
        Bounds {
            total: Some(800),
            per_app: None
        }
    );
}

#[test]
fn the_spread_interval_comes_from_flags_or_the_file_and_zero_turns_it_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ax.toml");
    std::fs::write(&path, "spread_interval = \"30s\"\n").unwrap();
    let from_file = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
        .into_options()
        .unwrap();
    assert_eq!(from_file.spread_interval, Some(Duration::from_secs(30)));
    let off = Args::parse_from([
        "ax-scheduler",
        "--config",
        path.to_str().unwrap(),
        "--spread-interval",
        "0",
    ])
    .into_options()
    .unwrap();
    assert_eq!(off.spread_interval, None);
}

#[test]
fn auth_defaults_to_tokens_off_loopback_and_tls_files_come_in_pairs() {
    let on = |args: &[&str]| {
        let mut all = vec!["ax-scheduler"];
        all.extend_from_slice(args);
        Args::parse_from(all).into_options()
    };
    assert_eq!(on(&[]).unwrap().auth, AuthMode::Off);
    assert_eq!(
        on(&["--listen", "0.0.0.0:7070"]).unwrap().auth,
        AuthMode::Tokens
    );
    assert_eq!(
        on(&["--listen", "127.0.0.1:7070", "--auth", "tokens"])
            .unwrap()
            .auth,
        AuthMode::Tokens
    );
    let err = on(&["--tls-cert", "a.pem"]).unwrap_err().to_string();
    assert!(err.contains("--tls-cert needs --tls-key"), "{err}");
    let err = on(&["--tls-client-ca", "ca.pem"]).unwrap_err().to_string();
    assert!(err.contains("--tls-client-ca needs --tls-cert"), "{err}");
    let tls = on(&["--tls-cert", "a.pem", "--tls-key", "a.key"])
        .unwrap()
        .tls
        .unwrap();
    assert_eq!(tls.cert, PathBuf::from("a.pem"));
    assert_eq!(tls.client_ca, None);
    let err = Args::try_parse_from(["ax-scheduler", "--auth", "maybe"]).unwrap_err();
    assert!(err.to_string().contains("expected tokens or none"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("secret.key");
    std::fs::write(&key, "c2hvcnQ=\n").unwrap();
    let err = on(&["--secret-key-file", key.to_str().unwrap()]).unwrap_err();
    assert!(
        format!("{err:#}").contains("5 bytes; it must be 32"),
        "{err:#}"
    );
}

#[test]
fn a_switch_on_the_command_line_is_read() {
    let options = Args::try_parse_from(["ax-scheduler", "--insecure", "--listen", "0.0.0.0:0"])
        .expect("--insecure parses")
        .into_options()
        .unwrap();
    assert!(options.insecure);
    let options = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
    assert!(!options.insecure);
}

#[test]
fn every_switch_can_be_unset() {
    for arg in Cli::command().get_arguments() {
        if !arg.get_action().takes_values() && arg.get_id() != "help" && arg.get_id() != "version" {
            let mut settings = Settings::default();
            settings.unset_switch(arg.get_id().as_str());
        }
    }
}
