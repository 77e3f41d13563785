//! Conformance scenarios of audit rows: a run someone asked for gets its trigger row in its own
//! transaction, and rows filter by action, target and actor (`sql/audit.rs`).

use super::support::*;
use crate::*;

conformance!(
    a_new_run_asked_for_gets_its_trigger_audit_row_with_it,
    audit_rows_filter_by_action_target_and_actor,
);

mod scenarios {
    use super::*;

    pub(super) async fn a_new_run_asked_for_gets_its_trigger_audit_row_with_it(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("etl", vec![task("a", &[])])).await;
        let asked = |key: &str| NewRun {
            triggered_by: "bob".into(),
            audit_from: Some(Caller {
                remote: "10.0.0.9:5000".into(),
                token: "ci".into(),
            }),
            ..new_run(&wf, Some(key))
        };
        let created = s
            .create_runs(&[asked("k1"), asked("k2"), asked("k1"), new_run(&wf, None)])
            .await
            .unwrap();
        let news: Vec<bool> = created.iter().map(|(_, new)| *new).collect();
        assert_eq!(news, [true, true, false, true]);
        // The same key again, alone: the existing run, and no second row.
        let (again, new) = s.create_run(&asked("k2")).await.unwrap();
        assert!(!new);
        assert_eq!(again.id, created[1].0.id);

        let rows = s.list_audit(10).await.unwrap();
        let mut details: Vec<&str> = rows.iter().map(|row| row.detail.as_str()).collect();
        details.sort();
        let mut expected = vec![
            format!("run {}, params day", created[0].0.id),
            format!("run {}, params day", created[1].0.id),
        ];
        expected.sort();
        assert_eq!(details, expected, "one row per new run that asked for it");
        for row in &rows {
            assert_eq!(
                (row.at, row.actor.as_str(), row.action.as_str()),
                (T0, "bob", "trigger")
            );
            assert_eq!(
                (row.target.as_str(), row.remote.as_str()),
                ("workflow/etl", "10.0.0.9:5000")
            );
        }
    }

    pub(super) async fn audit_rows_filter_by_action_target_and_actor(ctx: Ctx) {
        let s = ctx.s();
        let row = |at, actor: &str, action: &str, target: &str| AuditRecord {
            at,
            actor: actor.into(),
            action: action.into(),
            target: target.into(),
            detail: String::new(),
            remote: "127.0.0.1:5000".into(),
            token: format!("{actor}-token"),
        };
        let rows = [
            row(T0, "alice", "apply", "workflow/etl"),
            row(T0 + 1, "bob", "trigger", "workflow/etl"),
            row(T0 + 2, "alice", "pause", "workflow/etl"),
            row(T0 + 3, "alice", "cancel", "run/7"),
            row(T0 + 4, "bob", "trigger", "workflow/other"),
        ];
        for r in &rows {
            s.insert_audit(r).await.unwrap();
        }
        let query =
            |action: Option<&str>, target: Option<&str>, actor: Option<&str>, limit| AuditFilter {
                limit,
                action: action.map(str::to_string),
                target: target.map(str::to_string),
                actor: actor.map(str::to_string),
                token: None,
            };
        let all = s.query_audit(&query(None, None, None, 10)).await.unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[0], rows[4], "newest first");
        assert_eq!(
            s.query_audit(&query(Some("trigger"), None, None, 10))
                .await
                .unwrap(),
            [rows[4].clone(), rows[1].clone()]
        );
        assert_eq!(
            s.query_audit(&query(None, Some("workflow/etl"), None, 10))
                .await
                .unwrap(),
            [rows[2].clone(), rows[1].clone(), rows[0].clone()]
        );
        assert_eq!(
            s.query_audit(&query(
                Some("trigger"),
                Some("workflow/etl"),
                Some("bob"),
                10
            ))
            .await
            .unwrap(),
            [rows[1].clone()]
        );
        assert_eq!(
            s.query_audit(&query(None, None, Some("alice"), 2))
                .await
                .unwrap(),
            [rows[3].clone(), rows[2].clone()]
        );
        // Exact matches only: a prefix or a different case finds nothing.
        assert!(
            s.query_audit(&query(None, Some("workflow/"), None, 10))
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            s.query_audit(&query(Some("TRIGGER"), None, None, 10))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(s.list_audit(3).await.unwrap(), all[..3]);
        let by_token = AuditFilter {
            limit: 10,
            token: Some("bob-token".into()),
            ..AuditFilter::default()
        };
        assert_eq!(
            s.query_audit(&by_token).await.unwrap(),
            [rows[4].clone(), rows[1].clone()]
        );
    }
}
