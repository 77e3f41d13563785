//! Column assignments for many rows, written as one `UPDATE … SET col = CASE key WHEN …` per
//! set of columns instead of one statement per row.
//!
//! The transitions of a batch (a report batch, a dispatch batch) are decided in memory on rows
//! the transaction has already read under lock (`FOR UPDATE` on MySQL; SQLite writers are
//! serialized), so every assignment is known to apply: what is left is to send them in as few
//! statements as the database accepts.

use std::collections::{BTreeMap, HashSet};

use sqlx::AnyConnection;
use sqlx::any::Any;
use sqlx::query::Query;

use super::{padded_len, placeholders};
use crate::Result;

/// Rows per statement: `CASE key WHEN …` is a linear search per row, so a statement's cost
/// grows with the square of its rows; this keeps it small and under every bind limit.
const ROWS_PER_STATEMENT: usize = 128;

/// A column's new value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(Some(v))
    }
}

impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Value {
        Value::Int(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(Some(v.to_string()))
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(Some(v))
    }
}

/// One row's key (id or instance id, attempt) and its new values, in column order.
type Row = (i64, i64, Vec<Value>);

/// How the rows of a table are addressed: by `id`, or by (`instance_id`, `attempt`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Table {
    Instance,
    Attempt,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Instance => "task_instance",
            Table::Attempt => "task_attempt",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Table::Instance => "id",
            Table::Attempt => "instance_id",
        }
    }
}

/// The assignments to the rows of one table, merged per row in the order they were made (a
/// later assignment to the same column wins).
#[derive(Debug)]
pub(crate) struct Patches {
    table: Table,
    /// (key, attempt) → column → value; attempt is 0 for the instance table.
    rows: BTreeMap<(i64, i64), BTreeMap<&'static str, Value>>,
}

impl Patches {
    pub(crate) fn new(table: Table) -> Patches {
        Patches {
            table,
            rows: BTreeMap::new(),
        }
    }

    /// Sets `columns` of the instance row `id` (or of attempt row (`id`, `attempt`)).
    pub(crate) fn set(
        &mut self,
        id: i64,
        attempt: i64,
        columns: impl IntoIterator<Item = (&'static str, Value)>,
    ) {
        let attempt = match self.table {
            Table::Instance => 0,
            Table::Attempt => attempt,
        };
        self.rows.entry((id, attempt)).or_default().extend(columns);
    }

    /// Sends the assignments: rows with the same columns share statements, each in key order (the
    /// order every transaction locks rows in). Returns the statements sent.
    pub(crate) async fn write(self, c: &mut AnyConnection) -> Result<u64> {
        let mut shapes: BTreeMap<Vec<&'static str>, Vec<Row>> = BTreeMap::new();
        for ((id, attempt), columns) in self.rows {
            let names: Vec<&'static str> = columns.keys().copied().collect();
            let values: Vec<Value> = columns.into_values().collect();
            shapes.entry(names).or_default().push((id, attempt, values));
        }
        let mut sent = 0;
        for (columns, rows) in shapes {
            for chunk in chunks_of_distinct_keys(&rows) {
                // Padded like an `IN` list (the last row again changes nothing), so that
                // batches of every size share a few statement texts.
                let mut chunk = chunk.to_vec();
                if let Some(last) = chunk.last().cloned() {
                    chunk.resize(padded_len(chunk.len()), last);
                }
                write_chunk(c, self.table, &columns, &chunk).await?;
                sent += 1;
            }
        }
        Ok(sent)
    }
}

async fn write_chunk(
    c: &mut AnyConnection,
    table: Table,
    columns: &[&'static str],
    rows: &[Row],
) -> Result<()> {
    let key = table.key();
    let whens = vec!["WHEN ? THEN ?"; rows.len()].join(" ");
    let sets: Vec<String> = columns
        .iter()
        .map(|column| format!("{column} = CASE {key} {whens} END"))
        .collect();
    let mut sql = format!(
        "UPDATE {} SET {} WHERE {key} IN ({})",
        table.name(),
        sets.join(", "),
        placeholders(rows.len())
    );
    if let Table::Attempt = table {
        sql.push_str(&format!(" AND attempt = CASE {key} {whens} END"));
    }
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (i, _) in columns.iter().enumerate() {
        for (id, _, values) in rows {
            query = bind(query.bind(*id), &values[i]);
        }
    }
    for (id, _, _) in rows {
        query = query.bind(*id);
    }
    if let Table::Attempt = table {
        for (id, attempt, _) in rows {
            query = query.bind(*id).bind(*attempt);
        }
    }
    query.execute(&mut *c).await?;
    Ok(())
}

fn bind<'q>(
    query: Query<'q, Any, sqlx::any::AnyArguments>,
    value: &Value,
) -> Query<'q, Any, sqlx::any::AnyArguments> {
    match value {
        Value::Int(v) => query.bind(*v),
        Value::Text(v) => query.bind(v.clone()),
    }
}

/// Splits rows (sorted by key) into chunks of at most [`ROWS_PER_STATEMENT`] in which no key
/// appears twice, so `CASE key WHEN …` names one row per key.
fn chunks_of_distinct_keys<T>(rows: &[(i64, i64, T)]) -> Vec<&[(i64, i64, T)]> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut seen: HashSet<i64> = HashSet::new();
    for (i, (id, _, _)) in rows.iter().enumerate() {
        if i - start == ROWS_PER_STATEMENT || !seen.insert(*id) {
            chunks.push(&rows[start..i]);
            start = i;
            seen.clear();
            seen.insert(*id);
        }
    }
    if start < rows.len() {
        chunks.push(&rows[start..]);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_never_repeat_a_key_and_stay_under_the_row_limit() {
        let rows: Vec<(i64, i64, ())> = (0..300)
            .map(|i| (i / 2, i % 2, ()))
            .chain([(500, 1, ()), (500, 2, ())])
            .collect();
        let chunks = chunks_of_distinct_keys(&rows);
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), rows.len());
        for chunk in &chunks {
            assert!(chunk.len() <= ROWS_PER_STATEMENT);
            let keys: HashSet<i64> = chunk.iter().map(|(id, _, _)| *id).collect();
            assert_eq!(keys.len(), chunk.len(), "a key twice in {chunk:?}");
        }
    }

    #[test]
    fn later_assignments_to_a_row_win_and_merge_with_earlier_ones() {
        let mut patches = Patches::new(Table::Instance);
        patches.set(7, 0, [("state", "RUNNING".into()), ("pid", 1.into())]);
        patches.set(7, 0, [("state", "SUCCESS".into())]);
        let row = &patches.rows[&(7, 0)];
        assert_eq!(row["state"], Value::from("SUCCESS"));
        assert_eq!(row["pid"], Value::from(1));
    }
}
