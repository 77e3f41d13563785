//! `axctl purge --older-than 90d [--workflow NAME] [--dry-run]`: deletes ended runs older than
//! the age, with their instances, attempts, log chunks and decisions (admin). Without
//! `--workflow`, every workflow but those whose `retention` is `forever`.

use ax_proto::v1::{PurgeRunsRequest, PurgeRunsResponse};
use serde::Serialize;

use crate::client::Ctx;
use crate::error::CtlError;
use crate::output::{self, fields, rfc3339, time};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Runs that ended longer ago than this go, e.g. 90d, 12h, 1d12h (a unit is required).
    #[arg(long)]
    pub older_than: String,
    /// Only this workflow's runs, whatever its retention.
    #[arg(long)]
    pub workflow: Option<String>,
    /// Count what would go; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize)]
struct PurgeView {
    dry_run: bool,
    ended_before: Option<String>,
    runs: u64,
    instances: u64,
    attempts: u64,
    log_chunks: u64,
    decisions: u64,
    kept_forever: Vec<String>,
}

/// The age as milliseconds: a duration with a unit, more than zero. A bare number is refused:
/// `--older-than 90` meant as days would take almost everything.
fn older_than_ms(text: &str) -> Result<i64, CtlError> {
    let age = ax_core::duration::parse_with_unit(text)
        .map_err(|err| CtlError::usage(format!("--older-than: {err}")))?;
    match i64::try_from(age.as_millis()) {
        Ok(0) => Err(CtlError::usage(
            "--older-than must be more than zero, e.g. 90d",
        )),
        Ok(ms) => Ok(ms),
        Err(_) => Err(CtlError::usage(format!(
            "--older-than {:?} is too large",
            text.trim()
        ))),
    }
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let older_than_ms = older_than_ms(&args.older_than)?;
    let mut client = ctx.connect().await?;
    let response = client
        .purge_runs(PurgeRunsRequest {
            older_than_ms,
            workflow: args.workflow.clone().unwrap_or_default(),
            dry_run: args.dry_run,
            actor: ctx.actor.clone(),
        })
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    let view = PurgeView {
        dry_run: response.dry_run,
        ended_before: rfc3339(response.ended_before_ms),
        runs: response.runs,
        instances: response.instances,
        attempts: response.attempts,
        log_chunks: response.log_chunks,
        decisions: response.decisions,
        kept_forever: response.kept_forever.clone(),
    };
    output::emit(ctx.output, &view, || text(&args, &response))
}

fn text(args: &Args, response: &PurgeRunsResponse) -> String {
    let scope = match &args.workflow {
        Some(name) => format!("of {name} "),
        None => String::new(),
    };
    let mut out = if response.dry_run {
        format!(
            "dry run: runs {scope}that ended before {} would go, nothing was deleted\n",
            time(response.ended_before_ms)
        )
    } else {
        format!(
            "deleted runs {scope}that ended before {}\n",
            time(response.ended_before_ms)
        )
    };
    out.push_str(&fields(&[
        ("runs", response.runs.to_string()),
        ("instances", response.instances.to_string()),
        ("attempts", response.attempts.to_string()),
        ("log chunks", response.log_chunks.to_string()),
        ("decisions", response.decisions.to_string()),
    ]));
    if !response.kept_forever.is_empty() {
        out.push_str(&format!(
            "kept (retention: forever; name one with --workflow to purge it): {}\n",
            response.kept_forever.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_age_needs_a_unit_and_more_than_zero() {
        assert_eq!(older_than_ms("90d").unwrap(), 90 * 86_400_000);
        assert_eq!(older_than_ms("1h30m").unwrap(), 5_400_000);
        assert!(
            older_than_ms("90")
                .unwrap_err()
                .to_string()
                .contains("no unit")
        );
        assert!(
            older_than_ms("0d")
                .unwrap_err()
                .to_string()
                .contains("more than zero")
        );
        assert!(
            older_than_ms("three months")
                .unwrap_err()
                .to_string()
                .contains("invalid duration")
        );
    }
}
