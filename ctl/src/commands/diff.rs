//! `axctl diff -f FILE|DIR [--prune --app APP]`: what `axctl apply` with the same arguments
//! would change, without changing it. Each workflow is created (its file shown as added),
//! changed (a unified diff of the stored text against the file), unchanged, or, with
//! `--prune`, deleted. The server decides, as the apply would: "changed" means the workflow
//! differs, so a file whose text differs only in comments or layout is unchanged (an apply
//! would store nothing).
//!
//! Exit code: 0 when nothing would change, 12 when something would (`diff(1)` and `terraform
//! plan -detailed-exitcode` tell the same apart); errors keep their codes (4 for a refused
//! file, 5 for an unreachable server, ...).

use std::path::PathBuf;

use ax_proto::v1::{self as pb, ApplyOutcome};

use super::folder;
use crate::client::Ctx;
use crate::error::Exit;
use crate::output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A workflow file (YAML), or a folder of them (as `axctl apply -f` reads it).
    #[arg(
        short = 'f',
        long = "filename",
        visible_alias = "file",
        value_name = "PATH"
    )]
    pub file: PathBuf,

    /// Also show the workflows of --app that no file declares: `apply --prune` deletes them.
    #[arg(long, requires = "app")]
    pub prune: bool,

    /// The app --prune covers.
    #[arg(long, requires = "prune", value_name = "APP")]
    pub app: Option<String>,
}

/// What applying would do to one workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Created,
    Changed,
    Unchanged,
    Deleted,
}

impl Change {
    pub fn of(outcome: ApplyOutcome) -> Change {
        match outcome {
            ApplyOutcome::Created => Change::Created,
            ApplyOutcome::Unchanged => Change::Unchanged,
            // Updated, and anything newer than this build: shown as a change, never hidden.
            _ => Change::Changed,
        }
    }
}

/// How many workflows each change touches; `changes()` is what the exit code tells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub created: usize,
    pub changed: usize,
    pub unchanged: usize,
    pub deleted: usize,
}

impl Summary {
    pub fn changes(&self) -> bool {
        self.created + self.changed + self.deleted > 0
    }

    fn count(&mut self, change: Change) {
        match change {
            Change::Created => self.created += 1,
            Change::Changed => self.changed += 1,
            Change::Unchanged => self.unchanged += 1,
            Change::Deleted => self.deleted += 1,
        }
    }

    fn line(&self) -> String {
        format!(
            "{} to create, {} to change, {} to delete, {} unchanged\n",
            self.created, self.changed, self.deleted, self.unchanged
        )
    }
}

/// A unified diff of `old` against `new` (3 lines of context), under the two headers.
pub fn unified(old: &str, new: &str, old_header: &str, new_header: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(old_header, new_header)
        .to_string()
}

/// The diff of one file's workflow, if it has one: the whole file added for a new workflow,
/// the stored text against the file's for a changed one.
fn file_diff(file: &pb::AppliedFile, source: &str) -> Option<String> {
    match Change::of(file.outcome()) {
        Change::Created => Some(unified("", source, "/dev/null", &file.source_name)),
        Change::Changed => Some(unified(
            &file.stored_source,
            source,
            &format!("workflow/{} (version {}, stored)", file.name, file.version),
            &file.source_name,
        )),
        Change::Unchanged | Change::Deleted => None,
    }
}

/// The text `axctl diff` prints for `response` (to a set of `sources`, in the request's order),
/// and its summary.
pub fn render(response: &pb::ApplyWorkflowsResponse, sources: &[String]) -> (String, Summary) {
    let mut text = String::new();
    let mut summary = Summary::default();
    for (file, source) in response.files.iter().zip(sources) {
        let change = Change::of(file.outcome());
        summary.count(change);
        let name = &file.name;
        match change {
            Change::Created => {
                text.push_str(&format!(
                    "workflow {name}: created from {}\n",
                    file.source_name
                ));
            }
            Change::Changed => text.push_str(&format!(
                "workflow {name}: changed (version {} to {}) by {}\n",
                file.version,
                file.version + 1,
                file.source_name
            )),
            Change::Unchanged if file.stored_source != *source => text.push_str(&format!(
                "workflow {name}: unchanged (version {}; {} differs only in comments or layout, \
                 which an apply does not store)\n",
                file.version, file.source_name
            )),
            Change::Unchanged | Change::Deleted => text.push_str(&format!(
                "workflow {name}: unchanged (version {})\n",
                file.version
            )),
        }
        if let Some(diff) = file_diff(file, source) {
            text.push_str(&diff);
            if !diff.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    for gone in &response.deleted {
        summary.count(Change::Deleted);
        text.push_str(&format!(
            "workflow {}: deleted (app {}, version {}: no file declares it; its runs are kept)\n",
            gone.name, gone.app, gone.version
        ));
    }
    text.push_str(&summary.line());
    (text, summary)
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<Exit> {
    let files = folder::read(&args.file)?;
    let sources: Vec<String> = files.iter().map(|f| f.source.clone()).collect();
    let mut client = ctx.connect().await?;
    let response = folder::apply(ctx, &mut client, files, true, args.app).await?;
    let (text, summary) = render(&response, &sources);
    let view = folder::SetView::of(&response, |i, file| file_diff(file, sources.get(i)?));
    output::emit(ctx.output, &view, || text)?;
    Ok(if summary.changes() {
        Exit::Changes
    } else {
        Exit::Ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, outcome: ApplyOutcome, version: u32, stored: &str) -> pb::AppliedFile {
        pb::AppliedFile {
            source_name: format!("wf/{name}.yaml"),
            name: name.into(),
            app: "sales".into(),
            outcome: outcome as i32,
            version,
            stored_source: stored.into(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn outcomes_classify_and_only_changes_count_as_changes() {
        assert_eq!(Change::of(ApplyOutcome::Created), Change::Created);
        assert_eq!(Change::of(ApplyOutcome::Updated), Change::Changed);
        assert_eq!(Change::of(ApplyOutcome::Unchanged), Change::Unchanged);
        assert_eq!(Change::of(ApplyOutcome::Valid), Change::Changed);
        let none = Summary {
            unchanged: 3,
            ..Summary::default()
        };
        assert!(!none.changes());
        for summary in [
            Summary { created: 1, ..none },
            Summary { changed: 1, ..none },
            Summary { deleted: 1, ..none },
        ] {
            assert!(summary.changes(), "{summary:?}");
        }
    }

    #[test]
    fn a_set_renders_as_changes_with_unified_diffs() {
        let response = pb::ApplyWorkflowsResponse {
            files: vec![
                file(
                    "etl",
                    ApplyOutcome::Updated,
                    3,
                    "name: etl\ntasks:\n  - a\n  - b\n",
                ),
                file("new", ApplyOutcome::Created, 0, ""),
                file("same", ApplyOutcome::Unchanged, 2, "name: same\n"),
                file("noted", ApplyOutcome::Unchanged, 1, "name: noted\n"),
            ],
            deleted: vec![pb::RemovedWorkflow {
                name: "old".into(),
                app: "sales".into(),
                version: 5,
            }],
            warnings: Vec::new(),
            dry_run: true,
        };
        let sources = [
            "name: etl\ntasks:\n  - a\n  - c\n".to_string(),
            "name: new\n".into(),
            "name: same\n".into(),
            "# a comment\nname: noted\n".into(),
        ];
        let (text, summary) = render(&response, &sources);
        assert_eq!(
            text,
            "\
workflow etl: changed (version 3 to 4) by wf/etl.yaml
--- workflow/etl (version 3, stored)
+++ wf/etl.yaml
@@ -1,4 +1,4 @@
 name: etl
 tasks:
   - a
-  - b
+  - c
workflow new: created from wf/new.yaml
--- /dev/null
+++ wf/new.yaml
@@ -0,0 +1 @@
+name: new
workflow same: unchanged (version 2)
workflow noted: unchanged (version 1; wf/noted.yaml differs only in comments or layout, \
which an apply does not store)
workflow old: deleted (app sales, version 5: no file declares it; its runs are kept)
1 to create, 1 to change, 1 to delete, 2 unchanged
"
        );
        assert_eq!(
            summary,
            Summary {
                created: 1,
                changed: 1,
                unchanged: 2,
                deleted: 1
            }
        );
    }

    #[test]
    fn a_file_without_a_final_newline_still_ends_its_diff_with_one() {
        let diff = unified("a\n", "b", "old", "new");
        assert!(diff.ends_with('\n'), "{diff:?}");
        assert!(diff.contains("+b"), "{diff:?}");
    }
}
