//! `axctl secret set|list|delete`: secrets workflows name in a task's env (admin). A value is
//! read from stdin or a file, never from the command line (where `ps` and shell history would
//! keep it), and never comes back.

use std::io::Read;
use std::path::PathBuf;

use ax_proto::v1 as pb;
use serde::Serialize;

use crate::client::Ctx;
use crate::error::CtlError;
use crate::output::{self, Table, rfc3339, time};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: SecretCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum SecretCommand {
    /// Creates or replaces a secret; the value comes from stdin (one trailing line break is
    /// dropped) or --from-file (taken as it is).
    Set {
        name: String,
        #[arg(long)]
        from_file: Option<PathBuf>,
    },
    /// Lists secrets' names and when they changed (never their values).
    List,
    /// Deletes a secret no workflow names.
    Delete { name: String },
}

#[derive(Debug, Serialize)]
struct SecretView {
    name: String,
    created_at: Option<String>,
    updated_at: Option<String>,
    updated_by: String,
}

impl From<&pb::Secret> for SecretView {
    fn from(s: &pb::Secret) -> Self {
        SecretView {
            name: s.name.clone(),
            created_at: rfc3339(s.created_at_ms),
            updated_at: rfc3339(s.updated_at_ms),
            updated_by: s.updated_by.clone(),
        }
    }
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    match args.command {
        SecretCommand::Set { name, from_file } => {
            let value = match from_file {
                Some(path) => std::fs::read_to_string(&path).map_err(|err| {
                    CtlError::usage(format!("--from-file {}: {err}", path.display()))
                })?,
                None => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text).map_err(|err| {
                        CtlError::usage(format!("reading the value from stdin: {err}"))
                    })?;
                    let trimmed = text.strip_suffix('\n').unwrap_or(&text);
                    trimmed.strip_suffix('\r').unwrap_or(trimmed).to_string()
                }
            };
            let mut client = ctx.connect().await?;
            let secret = client
                .set_secret(pb::SetSecretRequest {
                    name,
                    value,
                    actor: ctx.actor.clone(),
                })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            output::emit(ctx.output, &SecretView::from(&secret), || {
                format!("secret {} set\n", secret.name)
            })
        }
        SecretCommand::List => {
            let mut client = ctx.connect().await?;
            let secrets = client
                .list_secrets(pb::ListSecretsRequest {})
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner()
                .secrets;
            let views: Vec<SecretView> = secrets.iter().map(SecretView::from).collect();
            output::emit(ctx.output, &views, || {
                let mut table = Table::new(&["NAME", "CREATED", "UPDATED", "BY"]);
                for s in &secrets {
                    table.row(vec![
                        s.name.clone(),
                        time(s.created_at_ms),
                        time(s.updated_at_ms),
                        s.updated_by.clone(),
                    ]);
                }
                table.render()
            })
        }
        SecretCommand::Delete { name } => {
            let mut client = ctx.connect().await?;
            let secret = client
                .delete_secret(pb::DeleteSecretRequest {
                    name,
                    actor: ctx.actor.clone(),
                })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            output::emit(ctx.output, &SecretView::from(&secret), || {
                format!("secret {} deleted\n", secret.name)
            })
        }
    }
}
