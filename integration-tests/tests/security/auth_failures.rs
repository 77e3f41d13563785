//! Failed authentications as the audit trail keeps them: a flood from many addresses writes a
//! bounded number of rows that still count every failure, and audit rows go when the audit
//! retention says so.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::{Backend, Cluster, TestDb};
use ax_scheduler::{AuthMode, SchedulerOptions};
use ax_store::{AuditFilter, AuditRecord};

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread) a_flood_of_failures_from_many_addresses_writes_few_rows_and_counts_them_all),
        trial!(async(multi_thread) audit_rows_past_the_audit_retention_are_purged),
    ]
}

/// 250 addresses (127.0.0.2 …) each failing 19 times, just under the throttle, as the finding
/// did: 4,750 failures that wrote 4,750 rows.
const ADDRESSES: u8 = 250;
const FAILURES_EACH: usize = 19;

/// How many failures a row stands for: one for a row of its own, the count of a summary.
fn failures_in(row: &AuditRecord) -> u64 {
    let number = |text: &str| text.split(' ').next().and_then(|n| n.parse::<u64>().ok());
    if row.target != "(summary)" {
        return 1;
    }
    number(&row.detail).unwrap_or_else(|| panic!("a summary without a count: {row:?}"))
}

async fn a_flood_of_failures_from_many_addresses_writes_few_rows_and_counts_them_all() {
    let dir = tempfile::tempdir().expect("dir");
    let db = TestDb::create(Backend::Sqlite, dir.path())
        .await
        .expect("db");
    let scheduler = ax_scheduler::start(SchedulerOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store_url: db.url.clone(),
        auth: AuthMode::Tokens,
        ..SchedulerOptions::default()
    })
    .await
    .expect("scheduler");
    let url = format!("http://{}/api/v1/workflows", scheduler.local_addr());
    let started = Instant::now();
    let floods: Vec<_> = (2..2 + ADDRESSES)
        .map(|last| {
            let url = url.clone();
            tokio::spawn(async move {
                let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
                let http = reqwest::Client::builder()
                    .local_address(from)
                    .build()
                    .expect("client");
                for _ in 0..FAILURES_EACH {
                    let answer = http
                        .get(&url)
                        .bearer_auth("axt_not-a-real-token-but-shaped-like-one-000000")
                        .send()
                        .await
                        .expect("get");
                    assert_eq!(answer.status(), 401);
                }
            })
        })
        .collect();
    for flood in floods {
        flood.await.expect("flood");
    }
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the flood hangs"
    );
    let store = ax_store::open(&db.url).await.expect("store");
    let query = AuditFilter {
        limit: 100_000,
        action: Some("auth_failed".into()),
        ..Default::default()
    };
    let during = store.query_audit(&query).await.expect("audit");
    assert!(
        during.len() <= 100,
        "at most 100 rows of their own a minute: {}",
        during.len()
    );
    // Stopping the node writes the window's summaries.
    scheduler.shutdown().await.expect("shutdown");
    let rows = store.query_audit(&query).await.expect("audit");
    assert!(
        rows.len() <= 201,
        "{} rows for a minute's flood",
        rows.len()
    );
    let counted: u64 = rows.iter().map(failures_in).sum();
    assert_eq!(
        counted,
        u64::from(ADDRESSES) * FAILURES_EACH as u64,
        "every failure is counted: {rows:#?}"
    );
    let overflow = rows
        .iter()
        .find(|row| row.detail.contains("addresses since"))
        .expect("an overflow row");
    assert!(
        overflow.detail.contains("from 150 addresses"),
        "{overflow:?}"
    );
    db.drop_database().await.expect("drop");
}

async fn audit_rows_past_the_audit_retention_are_purged() {
    let cluster = Cluster::builder(Backend::Sqlite)
        .auth(AuthMode::Tokens)
        .audit_retention(Duration::from_secs(3_600))
        .purge_interval(Duration::from_millis(200))
        .start()
        .await
        .expect("cluster");
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let now = chrono::Utc::now().timestamp_millis();
    let row = |at: i64, detail: &str| AuditRecord {
        at,
        actor: "alice".into(),
        action: "trigger".into(),
        target: "workflow/w".into(),
        detail: detail.into(),
        remote: "127.0.0.1:1".into(),
        token: "alice".into(),
    };
    store
        .insert_audits(&[row(now - 2 * 3_600_000, "old"), row(now - 60_000, "recent")])
        .await
        .expect("rows");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let details: Vec<String> = store
            .list_audit(10)
            .await
            .expect("audit")
            .into_iter()
            .map(|r| r.detail)
            .collect();
        if details == vec!["recent".to_string()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old row is not purged: {details:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.shutdown().await.expect("shutdown");
}
