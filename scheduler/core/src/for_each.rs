//! Dynamic fan-out: a task's `for_each:` maps it over a JSON list, one instance per item.
//!
//! The list is written in the file, or read when the task is judged to run: from a run param
//! (`${regions}`) or from an upstream's output (`${tasks.list.outputs.files}`), holding a JSON
//! array. The task's instance becomes the *parent* of one *item* instance per element, each
//! told `AX_ITEM` (a string element as it is, any other as its JSON text) and `AX_ITEM_INDEX`
//! (from 0). Items run, retry and are limited like any instance; the parent ends as the
//! shards of a sharded task do (`crate::shard::parent_outcome`), and only the parent counts
//! for the tasks below it (fan-in) and for the run's end. An empty list makes the task
//! SKIPPED; a list that is not a JSON array, or longer than the task's `max_items`, fails it
//! before any item starts, naming why.

use serde::{Deserialize, Serialize};

/// Items per task when `max_items` is not given.
pub const DEFAULT_MAX_ITEMS: u32 = 10_000;
/// The largest `max_items` a file may set.
pub const MAX_ITEMS_CEILING: u32 = 100_000;

/// Where a task's list comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForEach {
    /// A list written in the file, as the items' `AX_ITEM` values.
    Items(Vec<String>),
    /// `${NAME}`: the run's param NAME, a JSON array.
    Param(String),
    /// `${tasks.T.outputs.K}`: output K of task T (above this one), a JSON array.
    Output { task: String, key: String },
}

impl ForEach {
    /// Reads `${NAME}` or `${tasks.T.outputs.K}`, the whole of `text`.
    pub fn parse_reference(text: &str) -> Result<ForEach, String> {
        let trimmed = text.trim();
        let refs = crate::outputs::references(trimmed)?;
        if let [only] = refs.as_slice()
            && trimmed == only.to_string()
        {
            return Ok(ForEach::Output {
                task: only.task.clone(),
                key: only.key.clone(),
            });
        }
        if let Some(name) = trimmed
            .strip_prefix("${")
            .and_then(|rest| rest.strip_suffix('}'))
            && crate::spec::is_valid_env_name(name)
        {
            return Ok(ForEach::Param(name.to_string()));
        }
        Err(format!(
            "{text:?}: expected a list, a param as ${{NAME}} or an upstream output as \
             ${{tasks.TASK.outputs.KEY}}, holding a JSON array"
        ))
    }

    /// What the list is, for messages: `param regions`, `output files of task list`.
    pub fn source(&self) -> String {
        match self {
            ForEach::Items(_) => "the list in the file".into(),
            ForEach::Param(name) => format!("param {name}"),
            ForEach::Output { task, key } => format!("output {key} of task {task}"),
        }
    }
}

/// The items of a JSON array, as their `AX_ITEM` values; at most `max`.
pub fn items(json: &str, max: u32) -> Result<Vec<String>, String> {
    let value: serde_json::Value = serde_json::from_str(json.trim())
        .map_err(|err| format!("is not a JSON array ({err}): {}", preview(json)))?;
    let serde_json::Value::Array(elements) = value else {
        return Err(format!("is not a JSON array: {}", preview(json)));
    };
    if elements.len() > max as usize {
        return Err(format!(
            "has {} items, more than the task's max_items {max}",
            elements.len()
        ));
    }
    Ok(elements.iter().map(item_text).collect())
}

/// A list written in the file, checked against `max` as a read one is.
pub fn written(items: &[String], max: u32) -> Result<Vec<String>, String> {
    if items.len() > max as usize {
        return Err(format!(
            "has {} items, more than the task's max_items {max}",
            items.len()
        ));
    }
    Ok(items.to_vec())
}

/// An element as its task reads it: a string as it is, anything else as JSON.
fn item_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn preview(text: &str) -> String {
    let text = text.trim();
    let shown: String = text.chars().take(60).collect();
    if shown.len() < text.len() {
        format!("{shown:?}…")
    } else {
        format!("{shown:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_a_param_or_an_output() {
        let cases: [(&str, Result<ForEach, &str>); 5] = [
            ("${regions}", Ok(ForEach::Param("regions".into()))),
            (
                "${tasks.list.outputs.files}",
                Ok(ForEach::Output {
                    task: "list".into(),
                    key: "files".into(),
                }),
            ),
            (
                " ${tasks.list.outputs.files} ",
                Ok(ForEach::Output {
                    task: "list".into(),
                    key: "files".into(),
                }),
            ),
            ("files: ${tasks.list.outputs.files}", Err("expected a list")),
            ("${1bad}", Err("expected a list")),
        ];
        for (text, expected) in cases {
            match (ForEach::parse_reference(text), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{text}: {got}"),
                (got, want) => panic!("{text}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn items_are_strings_as_they_are_and_anything_else_as_json() {
        assert_eq!(
            items(r#"["a", 2, {"k": "v"}, [1], null, true]"#, 10),
            Ok(vec![
                "a".to_string(),
                "2".into(),
                r#"{"k":"v"}"#.into(),
                "[1]".into(),
                "null".into(),
                "true".into()
            ])
        );
        assert_eq!(items("[]", 10), Ok(Vec::new()));
    }

    #[test]
    fn a_list_that_is_no_array_or_too_long_is_refused_naming_why() {
        let cases = [
            ("a,b,c", "is not a JSON array (expected value"),
            (r#"{"a": 1}"#, "is not a JSON array: \"{\\\"a\\\": 1}\""),
            ("[1, 2, 3]", "has 3 items, more than the task's max_items 2"),
        ];
        for (json, want) in cases {
            let got = items(json, 2).unwrap_err();
            assert!(got.starts_with(want), "{json}: {got}");
        }
        assert!(written(&["a".into(), "b".into(), "c".into()], 2).is_err());
        let long = format!("[{}]", vec!["1"; 100].join(","));
        assert!(items(&long, 100).is_ok());
        let err = items(&"x".repeat(500), 10).unwrap_err();
        assert!(err.ends_with("…"), "a long text is cut: {err}");
    }
}
