//! The end-to-end suite, one binary: a module per subject, each opening with what it covers and
//! listing its tests in `tests()` with what they need (see `ax_integration_tests::requirements`).
//! A test whose requirement is missing here is reported as ignored, with the reason.

use ax_integration_tests::harness::{self, Test};

mod admission;
mod backups;
mod bench_quick;
mod cluster;
mod cluster_control;
mod cluster_faults;
mod cluster_workers;
mod conditions;
mod dag_semantics;
mod deadlines;
mod deploy;
mod e2e;
mod faults;
mod folders;
mod for_each;
mod for_each_faults;
mod fuzz_stream;
mod galera;
mod marks;
mod metrics;
mod outputs;
mod processes;
mod python_sdk;
mod readme;
mod restarts;
mod retention;
mod routing;
mod scale;
mod schedule_policies;
mod security;
mod sub_workflows;
mod traces;
mod trigger_rules;
mod triggers;
mod typescript_sdk;
mod upgrades;
mod views;
mod watch_run;
mod web_api;
mod web_ui;
mod worker_restarts;

fn main() -> std::process::ExitCode {
    // In-process nodes and workers log to stderr under `AX_TEST_TRACE=FILTER` (`info`,
    // `ax_worker=debug`), to see what they did in a failing test; silent otherwise.
    if let Ok(filter) = std::env::var("AX_TEST_TRACE") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let tests: Vec<Vec<Test>> = vec![
        admission::tests(),
        backups::tests(),
        bench_quick::tests(),
        cluster::tests(),
        cluster_control::tests(),
        cluster_faults::tests(),
        cluster_workers::tests(),
        conditions::tests(),
        dag_semantics::tests(),
        deadlines::tests(),
        deploy::tests(),
        e2e::tests(),
        faults::tests(),
        folders::tests(),
        for_each::tests(),
        for_each_faults::tests(),
        fuzz_stream::tests(),
        galera::tests(),
        marks::tests(),
        metrics::tests(),
        outputs::tests(),
        processes::tests(),
        python_sdk::tests(),
        readme::tests(),
        restarts::tests(),
        retention::tests(),
        routing::tests(),
        scale::tests(),
        schedule_policies::tests(),
        security::tests(),
        sub_workflows::tests(),
        traces::tests(),
        trigger_rules::tests(),
        triggers::tests(),
        typescript_sdk::tests(),
        upgrades::tests(),
        views::tests(),
        watch_run::tests(),
        web_api::tests(),
        web_ui::tests(),
        worker_restarts::tests(),
    ];
    harness::run(tests.into_iter().flatten().collect())
}
