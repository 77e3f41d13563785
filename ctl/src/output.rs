//! Rendering for stdout: aligned tables for people, JSON and YAML for programs; and the one
//! escaping of text that callers and tasks control (log lines, names, params, messages, audit
//! details) before it reaches a terminal.
//!
//! A terminal acts on some characters: ESC starts sequences that set the window title, clear
//! the screen or (OSC 52) write the clipboard, a carriage return moves back over what was
//! printed, and bidirectional controls reorder it. So, unless `--raw` is given:
//! - on a terminal, every such character is shown escaped, `\u001b` (JSON's form, so JSON stays
//!   valid), as journalctl and git do;
//! - in a table cell or a detail view's value, everywhere: a line break or carriage return there
//!   would forge a row for a reader or a script;
//! - a log line with `--streams` or `--timestamps`, everywhere: the prefix is the line's structure;
//! - otherwise, written to a pipe or a file, text is the bytes as stored: `axctl logs 12 > out`
//!   is the task's output.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

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

/// `--raw`: text goes out as the server sent it.
static RAW: AtomicBool = AtomicBool::new(false);

/// Sets `--raw` for the process (once, from `main`).
pub fn set_raw(raw: bool) {
    RAW.store(raw, Ordering::Relaxed);
}

pub fn raw() -> bool {
    RAW.load(Ordering::Relaxed)
}

/// `--utc`: every time is shown in UTC, the workflow's own zone (`why`, next fires) included.
static UTC: AtomicBool = AtomicBool::new(false);

/// Sets `--utc` for the process (once, from `main`).
pub fn set_utc(utc: bool) {
    UTC.store(utc, Ordering::Relaxed);
}

pub fn utc() -> bool {
    UTC.load(Ordering::Relaxed)
}

/// Whether text bound for stdout is escaped: stdout is a terminal and `--raw` was not given.
pub fn escapes_stdout() -> bool {
    !raw() && std::io::stdout().is_terminal()
}

/// A character a terminal would act on rather than show: C0 controls but tab and line feed,
/// DEL, C1 controls (U+0080–U+009F: U+009B is a CSI to some terminals), and the line and
/// paragraph separators and bidirectional controls (which reorder what is shown around them).
fn acts_on_terminal(c: char) -> bool {
    matches!(c,
        '\0'..='\x08' | '\x0b'..='\x1f' | '\x7f'..='\u{9f}'
        | '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character a terminal acts on, line feeds included, written as `\uXXXX`:
/// the one escaping of text a caller or a task controls.
pub fn escape(text: &str) -> Cow<'_, str> {
    escape_where(text, |c| c == '\n' || acts_on_terminal(c))
}

/// [`escape`], keeping line feeds: for whole documents (a table, JSON) bound for a terminal.
pub fn escape_keeping_lines(text: &str) -> Cow<'_, str> {
    escape_where(text, acts_on_terminal)
}

fn escape_where(text: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A cell or a detail view's value: escaped unless `--raw` (see the module's rules).
pub fn cell(text: &str) -> Cow<'_, str> {
    if raw() {
        Cow::Borrowed(text)
    } else {
        escape(text)
    }
}

/// Writes `text` to stdout, escaped on a terminal (see the module's rules). Errors (a closed
/// pipe in particular) propagate, so `main` can stop quietly on `| head`.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    if escapes_stdout() {
        write_stdout_as_is(&escape_keeping_lines(text))
    } else {
        write_stdout_as_is(text)
    }
}

/// Writes `text` to stdout as it is: text whose control sequences are axctl's own (the colours
/// of `axctl dag`), its server-given parts escaped already.
pub fn write_stdout_as_is(text: &str) -> anyhow::Result<()> {
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

    /// Adds a row; its cells are escaped (see [`cell`]).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|text| match cell(&text) {
                    Cow::Borrowed(_) => text,
                    Cow::Owned(escaped) => escaped,
                })
                .collect(),
        );
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

/// `Label:  value` lines with the values aligned, for detail views; values escaped (see
/// [`cell`]).
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let value = cell(value);
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

/// A time for tables: local, to the second, with its offset (`2024-05-01 14:03:22 +08:00`); `-`
/// when unset (0).
pub fn time(ms: i64) -> String {
    match datetime(ms) {
        Some(t) if utc() => t.format("%Y-%m-%d %H:%M:%S %:z").to_string(),
        Some(t) => t
            .with_timezone(&Local)
            .format("%Y-%m-%d %H:%M:%S %:z")
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

/// A node's or worker's release as reported; `unknown` when it reported none (a worker need not
/// send one).
pub fn version_or_unknown(version: &str) -> String {
    if version.is_empty() {
        "unknown".into()
    } else {
        version.to_string()
    }
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
        // Local time, and the offset that says which.
        let shown = time(1_700_000_000_123);
        assert_eq!(shown.len(), "2023-11-14 22:13:20 +00:00".len(), "{shown}");
        let (_, offset) = shown.rsplit_once(' ').expect("an offset");
        assert!(
            offset.starts_with(['+', '-']) && offset.len() == 6,
            "{shown}"
        );
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
    fn what_a_terminal_acts_on_is_escaped_and_nothing_else() {
        assert_eq!(
            escape("\x1b]0;title\x07 \x1b[2J\r\nx\ty é 日本"),
            "\\u001b]0;title\\u0007 \\u001b[2J\\u000d\\u000ax\ty é 日本"
        );
        assert_eq!(
            escape("\u{9b}31m \u{7f} \u{202e}abc"),
            "\\u009b31m \\u007f \\u202eabc"
        );
        assert_eq!(escape_keeping_lines("a\n\x1bb\n"), "a\n\\u001bb\n");
        assert!(matches!(escape("plain text, \\ and all"), Cow::Borrowed(_)));
        // An escaped string stays valid JSON.
        let json = format!("\"{}\"", escape("\u{7f}\u{9b}"));
        assert_eq!(
            serde_json::from_str::<String>(&json).unwrap(),
            "\u{7f}\u{9b}"
        );
    }

    #[test]
    fn table_cells_cannot_forge_rows() {
        let mut table = Table::new(&["ID", "BY"]);
        table.row(vec!["1".into(), "me\n2   forged".into()]);
        assert_eq!(table.render(), "ID   BY\n1    me\\u000a2   forged\n");
    }

    #[test]
    fn fields_align_values() {
        assert_eq!(
            fields(&[("Name", "x".into()), ("Schedule", "".into())]),
            "Name:      x\nSchedule:\n"
        );
    }
}
