//! `axctl apply -f FILE [--dry-run]`

use std::path::{Path, PathBuf};

use anyhow::Context;
use ax_proto::v1::{ApplyOutcome, ApplyWorkflowRequest, ApplyWorkflowResponse};

use crate::client::{Client, Ctx};
use crate::output::{self, Output};
use crate::view::ApplyView;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The workflow file (YAML).
    #[arg(
        short = 'f',
        long = "filename",
        visible_alias = "file",
        value_name = "FILE"
    )]
    pub file: PathBuf,

    /// Validate only; store nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
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
