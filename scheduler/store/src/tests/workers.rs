//! Conformance scenario of workers' rows, saved and read back beside audit rows
//! (`sql/workers.rs`, `sql/audit.rs`).

use std::collections::BTreeMap;

use super::support::*;
use crate::*;

conformance!(workers_and_audit_round_trip);

mod scenarios {
    use super::*;

    pub(super) async fn workers_and_audit_round_trip(ctx: Ctx) {
        let s = ctx.s();
        let mut w = WorkerRecord {
            id: "host-1:77".into(),
            version: "0.1.0".into(),
            hostname: "host-1".into(),
            labels: BTreeMap::from([("gpu".to_string(), "a100".to_string())]),
            capacity: 20,
            running: 3,
            started_at: T0,
            last_heartbeat: T0 + 5_000,
            node_id: "sched-a".into(),
            draining: false,
            connected: true,
            apps: Some(vec!["finance".into(), "sales".into()]),
            incarnation: "f00d".into(),
        };
        s.upsert_workers(std::slice::from_ref(&w)).await.unwrap();
        let other = WorkerRecord {
            id: "a-first".into(),
            labels: BTreeMap::new(),
            apps: None,
            incarnation: String::new(),
            ..w.clone()
        };
        s.upsert_workers(std::slice::from_ref(&other))
            .await
            .unwrap();
        w.running = 0;
        w.draining = true;
        w.connected = false;
        w.last_heartbeat = T0 + 10_000;
        s.upsert_workers(std::slice::from_ref(&w)).await.unwrap();
        assert_eq!(s.list_workers().await.unwrap(), [other.clone(), w.clone()]);

        // One save of many rows: new and existing workers, one of them listed twice (its last
        // record stays), in an order that is not the ids'.
        let mut many: Vec<WorkerRecord> = (0..300)
            .rev()
            .map(|n| WorkerRecord {
                id: format!("sim-{n:03}"),
                running: n,
                ..other.clone()
            })
            .collect();
        let mut w_again = w.clone();
        w_again.connected = true;
        w_again.last_heartbeat = T0 + 15_000;
        many.insert(7, w.clone());
        many.push(w_again.clone());
        s.upsert_workers(&many).await.unwrap();
        s.upsert_workers(&[]).await.unwrap();
        let listed = s.list_workers().await.unwrap();
        assert_eq!(listed.len(), 302);
        assert_eq!(listed[0], other);
        assert_eq!(listed[1], w_again);
        assert_eq!(listed[2].id, "sim-000");
        assert_eq!(listed[301].running, 299);

        // A save that arrives late from another node (older heartbeat) changes nothing: the
        // worker's row stays the one from the node it is connected to now.
        let late = WorkerRecord {
            node_id: "sched-b".into(),
            connected: false,
            last_heartbeat: T0 + 12_000,
            ..w_again.clone()
        };
        s.upsert_workers(std::slice::from_ref(&late)).await.unwrap();
        assert_eq!(s.list_workers().await.unwrap()[1], w_again);
        // One row by id: its apps and incarnation as saved (none: every app).
        assert_eq!(s.worker("host-1:77").await.unwrap(), Some(w_again.clone()));
        assert_eq!(s.worker("a-first").await.unwrap().unwrap().apps, None);
        assert_eq!(s.worker("nobody").await.unwrap(), None);
        let moved = WorkerRecord {
            incarnation: "beef".into(),
            apps: Some(vec!["hr".into()]),
            last_heartbeat: T0 + 16_000,
            ..w_again.clone()
        };
        s.upsert_workers(std::slice::from_ref(&moved))
            .await
            .unwrap();
        assert_eq!(s.worker("host-1:77").await.unwrap(), Some(moved));

        let audit = |at, action: &str| AuditRecord {
            at,
            actor: "alice".into(),
            action: action.into(),
            target: "workflow/daily".into(),
            detail: r#"{"version":2,"note":"caf\u00e9 \ud83d\ude00"}"#.into(),
            remote: "10.0.0.1:5555".into(),
            token: "deploy-bot".into(),
        };
        s.insert_audit(&audit(T0, "apply")).await.unwrap();
        s.insert_audits(&[audit(T0 + 2, "pause"), audit(T0 + 1, "trigger")])
            .await
            .unwrap();
        s.insert_audits(&[]).await.unwrap();
        let listed = s.list_audit(10).await.unwrap();
        assert_eq!(
            listed,
            [
                audit(T0 + 2, "pause"),
                audit(T0 + 1, "trigger"),
                audit(T0, "apply")
            ]
        );
        assert_eq!(s.list_audit(1).await.unwrap().len(), 1);
    }
}
