//! `axctl token create|list|revoke`: API tokens (admin). A token is shown once, at creation;
//! the nodes keep only its hash.

use ax_proto::v1 as pb;
use serde::Serialize;

use crate::client::Ctx;
use crate::error::CtlError;
use crate::output::{self, Output, Table, or_dash, rfc3339, time};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Creates a token and prints it on stdout, once.
    Create {
        #[arg(long)]
        name: String,
        /// viewer (reads), operator (also triggers, cancels, retries, reruns, pauses,
        /// backfills), admin (also applies workflows and manages tokens) or worker (holds a
        /// worker stream only).
        #[arg(long)]
        role: String,
        /// Scope the token to this app's workflows.
        #[arg(long)]
        app: Option<String>,
        /// How long it lasts, e.g. 90d, 12h, 30m (default: until revoked).
        #[arg(long, value_parser = ax_core::access::parse_lifetime_ms)]
        expires: Option<i64>,
    },
    /// Lists tokens (never their text).
    List,
    /// Revokes a token by name; every node refuses it within seconds.
    Revoke { name: String },
}

#[derive(Debug, Serialize)]
pub struct TokenView {
    pub name: String,
    pub role: String,
    pub app: Option<String>,
    pub created_at: Option<String>,
    pub created_by: String,
    pub expires_at: Option<String>,
    pub revoked_at: Option<String>,
}

impl From<&pb::Token> for TokenView {
    fn from(t: &pb::Token) -> Self {
        let instant = |ms: i64| if ms > 0 { rfc3339(ms) } else { None };
        TokenView {
            name: t.name.clone(),
            role: t.role.clone(),
            app: (!t.app.is_empty()).then(|| t.app.clone()),
            created_at: rfc3339(t.created_at_ms),
            created_by: t.created_by.clone(),
            expires_at: instant(t.expires_at_ms),
            revoked_at: instant(t.revoked_at_ms),
        }
    }
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    match args.command {
        TokenCommand::Create {
            name,
            role,
            app,
            expires,
        } => {
            role.parse::<ax_core::access::Role>()
                .map_err(CtlError::usage)?;
            let created = client
                .create_token(pb::CreateTokenRequest {
                    name,
                    role,
                    app: app.unwrap_or_default(),
                    lifetime_ms: expires.unwrap_or(0),
                    actor: ctx.actor.clone(),
                })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            let token = created.token.unwrap_or_default();
            // The token alone on stdout, so `axctl token create … > worker.token` works; what
            // it is goes to stderr.
            eprintln!(
                "token {:?} ({}{}) created; it is shown once: keep it now",
                token.name,
                token.role,
                if token.app.is_empty() {
                    String::new()
                } else {
                    format!(", app {}", token.app)
                }
            );
            if ctx.output == Output::Table {
                println!("{}", created.secret);
                return Ok(());
            }
            #[derive(Serialize)]
            struct Created {
                token: TokenView,
                secret: String,
            }
            let view = Created {
                token: TokenView::from(&token),
                secret: created.secret,
            };
            output::emit(ctx.output, &view, String::new)
        }
        TokenCommand::List => {
            let tokens = client
                .list_tokens(pb::ListTokensRequest {})
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner()
                .tokens;
            let views: Vec<TokenView> = tokens.iter().map(TokenView::from).collect();
            output::emit(ctx.output, &views, || {
                let mut table =
                    Table::new(&["NAME", "ROLE", "APP", "CREATED", "BY", "EXPIRES", "REVOKED"]);
                for t in &tokens {
                    let instant = |ms: i64| if ms > 0 { time(ms) } else { "-".into() };
                    table.row(vec![
                        t.name.clone(),
                        t.role.clone(),
                        or_dash(&t.app),
                        time(t.created_at_ms),
                        t.created_by.clone(),
                        instant(t.expires_at_ms),
                        instant(t.revoked_at_ms),
                    ]);
                }
                table.render()
            })
        }
        TokenCommand::Revoke { name } => {
            let token = client
                .revoke_token(pb::RevokeTokenRequest {
                    name,
                    actor: ctx.actor.clone(),
                })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            output::emit(ctx.output, &TokenView::from(&token), || {
                format!("token {} revoked\n", token.name)
            })
        }
    }
}
