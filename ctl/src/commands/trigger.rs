//! `axctl trigger NAME [--param k=v ...] [--idempotency-key K] [--retry-for D] [--wait]`

use std::collections::HashMap;

use ax_proto::v1::{Run, TriggerWorkflowRequest};

use crate::client::{Client, Ctx};
use crate::error::{CtlError, Exit};
use crate::output;
use crate::overload;
use crate::view::{RunView, TriggerView};
use crate::wait;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The workflow to run.
    pub name: String,

    /// A run parameter, `KEY=VALUE`; KEY must be a valid environment variable name because tasks
    /// receive parameters in their environment. Repeatable.
    #[arg(short, long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,

    /// A repeated key returns the run the first trigger created instead of starting another.
    #[arg(long)]
    pub idempotency_key: Option<String>,

    /// Wait for the run to end, showing progress on stderr; the exit code tells how it ended.
    #[arg(long)]
    pub wait: bool,

    /// While the scheduler refuses the trigger for load (too many instances waiting), try again
    /// after growing, jittered waits that honour its hint, for at most this long (e.g. 30s, 5m;
    /// 0 does not try again); then exit 8.
    #[arg(long, value_name = "DURATION", default_value = crate::overload::DEFAULT_RETRY_FOR, value_parser = crate::overload::parse_retry_for)]
    pub retry_for: std::time::Duration,
}

/// Checks one `--param` at parse time, so a bad one is a usage error before any RPC.
fn parse_param(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("expected KEY=VALUE, got {text:?}"));
    };
    if !is_env_name(key) {
        return Err(format!(
            "parameter name {key:?} is not a valid environment variable name \
             (letters, digits and _, not starting with a digit)"
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<Exit> {
    let mut params = HashMap::new();
    for (key, value) in args.params {
        if params.insert(key.clone(), value).is_some() {
            return Err(
                CtlError::usage(format!("parameter {key:?} is given more than once")).into(),
            );
        }
    }
    let mut client = ctx.connect().await?;
    let (run, created) = trigger(
        ctx,
        &mut client,
        &args.name,
        params,
        args.idempotency_key,
        args.retry_for,
    )
    .await?;
    if !args.wait {
        let view = TriggerView {
            created,
            run: Some(RunView::from(&run)),
        };
        // The bare id on stdout lets scripts do `RUN=$(axctl trigger x)`.
        output::emit(ctx.output, &view, || format!("{}\n", run.id))?;
        return Ok(Exit::Ok);
    }
    let run = wait::wait_for_run(ctx, &mut client, run.id).await?;
    let view = RunView::from(&run);
    output::emit(ctx.output, &view, || {
        super::get::runs_table(std::slice::from_ref(&run))
    })?;
    Ok(wait::exit_for(run.state))
}

/// Triggers a run, trying again for `retry_for` while it is refused for load, and says on
/// stderr what happened. Shared with `axctl dev --run`.
pub async fn trigger(
    ctx: &Ctx,
    client: &mut Client,
    name: &str,
    params: HashMap<String, String>,
    idempotency_key: Option<String>,
    retry_for: std::time::Duration,
) -> anyhow::Result<(Run, bool)> {
    let request = TriggerWorkflowRequest {
        name: name.to_string(),
        params,
        idempotency_key: idempotency_key.clone().unwrap_or_default(),
        actor: ctx.actor.clone(),
        logical_time_ms: 0,
    };
    let what = format!("trigger {}", output::escape(name));
    let response = overload::with_retries(&what, retry_for, || {
        let mut client = client.clone();
        let request = request.clone();
        async move { client.trigger_workflow(request).await }
    })
    .await
    .map_err(|err| err.into_error(ctx))?
    .into_inner();
    let run = response
        .run
        .ok_or_else(|| anyhow::anyhow!("the server answered the trigger without a run"))?;
    if response.created {
        eprintln!(
            "triggered workflow {}: run {} created",
            output::escape(name),
            run.id
        );
    } else {
        eprintln!(
            "workflow {}: run {} already existed for idempotency key {:?}",
            output::escape(name),
            run.id,
            idempotency_key.unwrap_or_default()
        );
    }
    Ok((run, response.created))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_need_an_env_var_name_and_an_equals_sign() {
        assert_eq!(
            parse_param("DATE=2024-01-01"),
            Ok(("DATE".into(), "2024-01-01".into()))
        );
        assert_eq!(parse_param("_x1=a=b"), Ok(("_x1".into(), "a=b".into())));
        assert_eq!(parse_param("EMPTY="), Ok(("EMPTY".into(), String::new())));
        assert!(parse_param("1abc=x").unwrap_err().contains("\"1abc\""));
        assert!(
            parse_param("bad-name=x")
                .unwrap_err()
                .contains("\"bad-name\"")
        );
        assert!(parse_param("=x").is_err());
        assert!(parse_param("novalue").unwrap_err().contains("KEY=VALUE"));
    }
}
