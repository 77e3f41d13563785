//! Rendering for stdout: aligned tables for people, JSON and YAML for programs.

use std::io::Write;

use anyhow::Context;
use chrono::{DateTime, Local, SecondsFormat, Utc};
use serde::Serialize;
use yaml_rust2::{Yaml, YamlEmitter};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
    /// `axctl dag` only: the task tree for a terminal (its default).
    Ascii,
    /// `axctl dag` only: Graphviz.
    Dot,
    /// `axctl dag` only: a mermaid flowchart.
    Mermaid,
}

/// Writes `value` to stdout in the chosen format; `table` renders the human form only when needed.
pub fn emit<T: Serialize>(
    output: Output,
    value: &T,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = match output {
        Output::Table => table(),
        Output::Json => to_json(value)?,
        Output::Yaml => to_yaml(value)?,
        Output::Ascii | Output::Dot | Output::Mermaid => {
            return Err(crate::error::CtlError::usage(
                "-o ascii, dot and mermaid are formats of `axctl dag` only; use table, json or yaml",
            )
            .into());
        }
    };
    write_stdout(&text)
}

pub fn to_json<T: Serialize>(value: &T) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(value).context("cannot encode JSON")?;
    text.push('\n');
    Ok(text)
}

/// YAML goes through `serde_json::Value`, so it carries exactly the fields the JSON form has.
pub fn to_yaml<T: Serialize>(value: &T) -> anyhow::Result<String> {
    let value = serde_json::to_value(value).context("cannot encode YAML")?;
    let mut text = String::new();
    YamlEmitter::new(&mut text)
        .dump(&json_to_yaml(&value))
        .map_err(|e| anyhow::anyhow!("cannot encode YAML: {e}"))?;
    text.push('\n');
    Ok(text)
}

pub fn json_to_yaml(value: &serde_json::Value) -> Yaml {
    use serde_json::Value;
    match value {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Integer(i),
            // Beyond i64 (or fractional): YAML's real keeps the digits as written.
            None => Yaml::Real(n.to_string()),
        },
        Value::String(s) => Yaml::String(s.clone()),
        Value::Array(items) => Yaml::Array(items.iter().map(json_to_yaml).collect()),
        Value::Object(map) => {
            let mut hash = yaml_rust2::yaml::Hash::new();
            for (key, value) in map {
                hash.insert(Yaml::String(key.clone()), json_to_yaml(value));
            }
            Yaml::Hash(hash)
        }
    }
}

/// Errors (a closed pipe in particular) propagate, so `main` can stop quietly on `| head`.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// A table with left-aligned columns separated by three spaces, like kubectl's.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                if i > 0 {
                    line.push_str("   ");
                }
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', width - cell.chars().count()));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `Label:  value` lines with the values aligned, for detail views.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let label = format!("{key}:");
        out.push_str(format!("{label:<width$}  {value}").trim_end());
        out.push('\n');
    }
    out
}

fn datetime(ms: i64) -> Option<DateTime<Utc>> {
    if ms <= 0 {
        return None;
    }
    DateTime::from_timestamp_millis(ms)
}

/// A time for tables: local, to the second, `2024-05-01 14:03:22`; `-` when unset (0).
pub fn time(ms: i64) -> String {
    match datetime(ms) {
        Some(t) => t
            .with_timezone(&Local)
            .format("%Y-%m-%d %H:%M:%S")
            .to_string(),
        None => "-".into(),
    }
}

/// A time for JSON and YAML: RFC 3339 in UTC with milliseconds; absent when unset.
pub fn rfc3339(ms: i64) -> Option<String> {
    datetime(ms).map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// How long something took (or has been going on, when `end` is unset); `-` before it started.
pub fn elapsed(start_ms: i64, end_ms: i64) -> String {
    if start_ms <= 0 {
        return "-".into();
    }
    let end = if end_ms > 0 { end_ms } else { now_ms() };
    ax_core::humane_duration(end - start_ms)
}

/// How long ago, for heartbeats: `3s ago`.
pub fn ago(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    format!("{} ago", ax_core::humane_duration(now_ms() - ms))
}

/// `-` for empty cells, so columns never look shifted.
pub fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".into()
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_trims_trailing_space() {
        let mut table = Table::new(&["ID", "NAME", "STATE"]);
        table.row(vec!["1".into(), "nightly-etl".into(), "SUCCESS".into()]);
        table.row(vec!["12".into(), "x".into(), "".into()]);
        assert_eq!(
            table.render(),
            "ID   NAME          STATE\n1    nightly-etl   SUCCESS\n12   x\n"
        );
    }

    #[test]
    fn durations_are_humane() {
        // ax-core's `humane_duration`, the one formatter of spans.
        let took = |ms: i64| elapsed(1_000, 1_000 + ms);
        assert_eq!(took(850), "850ms");
        assert_eq!(took(4_200), "4.2s");
        assert_eq!(took(45_000), "45s");
        assert_eq!(took(185_000), "3m05s");
        assert_eq!(took(2 * 3_600_000 + 7 * 60_000), "2h07m");
        assert_eq!(took(3 * 86_400_000 + 4 * 3_600_000), "3d04h");
        assert_eq!(took(-5), "0ms");
        assert_eq!(elapsed(0, 1_000), "-");
    }

    #[test]
    fn unset_times_are_dashes_and_absent() {
        assert_eq!(time(0), "-");
        assert_eq!(rfc3339(0), None);
        assert_eq!(
            rfc3339(1_700_000_000_123).as_deref(),
            Some("2023-11-14T22:13:20.123Z")
        );
        assert_eq!(time(1_700_000_000_123).len(), "2023-11-14 22:13:20".len());
    }

    #[test]
    fn yaml_round_trips_json_shapes() {
        let value =
            serde_json::json!({"a": 1, "b": [true, null, "x"], "c": {"d": 1.5}, "e": u64::MAX});
        let text = to_yaml(&value).unwrap();
        let docs = yaml_rust2::YamlLoader::load_from_str(&text).unwrap();
        let doc = &docs[0];
        assert_eq!(doc["a"].as_i64(), Some(1));
        assert_eq!(doc["b"][0].as_bool(), Some(true));
        assert!(doc["b"][1].is_null());
        assert_eq!(doc["b"][2].as_str(), Some("x"));
        assert_eq!(doc["c"]["d"].as_f64(), Some(1.5));
    }

    #[test]
    fn fields_align_values() {
        assert_eq!(
            fields(&[("Name", "x".into()), ("Schedule", "".into())]),
            "Name:      x\nSchedule:\n"
        );
    }
}
