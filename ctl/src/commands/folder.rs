//! A folder of workflow files as one set, shared by `axctl apply -f DIR` and `axctl diff`: the
//! files found (recursively, `.yaml` and `.yml`, hidden files and folders skipped, in path
//! order), sent together in one `ApplyWorkflows` call, and the answer as lines and views.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ax_proto::v1::{self as pb, ApplyOutcome};
use serde::Serialize;

use crate::client::{Client, Ctx};
use crate::error::CtlError;
use crate::view::apply_outcome;

/// A workflow file read from disk: the path as errors name it, and its text.
pub struct SetFile {
    pub path: String,
    pub source: String,
}

/// The workflow files under `root`, or `root` itself when it is a file, read before any call
/// (a file that cannot be read stops the command before anything is sent).
pub fn read(root: &Path) -> anyhow::Result<Vec<SetFile>> {
    let meta = std::fs::metadata(root)
        .with_context(|| format!("cannot read workflow file or folder {}", root.display()))?;
    let mut paths = Vec::new();
    if meta.is_dir() {
        walk(root, &mut paths)?;
        paths.sort();
        if paths.is_empty() {
            return Err(CtlError::usage(format!(
                "no workflow files (.yaml, .yml) under {}",
                root.display()
            ))
            .into());
        }
    } else {
        paths.push(root.to_path_buf());
    }
    paths
        .into_iter()
        .map(|path| {
            let source = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read workflow file {}", path.display()))?;
            Ok(SetFile {
                path: path.display().to_string(),
                source,
            })
        })
        .collect()
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with('.'))
}

fn is_workflow_file(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|ext| ext.to_str()),
        Some("yaml" | "yml")
    )
}

/// Collects the workflow files under `dir`. A symbolic link to a file counts; one to a folder
/// is not followed (no loops).
fn walk(dir: &Path, into: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read folder {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read folder {}", dir.display()))?;
        let path = entry.path();
        if is_hidden(&path) {
            continue;
        }
        let kind = entry
            .file_type()
            .with_context(|| format!("cannot read {}", path.display()))?;
        if kind.is_dir() {
            walk(&path, into)?;
        } else if is_workflow_file(&path) && std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            into.push(path);
        }
    }
    Ok(())
}

/// The set's call: applies (or with `dry_run` plans) `files`, pruning `prune`'s workflows.
/// Errors keep one line per file (`FILE:LINE: FIELD: WHY`).
pub async fn apply(
    ctx: &Ctx,
    client: &mut Client,
    files: Vec<SetFile>,
    dry_run: bool,
    prune: Option<String>,
) -> anyhow::Result<pb::ApplyWorkflowsResponse> {
    let request = pb::ApplyWorkflowsRequest {
        files: files
            .into_iter()
            .map(|file| pb::WorkflowFile {
                source_name: file.path,
                source: file.source,
            })
            .collect(),
        dry_run,
        actor: ctx.actor.clone(),
        prune: prune.is_some(),
        app: prune.unwrap_or_default(),
    };
    let response = client
        .apply_workflows(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    for file in &response.files {
        for warning in &file.warnings {
            eprintln!(
                "warning: {}: {}",
                crate::output::escape(&file.source_name),
                crate::output::escape(warning)
            );
        }
    }
    for warning in &response.warnings {
        eprintln!("warning: {}", crate::output::escape(warning));
    }
    Ok(response)
}

/// One line per file and per deleted workflow: what was done, or with a dry run what would be.
pub fn outcome_lines(response: &pb::ApplyWorkflowsResponse) -> String {
    let mut text = String::new();
    for file in &response.files {
        let name = &file.name;
        let line = match (response.dry_run, file.outcome()) {
            (false, ApplyOutcome::Created) => {
                format!("workflow {name} created (version {})", file.version)
            }
            (false, ApplyOutcome::Updated) => {
                format!("workflow {name} updated (version {})", file.version)
            }
            (_, ApplyOutcome::Unchanged) => {
                format!("workflow {name} unchanged (version {})", file.version)
            }
            (true, ApplyOutcome::Created) => format!("workflow {name} would be created"),
            (true, ApplyOutcome::Updated) => format!(
                "workflow {name} would be updated (version {} to {})",
                file.version,
                file.version + 1
            ),
            (_, other) => format!("workflow {name}: {}", apply_outcome(other as i32)),
        };
        text.push_str(&line);
        text.push('\n');
    }
    for gone in &response.deleted {
        let verb = if response.dry_run {
            "would be deleted"
        } else {
            "deleted"
        };
        text.push_str(&format!(
            "workflow {} {verb} (app {}, version {}: no file declares it; its runs are kept)\n",
            gone.name, gone.app, gone.version
        ));
    }
    text
}

/// A set's answer for `-o json` and `-o yaml`.
#[derive(Debug, Serialize)]
pub struct SetView {
    pub dry_run: bool,
    pub files: Vec<FileView>,
    pub deleted: Vec<RemovedView>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct FileView {
    pub file: String,
    pub workflow: String,
    pub app: String,
    pub outcome: String,
    pub version: u32,
    pub warnings: Vec<String>,
    /// `axctl diff` only: the unified diff of the stored text against the file's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct RemovedView {
    pub workflow: String,
    pub app: String,
    pub version: u32,
}

impl From<&pb::RemovedWorkflow> for RemovedView {
    fn from(w: &pb::RemovedWorkflow) -> Self {
        RemovedView {
            workflow: w.name.clone(),
            app: w.app.clone(),
            version: w.version,
        }
    }
}

impl SetView {
    /// The view of `response`; `diff` gives the diff of the file at an index, if any.
    pub fn of(
        response: &pb::ApplyWorkflowsResponse,
        diff: impl Fn(usize, &pb::AppliedFile) -> Option<String>,
    ) -> Self {
        SetView {
            dry_run: response.dry_run,
            files: response
                .files
                .iter()
                .enumerate()
                .map(|(i, f)| FileView {
                    file: f.source_name.clone(),
                    workflow: f.name.clone(),
                    app: f.app.clone(),
                    outcome: apply_outcome(f.outcome),
                    version: f.version,
                    warnings: f.warnings.clone(),
                    diff: diff(i, f),
                })
                .collect(),
            deleted: response.deleted.iter().map(RemovedView::from).collect(),
            warnings: response.warnings.clone(),
        }
    }
}
