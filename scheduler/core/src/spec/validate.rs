//! From the file as written to the model: every value checked, every default applied, and
//! every refusal worded `file:line: field: why`.
//!
//! The first refusal stops the check: nothing is half-accepted. The rules a user sees are
//! documented in `docs/workflow-format.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU64;

use serde_saphyr::Spanned;

use super::file::{
    self, ConcurrencyFile, DefaultsFile, EnvPairs, EnvValue, Key, List, Map, MisfireName, Pairs,
    ParamFile, ParamPairs, ScheduleFile, TaskFile, Value, WorkflowFile, line,
};
use super::model::{
    ConcurrencySpec, DEFAULT_APP, DEFAULT_MAX_CATCH_UP, DEFAULT_RETRY_BACKOFF_MS, Handler,
    MisfirePolicy, ParamSpec, Retention, Routing, ScheduleSpec, TaskSpec, TriggerKind,
    WorkflowSpec,
};
use super::template::check_key_template;
use super::values::{is_valid_env_name, is_valid_name, parse_instant, parse_retention};
use super::{ParsedWorkflow, SpecError};
use crate::condition;
use crate::cron::CronSchedule;
use crate::dag::{Dag, DagError};
use crate::deadline::{self, Deadline, OnDeadline};
use crate::duration;
use crate::for_each::{self, ForEach};
use crate::outputs;
use crate::trigger_rule::TriggerRule;

/// What a value is, for "expected X, found Y": `raw` is its source text (see
/// [`file::raw_text`]), which decides for a plain number or boolean.
pub fn kind_of(value: &Value, raw: &str) -> &'static str {
    match value {
        Value::List => "a list",
        Value::Mapping => "a mapping",
        Value::Null => "null",
        Value::Text(_) => "a string",
        Value::Typed => {
            if boolean_text(raw).is_some() {
                "a boolean"
            } else if is_integer_text(raw) {
                "an integer"
            } else if raw.parse::<f64>().is_ok() {
                "a number"
            } else {
                "a string"
            }
        }
    }
}

fn boolean_text(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

fn is_integer_text(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Where in the file each task and upstream entry is, to place DAG errors.
struct TaskLines {
    /// `tasks[2]`, `on_failure[0]`: where the task is listed.
    path: String,
    task: usize,
    name: usize,
    upstream: Vec<usize>,
    /// The lines of `command` (or `argv`) and `env`, where output references are written.
    command: usize,
    env: usize,
    /// The lines of `params` and `run_workflow` (the task's line when absent).
    params: usize,
    run_workflow: usize,
    for_each: usize,
    /// Where the `if:` expression starts: line, column, and whether the file holds it as
    /// written (a plain or quoted one-line scalar), so a column inside it maps to the file.
    condition: Option<(usize, usize, bool)>,
}

/// Task settings given once under `defaults`.
#[derive(Default)]
struct Defaults {
    timeout_ms: Option<NonZeroU64>,
    retries: Option<u32>,
    retry_backoff_ms: Option<u64>,
    labels: BTreeMap<String, String>,
    env: Env,
}

/// A task's `env`: plain values, and variables whose values are secrets (by secret name).
#[derive(Debug, Default, Clone)]
struct Env {
    plain: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
}

impl Env {
    /// `other`'s variables over these: a name set in both takes `other`'s, plain or secret.
    fn extend(&mut self, other: Env) {
        for (name, value) in other.plain {
            self.secrets.remove(&name);
            self.plain.insert(name, value);
        }
        for (name, secret) in other.secrets {
            self.plain.remove(&name);
            self.secrets.insert(name, secret);
        }
    }
}

pub struct Validator<'a> {
    pub source: &'a str,
    pub source_name: &'a str,
}

impl Validator<'_> {
    pub fn err(
        &self,
        line: usize,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> SpecError {
        SpecError {
            source_name: self.source_name.to_string(),
            line,
            column: None,
            field: field.into(),
            message: message.into(),
        }
    }

    fn kind<T>(&self, node: &Spanned<T>, value: &Value) -> &'static str {
        kind_of(value, file::raw_text(self.source, node))
    }

    fn type_err<T>(
        &self,
        node: &Spanned<T>,
        value: &Value,
        field: &str,
        expected: &str,
    ) -> SpecError {
        self.err(
            line(node),
            field,
            format!("expected {expected}, found {}", self.kind(node, value)),
        )
    }

    /// A required field that is absent or null: at its key's line when the key is there.
    fn missing<T>(&self, map: &Spanned<Map<T>>, path: &str, name: &str) -> SpecError {
        let line = map.value.key_line(name).unwrap_or(line(map));
        self.err(line, join(path, name), "missing required field")
    }

    fn string(&self, node: &Spanned<Value>, field: &str) -> Result<String, SpecError> {
        self.text(node, &node.value, field)
    }

    /// The text of `value`, a scalar standing at `node` (a plain number or boolean as the user
    /// typed it), or the refusal for a collection or a null.
    fn text<T>(&self, node: &Spanned<T>, value: &Value, field: &str) -> Result<String, SpecError> {
        match value {
            Value::Text(text) => Ok(text.clone()),
            Value::Typed => Ok(file::raw_text(self.source, node).to_string()),
            other => Err(self.type_err(node, other, field, "a string")),
        }
    }

    fn non_empty_string(&self, node: &Spanned<Value>, field: &str) -> Result<String, SpecError> {
        let text = self.string(node, field)?;
        if text.trim().is_empty() {
            return Err(self.err(line(node), field, "must not be empty"));
        }
        Ok(text)
    }

    fn name(&self, node: &Spanned<Value>, field: &str) -> Result<String, SpecError> {
        let name = self.string(node, field)?;
        self.valid_name(name, line(node), field)
    }

    fn valid_name(&self, name: String, line: usize, field: &str) -> Result<String, SpecError> {
        if !is_valid_name(&name) {
            return Err(self.err(
                line,
                field,
                format!(
                    "invalid name \"{name}\": expected 1 to 64 of a-z, 0-9, '_', '.', '-', \
                     starting with a letter or digit"
                ),
            ));
        }
        Ok(name)
    }

    fn boolean(&self, node: &Spanned<Value>, field: &str) -> Result<bool, SpecError> {
        let raw = file::raw_text(self.source, node);
        match (&node.value, boolean_text(raw)) {
            (Value::Typed, Some(value)) => Ok(value),
            (other, _) => Err(self.type_err(node, other, field, "true or false")),
        }
    }

    fn integer(
        &self,
        node: &Spanned<Value>,
        field: &str,
        min: i64,
        max: i64,
    ) -> Result<i64, SpecError> {
        let text = file::raw_text(self.source, node);
        if !(node.value == Value::Typed && is_integer_text(text)) {
            return Err(self.type_err(node, &node.value, field, "an integer"));
        }
        let out_of_range = || {
            self.err(
                line(node),
                field,
                format!("must be between {min} and {max}, found {text}"),
            )
        };
        let value: i64 = text.parse().map_err(|_| out_of_range())?;
        if value < min || value > max {
            return Err(out_of_range());
        }
        Ok(value)
    }

    fn count(&self, node: &Spanned<Value>, field: &str, min: u32) -> Result<u32, SpecError> {
        Ok(self.integer(node, field, min.into(), u32::MAX.into())? as u32)
    }

    fn duration(&self, node: &Spanned<Value>, field: &str) -> Result<u64, SpecError> {
        match &node.value {
            Value::Text(_) | Value::Typed => duration::parse_ms(&self.string(node, field)?)
                .map_err(|err| self.err(line(node), field, err.to_string())),
            other => Err(self.type_err(node, other, field, "a duration")),
        }
    }

    /// A name from a closed set; `what` names the set in the refusal (`misfire policy`).
    fn choice<C: Copy + serde::de::DeserializeOwned>(
        &self,
        node: &Spanned<file::Choice<C>>,
        field: &str,
        what: &str,
    ) -> Result<C, SpecError> {
        let text = match &node.value {
            file::Choice::Known(known) => return Ok(*known),
            file::Choice::Unknown(text) => text.clone(),
            file::Choice::Other(other) => self.text(node, other, field)?,
        };
        if text.trim().is_empty() {
            return Err(self.err(line(node), field, "must not be empty"));
        }
        let names = file::names::<C>();
        let expected = match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        Err(self.err(
            line(node),
            field,
            format!("unknown {what} \"{text}\": expected {expected}"),
        ))
    }

    /// The fields of a mapping, or the refusal for what stood in its place.
    fn fields<'m, T>(
        &self,
        map: &'m Spanned<Map<T>>,
        field: &str,
    ) -> Result<(&'m T, &'m [Key]), SpecError> {
        match &map.value {
            Map::Fields { fields, keys } => Ok((fields, keys)),
            Map::Other(other) => {
                let field = if field.is_empty() { "(root)" } else { field };
                Err(self.type_err(map, other, field, "a mapping"))
            }
        }
    }

    /// A mapping of strings to strings (env, labels), each key checked by `check_key`.
    fn string_map(
        &self,
        map: &Spanned<Map<Pairs>>,
        path: &str,
        check_key: &dyn Fn(&str) -> Option<String>,
    ) -> Result<BTreeMap<String, String>, SpecError> {
        let (Pairs(values), keys) = self.fields(map, path)?;
        let mut out = BTreeMap::new();
        for (key, value) in keys.iter().zip(values) {
            let field = join(path, &key.name);
            if let Some(message) = check_key(&key.name) {
                return Err(self.err(key.line, field, message));
            }
            out.insert(key.name.clone(), self.string(value, &field)?);
        }
        Ok(out)
    }

    fn env(&self, map: &Spanned<Map<EnvPairs>>, path: &str) -> Result<Env, SpecError> {
        let (EnvPairs(values), keys) = self.fields(map, path)?;
        let mut env = Env::default();
        for (key, value) in keys.iter().zip(values) {
            let field = join(path, &key.name);
            if !is_valid_env_name(&key.name) {
                return Err(self.err(
                    key.line,
                    field,
                    format!(
                        "invalid environment variable name \"{}\": expected [A-Za-z_][A-Za-z0-9_]*",
                        key.name
                    ),
                ));
            }
            match &value.value {
                EnvValue::Value(plain) => {
                    let text = self.text(value, plain, &field)?;
                    env.plain.insert(key.name.clone(), text);
                }
                EnvValue::Secret(name) => {
                    let secret = self.name(name, &join(&field, "secret"))?;
                    env.secrets.insert(key.name.clone(), secret);
                }
                EnvValue::OtherMapping(keys) => {
                    return Err(self.err(
                        line(value),
                        field,
                        format!(
                            "expected a string or {{ secret: NAME }}, found a mapping with {}",
                            if keys.is_empty() {
                                "no keys".to_string()
                            } else {
                                format!("keys {}", keys.join(", "))
                            }
                        ),
                    ));
                }
            }
        }
        Ok(env)
    }

    /// A `run_workflow` task's `params`: names as run params take them, values templates whose
    /// `${params.NAME}` are well formed (output references are checked with the others).
    fn sub_workflow_params(
        &self,
        map: &Spanned<Map<Pairs>>,
        path: &str,
    ) -> Result<BTreeMap<String, String>, SpecError> {
        let params = self.string_map(map, path, &|name| {
            (!is_valid_env_name(name)).then(|| {
                format!(
                    "invalid param name \"{name}\": expected [A-Za-z_][A-Za-z0-9_]*, as the \
                     child's tasks get it as AX_PARAM_<NAME>"
                )
            })
        })?;
        let (_, keys) = self.fields(map, path)?;
        for key in keys {
            let value = params.get(&key.name).map_or("", String::as_str);
            if let Err(problem) = crate::sub_workflow::param_references(value) {
                return Err(self.err(key.line, join(path, &key.name), problem));
            }
        }
        Ok(params)
    }

    fn labels(
        &self,
        map: &Spanned<Map<Pairs>>,
        path: &str,
    ) -> Result<BTreeMap<String, String>, SpecError> {
        self.string_map(map, path, &|name| {
            name.trim()
                .is_empty()
                .then(|| "label names must not be empty".to_string())
        })
    }

    /// One name or a list of names (`upstream`, `schedule.after`), each with its field and line.
    fn names(
        &self,
        node: &Spanned<List<Spanned<Value>>>,
        field: &str,
        expected: &str,
    ) -> Result<Vec<(String, String, usize)>, SpecError> {
        match &node.value {
            List::Items(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let item_field = format!("{field}[{i}]");
                    Ok((self.string(item, &item_field)?, item_field, line(item)))
                })
                .collect(),
            List::Other(other @ (Value::Mapping | Value::List)) => {
                Err(self.type_err(node, other, field, expected))
            }
            List::Other(scalar) => Ok(vec![(
                self.text(node, scalar, field)?,
                field.to_string(),
                line(node),
            )]),
        }
    }

    pub fn workflow(&self, root: &Spanned<Map<WorkflowFile>>) -> Result<ParsedWorkflow, SpecError> {
        let (file, _) = self.fields(root, "")?;
        let name = match &file.name {
            Some(node) => self.name(node, "name")?,
            None => return Err(self.missing(root, "", "name")),
        };
        let app = match &file.app {
            Some(node) => self.name(node, "app")?,
            None => DEFAULT_APP.to_string(),
        };
        let owner = file
            .owner
            .as_ref()
            .map(|n| self.string(n, "owner"))
            .transpose()?
            .unwrap_or_default();
        let description = file
            .description
            .as_ref()
            .map(|n| self.string(n, "description"))
            .transpose()?
            .unwrap_or_default();
        let schedule = match &file.schedule {
            Some(node) => self.schedule(node)?,
            None => ScheduleSpec::default(),
        };
        let concurrency = match &file.concurrency {
            Some(node) => self.concurrency(node)?,
            None => ConcurrencySpec::default(),
        };
        let retention = file
            .retention
            .as_ref()
            .map(|node| self.retention(node))
            .transpose()?;
        if let Some(after) = schedule.after.iter().find(|upstream| **upstream == name) {
            let line = file.schedule.as_ref().map_or(0, line);
            return Err(self.err(
                line,
                "schedule.after",
                format!("workflow {after} cannot depend on itself"),
            ));
        }
        let (deadline, on_deadline) = self.deadline(file, &schedule)?;
        let params = match &file.params {
            Some(node) => self.params(node, &schedule)?,
            None => Vec::new(),
        };
        let defaults = match &file.defaults {
            Some(node) => self.defaults(node)?,
            None => Defaults::default(),
        };

        let Some(tasks_node) = &file.tasks else {
            return Err(self.missing(root, "", "tasks"));
        };
        let mut tasks = Vec::new();
        let mut lines = Vec::new();
        self.task_list(tasks_node, "tasks", None, &defaults, &mut tasks, &mut lines)?;
        if tasks.is_empty() {
            return Err(self.err(line(tasks_node), "tasks", "at least one task is required"));
        }
        for (node, handler) in [
            (&file.on_failure, Handler::OnFailure),
            (&file.on_success, Handler::OnSuccess),
        ] {
            if let Some(node) = node {
                self.task_list(
                    node,
                    handler.field(),
                    Some(handler),
                    &defaults,
                    &mut tasks,
                    &mut lines,
                )?;
            }
        }

        let dag = Dag::new(&tasks).map_err(|e| self.dag_error(e, &tasks, &lines))?;
        self.handler_edges(&tasks, &lines)?;
        self.output_references(&dag, &tasks, &lines)?;
        self.conditions(&dag, &tasks, &lines)?;
        self.mapped_outputs(&dag, &tasks, &lines)?;
        if let Some((_, at)) = tasks
            .iter()
            .zip(&lines)
            .find(|(task, _)| task.run_workflow.as_deref() == Some(name.as_str()))
        {
            let cycle = crate::sub_workflow::CallCycle {
                path: vec![name.clone(), name.clone()],
            };
            return Err(self.err(
                at.run_workflow,
                format!("{}.run_workflow", at.path),
                format!("{cycle} (workflow {name} cannot run itself)"),
            ));
        }
        let warnings = dag
            .isolated()
            .into_iter()
            .map(|task| format!("task {task} has no upstream and no downstream"))
            .collect();
        let spec = WorkflowSpec {
            name,
            app,
            owner,
            description,
            schedule,
            concurrency,
            retention,
            tasks,
            deadline,
            on_deadline,
            params,
        };
        Ok(ParsedWorkflow { spec, warnings })
    }

    /// `params:`: the declared params in file order. A required param without a default is
    /// refused on a workflow whose runs start without a trigger's params (a cron schedule or
    /// upstream workflows): each of those runs would lack it.
    fn params(
        &self,
        node: &Spanned<Map<ParamPairs>>,
        schedule: &ScheduleSpec,
    ) -> Result<Vec<ParamSpec>, SpecError> {
        let (ParamPairs(values), keys) = self.fields(node, "params")?;
        if keys.len() > crate::params::MAX_PARAMS {
            return Err(self.err(
                line(node),
                "params",
                format!(
                    "{} params declared (max {})",
                    keys.len(),
                    crate::params::MAX_PARAMS
                ),
            ));
        }
        let mut declared = Vec::with_capacity(keys.len());
        for (key, value) in keys.iter().zip(values) {
            let param = self.param(key, value)?;
            if param.required && schedule.trigger != TriggerKind::Manual {
                let (source, field) = match schedule.trigger {
                    TriggerKind::Dependency => ("upstream workflows", "schedule.after"),
                    _ => ("a cron schedule", "schedule.cron"),
                };
                return Err(self.err(
                    key.line,
                    format!("params.{}", key.name),
                    format!(
                        "param \"{}\" is required without a default, but this workflow's runs \
                         also start from {source} ({field}), which pass no params: give it a \
                         default",
                        key.name
                    ),
                ));
            }
            declared.push(param);
        }
        Ok(declared)
    }

    /// One declared param, `params.NAME`.
    fn param(&self, key: &Key, node: &Spanned<Map<ParamFile>>) -> Result<ParamSpec, SpecError> {
        use crate::params::{MAX_NAME_BYTES, MAX_VALUE_BYTES};
        let path = format!("params.{}", key.name);
        if key.name.len() > MAX_NAME_BYTES || !is_valid_env_name(&key.name) {
            return Err(self.err(
                key.line,
                path,
                format!(
                    "invalid param name \"{}\": expected [A-Za-z_][A-Za-z0-9_]* of at most \
                     {MAX_NAME_BYTES} bytes, as tasks get it as AX_PARAM_<NAME>",
                    key.name
                ),
            ));
        }
        let mut param = ParamSpec {
            name: key.name.clone(),
            ..ParamSpec::default()
        };
        if let Map::Other(Value::Null) = &node.value {
            return Ok(param);
        }
        let (file, _) = self.fields(node, &path)?;
        let value = |node: &Spanned<Value>, field: &str| -> Result<String, SpecError> {
            let text = self.string(node, field)?;
            if text.len() > MAX_VALUE_BYTES {
                return Err(self.err(
                    line(node),
                    field,
                    format!("{} bytes (max {MAX_VALUE_BYTES})", text.len()),
                ));
            }
            if text.contains('\0') {
                return Err(self.err(line(node), field, "contains a NUL byte"));
            }
            Ok(text)
        };
        if let Some(node) = &file.description {
            param.description = self.string(node, &join(&path, "description"))?;
        }
        if let Some(node) = &file.default {
            param.default = Some(value(node, &join(&path, "default"))?);
        }
        if let Some(node) = &file.required {
            param.required = self.boolean(node, &join(&path, "required"))?;
            if param.required && param.default.is_some() {
                return Err(self.err(
                    line(node),
                    join(&path, "required"),
                    "a param with a default is never missing: drop required or the default",
                ));
            }
        }
        if let Some(node) = &file.choices {
            let field = join(&path, "choices");
            let items = match &node.value {
                List::Items(items) => items,
                List::Other(other) => {
                    return Err(self.type_err(node, other, &field, "a list of values"));
                }
            };
            if items.is_empty() {
                return Err(self.err(line(node), field, "must list at least one value"));
            }
            for (i, item) in items.iter().enumerate() {
                let item_field = format!("{field}[{i}]");
                let choice = value(item, &item_field)?;
                if param.choices.contains(&choice) {
                    return Err(self.err(
                        line(item),
                        item_field,
                        format!("duplicate choice \"{choice}\""),
                    ));
                }
                param.choices.push(choice);
            }
            if let Some(default) = &param.default
                && !param.choices.contains(default)
            {
                let at = file.default.as_ref().map_or(line(node), line);
                return Err(self.err(
                    at,
                    join(&path, "default"),
                    format!(
                        "\"{default}\" is not one of the choices ({})",
                        param.choices.join(", ")
                    ),
                ));
            }
        }
        Ok(param)
    }

    /// The tasks of `tasks`, `on_failure` or `on_success`, appended to `tasks` (marked with
    /// their handler list) with their lines.
    fn task_list(
        &self,
        node: &Spanned<List<Spanned<Map<TaskFile>>>>,
        field: &str,
        handler: Option<Handler>,
        defaults: &Defaults,
        tasks: &mut Vec<TaskSpec>,
        lines: &mut Vec<TaskLines>,
    ) -> Result<(), SpecError> {
        let items = match &node.value {
            List::Items(items) => items,
            List::Other(other) => {
                return Err(self.type_err(node, other, field, "a list of tasks"));
            }
        };
        for (i, item) in items.iter().enumerate() {
            let (mut task, task_lines) = self.task(item, &format!("{field}[{i}]"), defaults)?;
            task.handler = handler;
            tasks.push(task);
            lines.push(task_lines);
        }
        Ok(())
    }

    /// A handler's upstreams are tasks of its own list, and no task of the graph waits for a
    /// handler: the lists run after the graph, on their own.
    fn handler_edges(&self, tasks: &[TaskSpec], lines: &[TaskLines]) -> Result<(), SpecError> {
        let list_of: BTreeMap<&str, Option<Handler>> = tasks
            .iter()
            .map(|task| (task.name.as_str(), task.handler))
            .collect();
        for (task, at) in tasks.iter().zip(lines) {
            for (j, up) in task.upstream.iter().enumerate() {
                let theirs = list_of.get(up.as_str()).copied().flatten();
                if theirs == task.handler {
                    continue;
                }
                let list = |h: Option<Handler>| h.map_or("tasks", Handler::field);
                return Err(self.err(
                    at.upstream.get(j).copied().unwrap_or(at.task),
                    format!("{}.upstream[{j}]", at.path),
                    format!(
                        "task \"{up}\" is in {}, not in {}: upstreams are tasks of the same list",
                        list(theirs),
                        list(task.handler)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every `${tasks.T.outputs.K}` in a task's command, argv or env names a task above it (of
    /// its own list; a handler may also name the graph's tasks, which ended before it starts).
    fn output_references(
        &self,
        dag: &Dag,
        tasks: &[TaskSpec],
        lines: &[TaskLines],
    ) -> Result<(), SpecError> {
        for (task, at) in tasks.iter().zip(lines) {
            let mut places: Vec<(String, usize, &str)> = Vec::new();
            if task.argv.is_empty() {
                places.push((format!("{}.command", at.path), at.command, &task.command));
            } else {
                for (j, word) in task.argv.iter().enumerate() {
                    places.push((format!("{}.argv[{j}]", at.path), at.command, word));
                }
            }
            for (name, value) in &task.env {
                places.push((format!("{}.env.{name}", at.path), at.env, value));
            }
            for (name, value) in &task.params {
                places.push((format!("{}.params.{name}", at.path), at.params, value));
            }
            for (field, line, text) in places {
                let references = outputs::references(text)
                    .map_err(|problem| self.err(line, field.clone(), problem))?;
                for reference in references {
                    let above = dag.contains(&reference.task)
                        && (dag
                            .downstream_closure(&reference.task)
                            .contains(&task.name.as_str())
                            || (task.handler.is_some() && dag.handler(&reference.task).is_none()));
                    if above {
                        continue;
                    }
                    let why = if dag.contains(&reference.task) {
                        format!(
                            "{reference}: task {} is not upstream of {}, so its outputs may not \
                             exist when {} runs",
                            reference.task, task.name, task.name
                        )
                    } else {
                        format!("{reference}: unknown task \"{}\"", reference.task)
                    };
                    return Err(self.err(line, field, why));
                }
            }
        }
        Ok(())
    }

    /// `for_each:` as a list of scalars, `${NAME}` or `${tasks.T.outputs.K}`.
    fn for_each(
        &self,
        node: &Spanned<List<Spanned<Value>>>,
        field: &str,
        max_items: Option<u32>,
    ) -> Result<ForEach, SpecError> {
        const EXPECTED: &str = "a list, a param as ${NAME} or an output as ${tasks.T.outputs.K}";
        match &node.value {
            List::Items(items) => {
                let items = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| self.string(item, &format!("{field}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                let max = max_items.unwrap_or(for_each::DEFAULT_MAX_ITEMS);
                for_each::written(&items, max)
                    .map_err(|why| self.err(line(node), field, format!("the list {why}")))?;
                Ok(ForEach::Items(items))
            }
            List::Other(other @ (Value::Mapping | Value::List)) => {
                Err(self.type_err(node, other, field, EXPECTED))
            }
            List::Other(scalar) => {
                let text = self.text(node, scalar, field)?;
                ForEach::parse_reference(&text).map_err(|why| self.err(line(node), field, why))
            }
        }
    }

    /// A `for_each` output names a task above its task; no output of a mapped task is named
    /// (its items' outputs are not passed on).
    fn mapped_outputs(
        &self,
        dag: &Dag,
        tasks: &[TaskSpec],
        lines: &[TaskLines],
    ) -> Result<(), SpecError> {
        let mapped: BTreeSet<&str> = tasks
            .iter()
            .filter(|t| t.for_each.is_some())
            .map(|t| t.name.as_str())
            .collect();
        for (task, at) in tasks.iter().zip(lines) {
            if let Some(ForEach::Output { task: from, key }) = &task.for_each {
                let field = format!("{}.for_each", at.path);
                let reference = format!("${{tasks.{from}.outputs.{key}}}");
                if !dag.contains(from) {
                    return Err(self.err(
                        at.for_each,
                        field,
                        format!("{reference}: unknown task \"{from}\""),
                    ));
                }
                let above = dag.downstream_closure(from).contains(&task.name.as_str());
                if !above {
                    return Err(self.err(
                        at.for_each,
                        field,
                        format!(
                            "{reference}: task {from} is not upstream of {}, so its outputs \
                             may not exist when {} runs",
                            task.name, task.name
                        ),
                    ));
                }
            }
            let reads_outputs_of = |from: &str| {
                task.output_refs().iter().any(|r| r.task == from)
                    || matches!(&task.for_each, Some(ForEach::Output { task, .. }) if task == from)
                    || task
                        .condition
                        .as_deref()
                        .is_some_and(|c| c.contains(&format!("tasks.{from}.outputs")))
            };
            if let Some(from) = mapped.iter().find(|from| reads_outputs_of(from)) {
                return Err(self.err(
                    at.task,
                    at.path.clone(),
                    format!(
                        "task {from} is mapped (for_each): its items' outputs are not passed \
                         on; read them in a task of its own that the items write to"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every `if:` parses and type-checks over what its task may read: its direct upstreams'
    /// states, the outputs of the tasks above it (for a handler, also the graph's tasks).
    fn conditions(
        &self,
        dag: &Dag,
        tasks: &[TaskSpec],
        lines: &[TaskLines],
    ) -> Result<(), SpecError> {
        for (task, at) in tasks.iter().zip(lines) {
            let (Some(source), Some((line, column, as_written))) = (&task.condition, at.condition)
            else {
                continue;
            };
            let field = format!("{}.if", at.path);
            if task.trigger_rule.starts_with_run() && !condition::tasks_read(source).is_empty() {
                return Err(self.err(
                    line,
                    field,
                    "trigger_rule always starts this task with the run, before its upstreams \
                     end: its if: may read params only",
                ));
            }
            let upstream: BTreeSet<String> = task.upstream.iter().cloned().collect();
            let mut above: BTreeSet<String> = BTreeSet::new();
            let mut next: Vec<&str> = task.upstream.iter().map(String::as_str).collect();
            while let Some(up) = next.pop() {
                if above.insert(up.to_string()) {
                    next.extend(dag.upstream(up).iter().map(String::as_str));
                }
            }
            if task.handler.is_some() {
                above.extend(
                    tasks
                        .iter()
                        .filter(|t| t.handler.is_none())
                        .map(|t| t.name.clone()),
                );
            }
            let scope = condition::Scope {
                upstream: &upstream,
                outputs_of: &above,
            };
            if let Err(refusal) = condition::check(source, &scope) {
                let mut err = self.err(line, field, refusal.message);
                // A column inside the expression maps to the file only when the file holds it
                // as written; otherwise the message says where in the expression.
                if as_written {
                    let before = source.get(..refusal.offset).unwrap_or(source);
                    err.column = Some(column + before.chars().count());
                } else {
                    let at = source
                        .get(..refusal.offset)
                        .unwrap_or(source)
                        .chars()
                        .count()
                        + 1;
                    err.message = format!("at character {at} of the expression: {}", err.message);
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// `retention: 90d` or `retention: forever` ([`parse_retention`]).
    fn retention(&self, node: &Spanned<Value>) -> Result<Retention, SpecError> {
        const FIELD: &str = "retention";
        let text = match &node.value {
            Value::Text(_) | Value::Typed => self.string(node, FIELD)?,
            other => return Err(self.type_err(node, other, FIELD, "a duration or forever")),
        };
        parse_retention(&text).map_err(|message| self.err(line(node), FIELD, message))
    }

    /// `deadline: 06:30`, `+1d 06:30` or `2h` ([`deadline::parse`]), and `on_deadline`. A
    /// same-day wall-clock deadline that a cron slot reaches on its own date could never be
    /// met: refused, naming the slot.
    fn deadline(
        &self,
        file: &WorkflowFile,
        schedule: &ScheduleSpec,
    ) -> Result<(Option<Deadline>, OnDeadline), SpecError> {
        const FIELD: &str = "deadline";
        let on_deadline = match &file.on_deadline {
            Some(node) => {
                let action = self.choice(node, "on_deadline", "deadline action")?;
                if file.deadline.is_none() {
                    return Err(self.err(
                        line(node),
                        "on_deadline",
                        "only meaningful with deadline",
                    ));
                }
                action
            }
            None => OnDeadline::default(),
        };
        let Some(node) = &file.deadline else {
            return Ok((None, on_deadline));
        };
        let text = match &node.value {
            Value::Text(_) | Value::Typed => self.string(node, FIELD)?,
            other => {
                return Err(self.type_err(node, other, FIELD, "a time of day or a duration"));
            }
        };
        let parsed =
            deadline::parse(&text).map_err(|message| self.err(line(node), FIELD, message))?;
        if let Some(cron) = schedule.cron.as_deref()
            && let Ok(cron) = CronSchedule::parse(cron)
        {
            let tz: chrono_tz::Tz = schedule.timezone.parse().unwrap_or(chrono_tz::UTC);
            if let Some(slot) = deadline::first_slot_not_before(&parsed, &cron, tz) {
                return Err(self.err(
                    line(node),
                    FIELD,
                    format!(
                        "{parsed} is not after the logical time of every run: the slot at {} \
                         (schedule.cron \"{cron}\") is at or after {parsed} on its own date; a \
                         deadline on the next day is written \"+1d {parsed}\"",
                        crate::why::format_time(slot, tz),
                    ),
                ));
            }
        }
        Ok((Some(parsed), on_deadline))
    }

    fn schedule(&self, node: &Spanned<Map<ScheduleFile>>) -> Result<ScheduleSpec, SpecError> {
        let (file, _) = self.fields(node, "schedule")?;
        let mut schedule = ScheduleSpec::default();
        if let Some(node) = &file.timezone {
            let timezone = self.non_empty_string(node, "schedule.timezone")?;
            if timezone.parse::<chrono_tz::Tz>().is_err() {
                return Err(self.err(
                    line(node),
                    "schedule.timezone",
                    format!(
                        "unknown time zone \"{timezone}\": expected an IANA name such as UTC or \
                         Asia/Shanghai"
                    ),
                ));
            }
            schedule.timezone = timezone;
        }
        if let Some(node) = &file.cron {
            let cron = self.non_empty_string(node, "schedule.cron")?;
            if let Err(reason) = CronSchedule::parse(&cron) {
                return Err(self.err(
                    line(node),
                    "schedule.cron",
                    format!("invalid cron expression \"{cron}\": {reason}"),
                ));
            }
            schedule.cron = Some(cron);
            schedule.trigger = TriggerKind::Cron;
        }
        if let Some(node) = &file.after {
            let names = self.names(
                node,
                "schedule.after",
                "a workflow name or a list of workflow names",
            )?;
            if names.is_empty() {
                return Err(self.err(line(node), "schedule.after", "must not be empty"));
            }
            for (i, (text, _, at)) in names.into_iter().enumerate() {
                let field = format!("schedule.after[{i}]");
                let name = self.valid_name(text, at, &field)?;
                if schedule.after.contains(&name) {
                    return Err(self.err(at, field, format!("workflow {name} is listed twice")));
                }
                schedule.after.push(name);
            }
            if schedule.cron.is_some() {
                return Err(self.err(
                    line(node),
                    "schedule.after",
                    "cron and after exclude each other: a workflow is started by its clock or \
                     by its upstream workflows",
                ));
            }
            schedule.trigger = TriggerKind::Dependency;
        }
        if let Some(node) = &file.misfire {
            schedule.misfire =
                match self.choice::<MisfireName>(node, "schedule.misfire", "misfire policy")? {
                    MisfireName::Skip => MisfirePolicy::Skip,
                    MisfireName::FireOnce => MisfirePolicy::FireOnce,
                    MisfireName::CatchUp => MisfirePolicy::CatchUp {
                        max: DEFAULT_MAX_CATCH_UP,
                    },
                };
        }
        if let Some(node) = &file.max_catch_up {
            let max = self.integer(node, "schedule.max_catch_up", 1, 10_000)? as u32;
            match &mut schedule.misfire {
                MisfirePolicy::CatchUp { max: slot } => *slot = max,
                _ => {
                    return Err(self.err(
                        line(node),
                        "schedule.max_catch_up",
                        "only meaningful with misfire: catch_up",
                    ));
                }
            }
        }
        if let Some(node) = &file.overlap {
            schedule.overlap = self.choice(node, "schedule.overlap", "overlap policy")?;
        }
        if let Some(node) = &file.max_active_runs {
            schedule.max_active_runs = self.count(node, "schedule.max_active_runs", 0)?;
        }
        let tz: chrono_tz::Tz = schedule.timezone.parse().unwrap_or(chrono_tz::UTC);
        if let Some(node) = &file.start {
            schedule.start_at = Some(self.instant(node, "schedule.start", tz)?);
        }
        if let Some(node) = &file.end {
            schedule.end_at = Some(self.instant(node, "schedule.end", tz)?);
        }
        if let (Some(start), Some(end), Some(node)) =
            (schedule.start_at, schedule.end_at, &file.end)
            && end < start
        {
            return Err(self.err(line(node), "schedule.end", "is before schedule.start"));
        }
        Ok(schedule)
    }

    /// A date (`2026-01-01`, midnight) or a date-time (`2026-01-01T08:30[:00]`, or with an
    /// offset or `Z`), read in `tz` unless it carries its own offset.
    fn instant(
        &self,
        node: &Spanned<Value>,
        field: &str,
        tz: chrono_tz::Tz,
    ) -> Result<crate::Millis, SpecError> {
        let text = self.non_empty_string(node, field)?;
        parse_instant(&text, tz).ok_or_else(|| {
            self.err(
                line(node),
                field,
                format!(
                    "invalid date \"{text}\": expected 2026-01-31, 2026-01-31T08:30:00 or \
                     2026-01-31T08:30:00+08:00"
                ),
            )
        })
    }

    fn concurrency(
        &self,
        node: &Spanned<Map<ConcurrencyFile>>,
    ) -> Result<ConcurrencySpec, SpecError> {
        let (file, _) = self.fields(node, "concurrency")?;
        let mut spec = ConcurrencySpec::default();
        if let Some(node) = &file.max_running_tasks {
            spec.max_running_tasks = self.count(node, "concurrency.max_running_tasks", 0)?;
        }
        if let Some(node) = &file.key {
            let key = self.non_empty_string(node, "concurrency.key")?;
            check_key_template(&key)
                .map_err(|message| self.err(line(node), "concurrency.key", message))?;
            spec.key = Some(key);
            spec.max_runs_per_key = 1;
        }
        if let Some(node) = &file.max_runs_per_key {
            if spec.key.is_none() {
                return Err(self.err(
                    line(node),
                    "concurrency.max_runs_per_key",
                    "only meaningful with concurrency.key",
                ));
            }
            spec.max_runs_per_key = self.count(node, "concurrency.max_runs_per_key", 1)?;
        }
        Ok(spec)
    }

    fn defaults(&self, node: &Spanned<Map<DefaultsFile>>) -> Result<Defaults, SpecError> {
        let (file, _) = self.fields(node, "defaults")?;
        let mut defaults = Defaults::default();
        if let Some(node) = &file.timeout {
            defaults.timeout_ms = NonZeroU64::new(self.duration(node, "defaults.timeout")?);
        }
        if let Some(node) = &file.retries {
            defaults.retries = Some(self.count(node, "defaults.retries", 0)?);
        }
        if let Some(node) = &file.retry_backoff {
            defaults.retry_backoff_ms = Some(self.duration(node, "defaults.retry_backoff")?);
        }
        if let Some(node) = &file.labels {
            defaults.labels = self.labels(node, "defaults.labels")?;
        }
        if let Some(node) = &file.env {
            defaults.env = self.env(node, "defaults.env")?;
        }
        Ok(defaults)
    }

    fn task(
        &self,
        node: &Spanned<Map<TaskFile>>,
        path: &str,
        defaults: &Defaults,
    ) -> Result<(TaskSpec, TaskLines), SpecError> {
        let (file, _) = self.fields(node, path)?;
        let field = |name: &str| join(path, name);

        let Some(name_node) = &file.name else {
            return Err(self.missing(node, path, "name"));
        };
        let name = self.name(name_node, &field("name"))?;

        let command = file
            .command
            .as_ref()
            .map(|n| self.non_empty_string(n, &field("command")))
            .transpose()?;
        let argv = match &file.argv {
            Some(argv_node) => {
                let items = match &argv_node.value {
                    List::Items(items) => items,
                    List::Other(other) => {
                        return Err(self.type_err(
                            argv_node,
                            other,
                            &field("argv"),
                            "a list of strings",
                        ));
                    }
                };
                if items.is_empty() {
                    return Err(self.err(line(argv_node), field("argv"), "must not be empty"));
                }
                let argv = items
                    .iter()
                    .enumerate()
                    .map(|(j, item)| self.string(item, &format!("{path}.argv[{j}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                Some((line(argv_node), argv))
            }
            None => None,
        };
        let run_workflow = file
            .run_workflow
            .as_ref()
            .map(|n| self.name(n, &field("run_workflow")))
            .transpose()?;
        if let (Some(n), true) = (&file.run_workflow, command.is_some() || argv.is_some()) {
            let other = if command.is_some() { "command" } else { "argv" };
            return Err(self.err(
                line(n),
                field("run_workflow"),
                format!(
                    "{other} and run_workflow exclude each other: a task either runs a command \
                     or starts a run of another workflow; give one of them"
                ),
            ));
        }
        let params = match (&file.params, &run_workflow) {
            (Some(n), Some(_)) => self.sub_workflow_params(n, &field("params"))?,
            (Some(n), None) => {
                return Err(self.err(
                    line(n),
                    field("params"),
                    "only meaningful with run_workflow",
                ));
            }
            (None, _) => BTreeMap::new(),
        };
        if let (Some(n), Some(_)) = (&file.for_each, &run_workflow) {
            return Err(self.err(
                line(n),
                field("for_each"),
                "for_each and run_workflow exclude each other: mapping a sub-workflow over a \
                 list is not supported",
            ));
        }
        let (command, argv) = match (command, argv) {
            (Some(_), Some((line, _))) => {
                return Err(self.err(
                    line,
                    field("argv"),
                    "command and argv exclude each other; give one of them",
                ));
            }
            (None, None) if run_workflow.is_some() => (String::new(), Vec::new()),
            (None, None) => {
                return Err(self.err(
                    line(node),
                    path,
                    "one of command, argv or run_workflow is required",
                ));
            }
            (Some(command), None) => (command, Vec::new()),
            (None, Some((_, argv))) => (String::new(), argv),
        };

        // `timeout: 0` is no timeout, as no `timeout` is.
        let timeout_ms = match &file.timeout {
            Some(n) => NonZeroU64::new(self.duration(n, &field("timeout"))?),
            None => defaults.timeout_ms,
        };
        let retries = match &file.retries {
            Some(n) => self.count(n, &field("retries"), 0)?,
            None => defaults.retries.unwrap_or(0),
        };
        let retry_backoff_ms = match &file.retry_backoff {
            Some(n) => self.duration(n, &field("retry_backoff"))?,
            None => defaults
                .retry_backoff_ms
                .unwrap_or(DEFAULT_RETRY_BACKOFF_MS),
        };
        let mut env = defaults.env.clone();
        if let Some(n) = &file.env {
            env.extend(self.env(n, &field("env"))?);
        }
        let Env {
            plain: env,
            secrets: secret_env,
        } = env;
        let mut labels = defaults.labels.clone();
        if let Some(n) = &file.labels {
            labels.extend(self.labels(n, &field("labels"))?);
        }
        let working_dir = file
            .working_dir
            .as_ref()
            .map(|n| self.non_empty_string(n, &field("working_dir")))
            .transpose()?;
        let priority = match &file.priority {
            Some(n) => {
                self.integer(n, &field("priority"), i32::MIN.into(), i32::MAX.into())? as i32
            }
            None => 0,
        };

        let mut upstream = Vec::new();
        let mut upstream_lines = Vec::new();
        if let Some(n) = &file.upstream {
            for (name, _, at) in
                self.names(n, &field("upstream"), "a task name or a list of task names")?
            {
                upstream.push(name);
                upstream_lines.push(at);
            }
        }

        let concurrency = match &file.concurrency {
            Some(n) => self.count(n, &field("concurrency"), 0)?,
            None => 0,
        };
        let pool = file
            .pool
            .as_ref()
            .map(|n| self.name(n, &field("pool")))
            .transpose()?;
        let routing = match &file.routing {
            Some(n) => self.choice(n, &field("routing"), "routing")?,
            None => Routing::Default,
        };
        let unfenced = match &file.self_fence {
            Some(n) => !self.boolean(n, &field("self_fence"))?,
            None => false,
        };
        let survives_worker_restart = match &file.survive_worker_restart {
            Some(n) => self.boolean(n, &field("survive_worker_restart"))?,
            None => false,
        };
        let trigger_rule = match &file.trigger_rule {
            Some(n) => self.choice(n, &field("trigger_rule"), "trigger rule")?,
            None => TriggerRule::default(),
        };
        let condition = file
            .condition
            .as_ref()
            .map(|n| self.non_empty_string(n, &field("if")))
            .transpose()?;
        let max_items = file
            .max_items
            .as_ref()
            .map(|n| {
                let ceiling = i64::from(for_each::MAX_ITEMS_CEILING);
                self.integer(n, &field("max_items"), 1, ceiling)
                    .map(|n| n as u32)
            })
            .transpose()?;
        let for_each = file
            .for_each
            .as_ref()
            .map(|n| self.for_each(n, &field("for_each"), max_items))
            .transpose()?;
        if let (Some(n), None) = (&file.max_items, &for_each) {
            return Err(self.err(line(n), field("max_items"), "only meaningful with for_each"));
        }
        if let (Some(n), Routing::ShardedBroadcast) = (&file.for_each, routing) {
            return Err(self.err(
                line(n),
                field("for_each"),
                "for_each and routing: sharded_broadcast exclude each other; give one of them",
            ));
        }
        if file.run_workflow.is_some() {
            // What only a worker or its queue acts on would be ignored silently: refused, so a
            // file never says more than ax does.
            let worker_side = [
                ("env", file.env.as_ref().map(line)),
                ("working_dir", file.working_dir.as_ref().map(line)),
                ("labels", file.labels.as_ref().map(line)),
                ("routing", file.routing.as_ref().map(line)),
                ("self_fence", file.self_fence.as_ref().map(line)),
                (
                    "survive_worker_restart",
                    file.survive_worker_restart.as_ref().map(line),
                ),
                ("priority", file.priority.as_ref().map(line)),
                ("concurrency", file.concurrency.as_ref().map(line)),
                ("pool", file.pool.as_ref().map(line)),
            ];
            if let Some((name, Some(at))) = worker_side.into_iter().find(|(_, at)| at.is_some()) {
                return Err(self.err(
                    at,
                    field(name),
                    format!(
                        "has no effect on a run_workflow task: it takes no worker and no slot; \
                         set {name} on the called workflow's tasks (or its concurrency:)"
                    ),
                ));
            }
        }

        let task = TaskSpec {
            name,
            command,
            argv,
            env,
            secret_env,
            working_dir,
            timeout_ms,
            retries,
            retry_backoff_ms,
            labels,
            priority,
            upstream,
            concurrency,
            pool,
            routing,
            unfenced,
            survives_worker_restart,
            trigger_rule,
            handler: None,
            condition,
            for_each,
            max_items,
            run_workflow,
            params,
        };
        let lines = TaskLines {
            command: file
                .command
                .as_ref()
                .map(line)
                .or(file.argv.as_ref().map(line))
                .unwrap_or(line(node)),
            env: file.env.as_ref().map_or(line(node), line),
            params: file.params.as_ref().map_or(line(node), line),
            run_workflow: file.run_workflow.as_ref().map_or(line(node), line),
            for_each: file.for_each.as_ref().map_or(line(node), line),
            condition: file.condition.as_ref().map(|n| {
                let raw = super::file::raw_text(self.source, n);
                let as_written = task.condition.as_deref().is_some_and(|c| {
                    let inner = raw
                        .strip_prefix(['"', '\''])
                        .and_then(|r| r.strip_suffix(['"', '\'']));
                    raw == c || inner == Some(c)
                });
                let quoted = usize::from(raw.starts_with(['"', '\'']));
                let column = n.referenced.column() as usize + quoted;
                (line(n), column, as_written && !raw.contains('\n'))
            }),
            path: path.to_string(),
            task: line(node),
            name: line(name_node),
            upstream: upstream_lines,
        };
        Ok((task, lines))
    }

    fn dag_error(&self, error: DagError, tasks: &[TaskSpec], lines: &[TaskLines]) -> SpecError {
        let upstream_entry = |index: usize, upstream_index: usize, message: String| {
            let line = lines[index]
                .upstream
                .get(upstream_index)
                .copied()
                .unwrap_or(lines[index].task);
            self.err(
                line,
                format!("{}.upstream[{upstream_index}]", lines[index].path),
                message,
            )
        };
        match error {
            DagError::DuplicateTask {
                name,
                index,
                first_index,
            } => self.err(
                lines[index].name,
                format!("{}.name", lines[index].path),
                format!(
                    "duplicate task name \"{name}\" (first defined at line {})",
                    lines[first_index].name
                ),
            ),
            DagError::UnknownUpstream {
                upstream,
                index,
                upstream_index,
                ..
            } => upstream_entry(
                index,
                upstream_index,
                format!("unknown task \"{upstream}\""),
            ),
            DagError::SelfDependency {
                task,
                index,
                upstream_index,
            } => upstream_entry(
                index,
                upstream_index,
                format!("cycle: {task} → {task} (task \"{task}\" cannot depend on itself)"),
            ),
            DagError::DuplicateUpstream {
                upstream,
                index,
                upstream_index,
                first_upstream_index,
                ..
            } => upstream_entry(
                index,
                upstream_index,
                format!(
                    "upstream \"{upstream}\" is listed twice (first as upstream[{first_upstream_index}])"
                ),
            ),
            DagError::Cycle { ref path } => {
                let index = path
                    .first()
                    .and_then(|first| tasks.iter().position(|t| &t.name == first))
                    .unwrap_or(0);
                self.err(
                    lines[index].task,
                    lines[index].path.clone(),
                    error.to_string(),
                )
            }
        }
    }
}
