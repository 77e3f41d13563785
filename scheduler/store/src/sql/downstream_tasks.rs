//! The direct downstream tasks of a task in a workflow version, read once and kept. A version
//! never changes once applied, so a report batch whose succeeded tasks were all seen before
//! reads no edges at all; the tasks not seen yet are read as before, one statement per workflow
//! version, through the index and only for those tasks (the advance stays O(downstream)). With
//! a hundred workflows finishing tasks every second (W8), the read was a statement per workflow
//! in every report batch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use sqlx::Row;

use super::counted::Counted;
use super::{NAMES_PER_STATEMENT, in_list};
use crate::Result;

/// Tasks kept at most; past it everything kept is forgotten and read again as needed.
const KEPT_TASKS: usize = 1_000_000;

/// A task of a workflow version: (workflow, version, task).
pub(crate) type VersionTask = (i64, i64, String);

#[derive(Default)]
pub(crate) struct DownstreamTasks {
    kept: Mutex<HashMap<VersionTask, Vec<String>>>,
}

impl DownstreamTasks {
    /// The direct downstream tasks of each of `tasks` (none for a task without any), in name
    /// order; those not kept yet are read through `c`.
    pub(crate) async fn of(
        &self,
        c: &mut Counted<'_>,
        tasks: &BTreeSet<VersionTask>,
    ) -> Result<HashMap<VersionTask, Vec<String>>> {
        let mut found = HashMap::with_capacity(tasks.len());
        let mut missing: BTreeMap<(i64, i64), Vec<&str>> = BTreeMap::new();
        {
            let kept = self.kept();
            for task in tasks {
                match kept.get(task) {
                    Some(downstream) => {
                        found.insert(task.clone(), downstream.clone());
                    }
                    None => missing
                        .entry((task.0, task.1))
                        .or_default()
                        .push(task.2.as_str()),
                }
            }
        }
        for ((workflow, version), names) in missing {
            let mut read: HashMap<VersionTask, Vec<String>> = names
                .iter()
                .map(|name| ((workflow, version, name.to_string()), Vec::new()))
                .collect();
            for names in names.chunks(NAMES_PER_STATEMENT) {
                let (list, names) = in_list(names.iter().copied());
                let sql = format!(
                    "SELECT upstream, downstream FROM task_dependency \
                     WHERE workflow_id = ? AND version = ? AND upstream IN ({list}) \
                     ORDER BY upstream, downstream"
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(workflow)
                    .bind(version);
                for name in names {
                    query = query.bind(name);
                }
                for row in query.fetch_all(&mut *c).await? {
                    read.entry((workflow, version, row.try_get("upstream")?))
                        .or_default()
                        .push(row.try_get("downstream")?);
                }
            }
            let mut kept = self.kept();
            if kept.len() + read.len() > KEPT_TASKS {
                kept.clear();
            }
            for (task, downstream) in read {
                kept.insert(task.clone(), downstream.clone());
                found.insert(task, downstream);
            }
        }
        Ok(found)
    }

    fn kept(&self) -> MutexGuard<'_, HashMap<VersionTask, Vec<String>>> {
        // Whole after any panic (single inserts and a clear), so a poisoned lock is usable.
        self.kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
