//! `axctl apply -f FILE|DIR [--dry-run] [--prune --app APP]`

use std::path::{Path, PathBuf};

use anyhow::Context;
use ax_proto::v1::{ApplyOutcome, ApplyWorkflowRequest, ApplyWorkflowResponse};

use super::folder;
use crate::client::{Client, Ctx};
use crate::output::{self, Output};
use crate::view::ApplyView;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A workflow file (YAML), or a folder: every .yaml and .yml file under it (hidden ones
    /// skipped), applied in one transaction, all or nothing.
    #[arg(
        short = 'f',
        long = "filename",
        visible_alias = "file",
        value_name = "PATH"
    )]
    pub file: PathBuf,

    /// Check only; store nothing (a folder: say what applying would do).
    #[arg(long)]
    pub dry_run: bool,

    /// Delete the workflows of --app that no file declares, in the same transaction (their
    /// runs are kept as history). Refused while one of them has unfinished runs.
    #[arg(long, requires = "app")]
    pub prune: bool,

    /// The app --prune covers.
    #[arg(long, requires = "prune", value_name = "APP")]
    pub app: Option<String>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    if args.prune || args.file.is_dir() {
        return apply_set(ctx, args).await;
    }
    // The file is read before connecting, so a typo in its name is reported as such even when
    // the server is down.
    let source = read_source(&args.file)?;
    let mut client = ctx.connect().await?;
    let response = apply_source(ctx, &mut client, &args.file, source, args.dry_run).await?;
    if ctx.output != Output::Table {
        output::emit(ctx.output, &ApplyView::from(&response), String::new)?;
    }
    Ok(())
}

/// A folder (or a pruning apply of one file): one `ApplyWorkflows` call.
async fn apply_set(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let files = folder::read(&args.file)?;
    let mut client = ctx.connect().await?;
    let response = folder::apply(ctx, &mut client, files, args.dry_run, args.app).await?;
    output::emit(
        ctx.output,
        &folder::SetView::of(&response, |_, _| None),
        || folder::outcome_lines(&response),
    )
}

pub fn read_source(file: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(file)
        .with_context(|| format!("cannot read workflow file {}", file.display()))
}

/// Applies the text of `file`, printing the outcome line (stdout in table mode) and warnings
/// (stderr). Shared with `axctl dev --run`.
pub async fn apply_source(
    ctx: &Ctx,
    client: &mut Client,
    file: &Path,
    source: String,
    dry_run: bool,
) -> anyhow::Result<ApplyWorkflowResponse> {
    let request = ApplyWorkflowRequest {
        source,
        // The path as the user typed it, so server diagnostics point where they expect.
        source_name: file.display().to_string(),
        dry_run,
        actor: ctx.actor.clone(),
    };
    let response = client
        .apply_workflow(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    for warning in &response.warnings {
        eprintln!("warning: {}", output::escape(warning));
    }
    if ctx.output == Output::Table {
        output::write_stdout(&format!("{}\n", outcome_line(&response)))?;
    }
    Ok(response)
}

/// `workflow nightly-etl created (version 1)`.
pub fn outcome_line(response: &ApplyWorkflowResponse) -> String {
    let (name, version) = response
        .workflow
        .as_ref()
        .map_or(("?", 0), |w| (w.name.as_str(), w.version));
    match response.outcome() {
        ApplyOutcome::Created => format!("workflow {name} created (version {version})"),
        ApplyOutcome::Updated => format!("workflow {name} updated (version {version})"),
        ApplyOutcome::Unchanged => format!("workflow {name} unchanged (version {version})"),
        ApplyOutcome::Valid => format!("workflow {name} is valid"),
        ApplyOutcome::Unspecified => format!("workflow {name} applied (version {version})"),
    }
}
