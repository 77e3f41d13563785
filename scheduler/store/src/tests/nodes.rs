//! Scheduler nodes' leases: one holder per node id, the database's clock, SQLite serving one
//! node, and a dead holder's lease taken over.

use super::support::*;
use crate::*;

conformance!(
    a_node_id_has_one_live_holder_on_the_database_clock,
    other_nodes_share_mysql_but_not_sqlite,
    an_expired_lease_is_free_to_claim,
);

mod scenarios {
    use super::*;

    fn node(id: &str, incarnation: &str) -> NodeLease {
        NodeLease {
            node_id: id.into(),
            incarnation: incarnation.into(),
            address: format!("http://{id}:7070"),
            version: "0.1.0".into(),
            started_at: 0,
            renewed_at: 0,
            expires_at: 0,
            clock_offset_ms: 0,
            pools: "etl=4".into(),
        }
    }

    fn wall_clock_ms() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as i64
    }

    fn refused_by(claim: LeaseClaim) -> Vec<(String, String)> {
        match claim {
            LeaseClaim::Refused { holders, .. } => holders
                .into_iter()
                .map(|h| (h.node_id, h.incarnation))
                .collect(),
            LeaseClaim::Claimed { .. } => panic!("expected a refusal, the lease was claimed"),
        }
    }

    pub(super) async fn a_node_id_has_one_live_holder_on_the_database_clock(ctx: Ctx) {
        let s = ctx.s();
        let before = wall_clock_ms();
        let claim = s
            .claim_node_lease(&node("n1", "first"), 10_000, &[])
            .await
            .unwrap();
        let LeaseClaim::Claimed { db_now } = claim else {
            panic!("the first claim of a free id is granted: {claim:?}");
        };
        // The database's clock and this machine's are the same clock here.
        assert!(
            (db_now - before).abs() < 5_000,
            "db_now {db_now} vs {before}"
        );

        let (now, leases) = s.list_node_leases().await.unwrap();
        assert!(now >= db_now);
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].incarnation, "first");
        assert_eq!(leases[0].started_at, db_now);
        assert_eq!(leases[0].expires_at, db_now + 10_000);

        // Another process with the same id is refused while the lease is live.
        let second = ctx.second_store().await;
        let refused = second
            .claim_node_lease(&node("n1", "second"), 10_000, &[])
            .await
            .unwrap();
        assert_eq!(
            refused_by(refused),
            [("n1".to_string(), "first".to_string())]
        );

        // The holder renews; a renewal by the other incarnation finds nothing to renew.
        let renewed = s.renew_node_lease("n1", "first", 10_000, 12).await.unwrap();
        assert!(renewed.is_some());
        assert_eq!(
            second
                .renew_node_lease("n1", "second", 10_000, 0)
                .await
                .unwrap(),
            None
        );
        let (_, leases) = s.list_node_leases().await.unwrap();
        assert_eq!(leases[0].clock_offset_ms, 12);

        // Read while renewing, then unchanged: the holder stopped, and the id can be taken over.
        let seen = leases[0].clone();
        let taken = second
            .claim_node_lease(&node("n1", "second"), 10_000, std::slice::from_ref(&seen))
            .await
            .unwrap();
        assert!(matches!(taken, LeaseClaim::Claimed { .. }), "{taken:?}");
        // The old holder learns it at its next renewal.
        assert_eq!(
            s.renew_node_lease("n1", "first", 10_000, 0).await.unwrap(),
            None
        );

        // A renewed lease is not presumed dead from an older reading.
        second
            .renew_node_lease("n1", "second", 10_000, 0)
            .await
            .unwrap();
        let stale = node("n1", "second");
        let refused = s
            .claim_node_lease(&node("n1", "third"), 10_000, &[stale])
            .await
            .unwrap();
        assert_eq!(
            refused_by(refused),
            [("n1".to_string(), "second".to_string())]
        );

        // A clean shutdown gives the id up at once.
        second.release_node_lease("n1", "second").await.unwrap();
        let claim = s
            .claim_node_lease(&node("n1", "third"), 10_000, &[])
            .await
            .unwrap();
        assert!(matches!(claim, LeaseClaim::Claimed { .. }), "{claim:?}");
    }

    pub(super) async fn other_nodes_share_mysql_but_not_sqlite(ctx: Ctx) {
        let s = ctx.s();
        let first = s
            .claim_node_lease(&node("n1", "a"), 10_000, &[])
            .await
            .unwrap();
        assert!(matches!(first, LeaseClaim::Claimed { .. }));
        let second = ctx.second_store().await;
        let other = second
            .claim_node_lease(&node("n2", "b"), 10_000, &[])
            .await
            .unwrap();
        match s.backend() {
            Backend::MySql => {
                assert!(matches!(other, LeaseClaim::Claimed { .. }), "{other:?}");
                let (_, leases) = s.list_node_leases().await.unwrap();
                let ids: Vec<&str> = leases.iter().map(|l| l.node_id.as_str()).collect();
                assert_eq!(ids, ["n1", "n2"]);
            }
            Backend::Sqlite => {
                assert_eq!(refused_by(other), [("n1".to_string(), "a".to_string())]);
                // An expired lease of another node no longer stands in the way, and goes.
                let dead = s.list_node_leases().await.unwrap().1;
                let taken = second
                    .claim_node_lease(&node("n2", "b"), 10_000, &dead)
                    .await
                    .unwrap();
                assert!(matches!(taken, LeaseClaim::Claimed { .. }), "{taken:?}");
                let (_, leases) = s.list_node_leases().await.unwrap();
                let ids: Vec<&str> = leases.iter().map(|l| l.node_id.as_str()).collect();
                assert_eq!(ids, ["n2"]);
            }
        }
    }

    pub(super) async fn an_expired_lease_is_free_to_claim(ctx: Ctx) {
        let s = ctx.s();
        let claim = s.claim_node_lease(&node("n1", "a"), 1, &[]).await.unwrap();
        assert!(matches!(claim, LeaseClaim::Claimed { .. }));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let second = ctx.second_store().await;
        let claim = second
            .claim_node_lease(&node("n1", "b"), 10_000, &[])
            .await
            .unwrap();
        assert!(matches!(claim, LeaseClaim::Claimed { .. }), "{claim:?}");
    }
}
