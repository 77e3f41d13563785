//! `axctl secret set|list|delete`: secrets workflows name in a task's env (admin). A value is
//! read from stdin or a file, never from the command line (where `ps` and shell history would
//! keep it), and never comes back. A secret belongs to an app (`--app`) or is global: a token
//! scoped to an app manages that app's (its default), an unscoped admin the global ones (its
//! default) and any app's.

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
        /// The app whose workflows may name it (default: a scoped token's app; global for an
        /// unscoped token).
        #[arg(long, default_value = "")]
        app: String,
    },
    /// Lists secrets' apps, names and when they changed (never their values).
    List {
        /// Only those a workflow of this app may name: its own and the global ones (a scoped
        /// token sees no others anyway).
        #[arg(long, default_value = "")]
        app: String,
    },
    /// Deletes a secret no workflow names.
    Delete {
        name: String,
        /// The app it belongs to (default: a scoped token's app; global for an unscoped token).
        #[arg(long, default_value = "")]
        app: String,
    },
}

/// How a secret's app reads in a table and in messages: its name, or `(global)`.
const GLOBAL: &str = "(global)";

fn app_text(app: &str) -> &str {
    if app.is_empty() { GLOBAL } else { app }
}

/// `secret NAME` of a global secret, `secret NAME of app APP` of an app's.
fn described(secret: &pb::Secret) -> String {
    if secret.app.is_empty() {
        format!("secret {}", secret.name)
    } else {
        format!("secret {} of app {}", secret.name, secret.app)
    }
}

#[derive(Debug, Serialize)]
struct SecretView {
    /// Empty for a global secret.
    app: String,
    name: String,
    created_at: Option<String>,
    updated_at: Option<String>,
    updated_by: String,
}

impl From<&pb::Secret> for SecretView {
    fn from(s: &pb::Secret) -> Self {
        SecretView {
            app: s.app.clone(),
            name: s.name.clone(),
            created_at: rfc3339(s.created_at_ms),
            updated_at: rfc3339(s.updated_at_ms),
            updated_by: s.updated_by.clone(),
        }
    }
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    match args.command {
        SecretCommand::Set {
            name,
            from_file,
            app,
        } => {
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
                    app,
                })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            output::emit(ctx.output, &SecretView::from(&secret), || {
                format!("{} set\n", described(&secret))
            })
        }
        SecretCommand::List { app } => {
            let mut client = ctx.connect().await?;
            let secrets = client
                .list_secrets(pb::ListSecretsRequest { app })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner()
                .secrets;
            let views: Vec<SecretView> = secrets.iter().map(SecretView::from).collect();
            output::emit(ctx.output, &views, || {
                let mut table = Table::new(&["APP", "NAME", "CREATED", "UPDATED", "BY"]);
                for s in &secrets {
                    table.row(vec![
                        app_text(&s.app).to_string(),
                        s.name.clone(),
                        time(s.created_at_ms),
                        time(s.updated_at_ms),
                        s.updated_by.clone(),
                    ]);
                }
                table.render()
            })
        }
        SecretCommand::Delete { name, app } => {
            let mut client = ctx.connect().await?;
            let secret = client
                .delete_secret(pb::DeleteSecretRequest {
                    name,
                    actor: ctx.actor.clone(),
                    app,
                })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            output::emit(ctx.output, &SecretView::from(&secret), || {
                format!("{} deleted\n", described(&secret))
            })
        }
    }
}
