//! Workflow files: the model and reading it from YAML.
//!
//! A workflow file declares one DAG of tasks and its schedule plan; `docs/workflow-format.md`
//! is its reference. [`parse_workflow`] reads it in two steps: `file.rs` deserializes the YAML
//! with serde into a model of the file as written, keeping the line of every value, and
//! `validate.rs` checks that into the [`WorkflowSpec`] the scheduler keeps. A file that cannot
//! be applied is refused with an error that names the file, the line and the field
//! (`wf.yaml:7: tasks[1].upstream[0]: unknown task "extract"`); nothing is half-accepted: the
//! first error stops the parse.

mod file;
mod model;
mod template;
mod validate;
mod values;

#[cfg(test)]
mod tests;

pub use model::{
    ConcurrencySpec, DEFAULT_APP, DEFAULT_MAX_CATCH_UP, DEFAULT_RETRY_BACKOFF_MS, Handler,
    MisfirePolicy, OverlapPolicy, ParamSpec, Retention, Routing, ScheduleSpec, TaskSpec,
    TriggerKind, WorkflowSpec,
};
pub use template::check_key_template;
pub use values::{
    is_valid_env_name, is_valid_name, parse_instant, parse_range_end, parse_retention,
};

/// A parsed and validated workflow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedWorkflow {
    pub spec: WorkflowSpec,
    /// Things worth telling the user that do not stop the apply (an isolated task, say).
    pub warnings: Vec<String>,
}

/// A workflow file that cannot be applied: where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}:{line}{}: {field}: {message}", column.map(|c| format!(":{c}")).unwrap_or_default())]
pub struct SpecError {
    pub source_name: String,
    /// 1-based line of the offending node (0 when the error is about the file as a whole).
    pub line: usize,
    /// 1-based column, for an error inside a value (an `if:` expression's).
    pub column: Option<usize>,
    /// Path of the field, e.g. `tasks[2].upstream[0]` or `schedule.cron`.
    pub field: String,
    pub message: String,
}

/// Parses and validates one workflow file. `source_name` names the file in errors.
pub fn parse_workflow(source: &str, source_name: &str) -> Result<ParsedWorkflow, SpecError> {
    let validator = validate::Validator {
        source,
        source_name,
    };
    let root = file::read(source)
        .map_err(|refusal| validator.err(refusal.line, refusal.field, refusal.message))?;
    let Some(root) = root else {
        return Err(validator.err(0, "(root)", "the file holds no workflow"));
    };
    validator.workflow(&root)
}
