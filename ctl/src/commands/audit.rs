//! `axctl audit [--limit N] [--action A] [--target T] [--by ACTOR]`

use ax_proto::v1 as pb;
use serde::Serialize;

use crate::client::Ctx;
use crate::output::{self, Table, or_dash, rfc3339, time};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// At most this many rows, newest first (the server caps it at 1000).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Only this action: apply, trigger, backfill, cancel, retry, rerun, pause, resume.
    #[arg(long)]
    pub action: Option<String>,
    /// Only this target, exactly: workflow/NAME, run/ID, instance/ID.
    #[arg(long)]
    pub target: Option<String>,
    /// Only what this actor did (as recorded: `user@host` by default).
    #[arg(long = "by", value_name = "ACTOR")]
    pub by: Option<String>,
    /// Only what was done with this token (by its name).
    #[arg(long = "by-token", value_name = "NAME")]
    pub by_token: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct AuditView {
    pub at: Option<String>,
    pub actor: String,
    pub token: String,
    pub action: String,
    pub target: String,
    pub remote: String,
    pub detail: String,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    if args.limit == 0 {
        return Err(crate::error::CtlError::usage("--limit must be at least 1").into());
    }
    let mut client = ctx.connect().await?;
    let request = pb::ListAuditRequest {
        limit: args.limit,
        action: args.action.unwrap_or_default(),
        target: args.target.unwrap_or_default(),
        actor: args.by.unwrap_or_default(),
        token: args.by_token.unwrap_or_default(),
    };
    let entries = client
        .list_audit(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner()
        .entries;
    let views: Vec<AuditView> = entries
        .iter()
        .map(|e| AuditView {
            at: rfc3339(e.at_ms),
            actor: e.actor.clone(),
            token: e.token.clone(),
            action: e.action.clone(),
            target: e.target.clone(),
            remote: e.remote.clone(),
            detail: e.detail.clone(),
        })
        .collect();
    output::emit(ctx.output, &views, || audit_table(&entries))
}

fn audit_table(entries: &[pb::AuditEntry]) -> String {
    let mut table = Table::new(&["WHEN", "WHO", "TOKEN", "ACTION", "TARGET", "FROM", "DETAIL"]);
    for e in entries {
        table.row(vec![
            time(e.at_ms),
            or_dash(&e.actor),
            or_dash(&e.token),
            e.action.clone(),
            or_dash(&e.target),
            or_dash(&e.remote),
            or_dash(&e.detail.replace('\n', " ")),
        ]);
    }
    table.render()
}
