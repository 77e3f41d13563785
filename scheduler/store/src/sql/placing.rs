//! First attempts placed in the transaction that creates them ([`crate::Placement`]): a run's
//! root instances (`run_roots.rs`) and the instances an advance makes ready (`reports.rs`)
//! are offered to the node's placement as they are inserted; a placed one is inserted
//! DISPATCHED to its worker, and its attempt row is written as a claim writes it
//! (`dispatch.rs`), in the same transaction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ax_core::Millis;
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::{in_list, pow2_chunks, rows, values_rows};
use crate::{NewAttempt, PlacedAttempt, Placement, Result};

/// The state a first attempt is inserted in, and its worker when it was placed.
pub(crate) type Placed = (&'static str, Option<String>);

/// What a run gives the dispatches of its instances: its logical time, params and what it
/// tells its handlers.
type RunFacts = (Millis, BTreeMap<String, String>, BTreeMap<String, String>);

/// The placement of one transaction and what it placed so far.
pub(crate) struct Placing<'p> {
    placement: Option<&'p mut dyn Placement>,
    now: Millis,
    /// Placed in this transaction, by instance id, with their worker.
    placed: BTreeMap<i64, (NewAttempt, String)>,
    /// Placed since the attempt rows were last written.
    unwritten: Vec<i64>,
    runs: HashMap<i64, RunFacts>,
    /// Runs that kept outputs (before this transaction or in it): their placed dispatches carry
    /// the outputs of the tasks above them.
    with_outputs: BTreeSet<i64>,
}

impl<'p> Placing<'p> {
    /// A placement at `now` (the dispatch time of what it places).
    pub(crate) fn new(placement: &'p mut dyn Placement, now: Millis) -> Placing<'p> {
        Placing {
            placement: Some(placement),
            now,
            placed: BTreeMap::new(),
            unwritten: Vec::new(),
            runs: HashMap::new(),
            with_outputs: BTreeSet::new(),
        }
    }

    /// Places nothing.
    pub(crate) fn none() -> Placing<'static> {
        Placing {
            placement: None,
            now: 0,
            placed: BTreeMap::new(),
            unwritten: Vec::new(),
            runs: HashMap::new(),
            with_outputs: BTreeSet::new(),
        }
    }

    /// Whether anything may be placed.
    pub(crate) fn is_active(&self) -> bool {
        self.placement.is_some()
    }

    /// The state and worker to insert a new first attempt with: DISPATCHED to a worker when it
    /// is placed, WAITING otherwise.
    pub(crate) fn place(&mut self, attempt: NewAttempt) -> Placed {
        let Some(placement) = self.placement.as_deref_mut() else {
            return (InstanceState::Waiting.as_str(), None);
        };
        match placement.place(&attempt) {
            Some(worker) => {
                self.unwritten.push(attempt.instance_id.0);
                self.placed
                    .insert(attempt.instance_id.0, (attempt, worker.clone()));
                (InstanceState::Dispatched.as_str(), Some(worker))
            }
            None => (InstanceState::Waiting.as_str(), None),
        }
    }

    /// Notes a run's logical time and params, for the dispatches of its placed instances.
    pub(crate) fn run_facts(
        &mut self,
        run: i64,
        logical_time: Millis,
        params: &BTreeMap<String, String>,
        run_env: BTreeMap<String, String>,
        outputs_bytes: i64,
    ) {
        if self.placement.is_some() {
            self.runs
                .insert(run, (logical_time, params.clone(), run_env));
            if outputs_bytes > 0 {
                self.with_outputs.insert(run);
            }
        }
    }

    /// Notes that a run's outputs grew in this transaction.
    pub(crate) fn outputs_grew(&mut self, run: i64) {
        self.with_outputs.insert(run);
    }

    /// Instances placed but not inserted after all (an insert that ignored rows whose task
    /// had an instance already): they are not dispatched.
    pub(crate) fn not_inserted(&mut self, ids: &BTreeSet<i64>) {
        self.placed.retain(|id, _| !ids.contains(id));
        self.unwritten.retain(|id| !ids.contains(id));
    }

    /// Writes the attempt rows of what was placed since the last call: one multi-row insert.
    pub(crate) async fn write_attempts(&mut self, c: &mut AnyConnection) -> Result<()> {
        let Some(placement) = self.placement.as_deref() else {
            return Ok(());
        };
        let node = placement.node_id().to_string();
        let fresh: Vec<(&NewAttempt, &String)> = self
            .unwritten
            .iter()
            .filter_map(|id| self.placed.get(id))
            .map(|(attempt, worker)| (attempt, worker))
            .collect();
        for chunk in pow2_chunks(&fresh) {
            let sql = format!(
                "INSERT INTO task_attempt (instance_id, attempt, state, worker_id, node_id, \
                 dispatched_at, log_lines, message) VALUES {}",
                values_rows(chunk.len(), 8)
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (attempt, worker) in chunk {
                query = query
                    .bind(attempt.instance_id.0)
                    .bind(1i64)
                    .bind(InstanceState::Dispatched.as_str())
                    .bind(worker.as_str())
                    .bind(node.as_str())
                    .bind(self.now)
                    .bind(0i64)
                    .bind("");
            }
            query.execute(&mut *c).await?;
        }
        self.unwritten.clear();
        Ok(())
    }

    /// What was placed, with what each dispatch carries from its run (read in one statement for
    /// the runs not noted).
    pub(crate) async fn finish(mut self, c: &mut AnyConnection) -> Result<Vec<PlacedAttempt>> {
        if self.placed.is_empty() {
            return Ok(Vec::new());
        }
        let unknown: BTreeSet<i64> = self
            .placed
            .values()
            .map(|(attempt, _)| attempt.run_id.0)
            .filter(|run| !self.runs.contains_key(run))
            .collect();
        if !unknown.is_empty() {
            let (list, padded) = in_list(unknown);
            let sql = format!(
                "SELECT id, logical_time, params_json, handler_env_json, outputs_bytes FROM run \
                 WHERE id IN ({list})"
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for run in padded {
                query = query.bind(run);
            }
            for row in query.fetch_all(&mut *c).await? {
                let params =
                    rows::map_json(&row.try_get::<String, _>("params_json")?, "run params")?;
                let facts = (row.try_get("logical_time")?, params, rows::run_env(&row)?);
                let run: i64 = row.try_get("id")?;
                if row.try_get::<i64, _>("outputs_bytes")? > 0 {
                    self.with_outputs.insert(run);
                }
                self.runs.insert(run, facts);
            }
        }
        let placed_runs: BTreeSet<i64> = self
            .placed
            .values()
            .map(|(attempt, _)| attempt.run_id.0)
            .filter(|run| self.with_outputs.contains(run))
            .collect();
        let outputs = super::outputs::of_runs(c, &placed_runs).await?;
        let now = self.now;
        Ok(std::mem::take(&mut self.placed)
            .into_values()
            .map(|(attempt, worker_id)| {
                let run = attempt.run_id.0;
                let (logical_time, params, run_env) = self
                    .runs
                    .get(&attempt.run_id.0)
                    .cloned()
                    .unwrap_or_default();
                PlacedAttempt {
                    attempt,
                    worker_id,
                    dispatched_at: now,
                    logical_time,
                    params,
                    run_env,
                    run_outputs: outputs.get(&run).cloned().unwrap_or_default(),
                }
            })
            .collect())
    }
}
