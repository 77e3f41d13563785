//! The outputs a run's tasks passed on, read for the dispatches of the tasks below them.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::outputs::Outputs;
use sqlx::{AnyConnection, Row};

use super::in_list;
use super::rows::map_json;
use crate::Result;

/// The outputs of each of `runs`' task instances that succeeded with outputs, by run and task:
/// one statement. Callers ask only for runs that kept outputs (`run.outputs_bytes > 0`), so a
/// run without outputs costs nothing; a run's are at most `ax_core::outputs::MAX_RUN_BYTES`.
pub(crate) async fn of_runs(
    c: &mut AnyConnection,
    runs: &BTreeSet<i64>,
) -> Result<BTreeMap<i64, BTreeMap<String, Outputs>>> {
    let mut found: BTreeMap<i64, BTreeMap<String, Outputs>> = BTreeMap::new();
    if runs.is_empty() {
        return Ok(found);
    }
    let (list, padded) = in_list(runs.iter().copied());
    let sql = format!(
        "SELECT ti.run_id, ti.task_name, ta.outputs_json FROM task_instance ti \
         JOIN task_attempt ta ON ta.instance_id = ti.id AND ta.attempt = ti.attempt \
         WHERE ti.run_id IN ({list}) AND ti.shard_slot = 0 AND ti.state = 'SUCCESS' \
         AND ta.outputs_json IS NOT NULL"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for run in padded {
        query = query.bind(run);
    }
    for row in query.fetch_all(&mut *c).await? {
        let outputs = map_json(
            &row.try_get::<String, _>("outputs_json")?,
            "attempt outputs",
        )?;
        found
            .entry(row.try_get("run_id")?)
            .or_default()
            .insert(row.try_get("task_name")?, outputs);
    }
    Ok(found)
}
