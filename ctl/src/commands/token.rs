//! `axctl token create|list|revoke`: API tokens (admin). A token is shown once, at creation;
//! the nodes keep only its hash. A worker token names the worker ids it may register
//! (`--worker-id`, required), and may be limited to apps (`--app`, repeatable) and to the labels
//! its workers may claim (`--label`).

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
        /// Scope the token to this app's workflows. A worker token may name several apps
        /// (repeat the flag): its workers are sent only their tasks (and secrets).
        #[arg(long)]
        app: Vec<String>,
        /// Worker tokens (required): a worker id the token may register: an id (`w1`), a
        /// prefix (`etl-*`), or `*` for any id. `*` lets whoever holds the token register as
        /// any worker, taking over an id whose stream is gone and ending what that worker ran;
        /// prefer one token per worker or per pool. Repeatable.
        #[arg(long = "worker-id", value_name = "PATTERN")]
        worker_id: Vec<String>,
        /// Worker tokens: a label its workers may claim, as key=value (a worker registering
        /// with any other label is refused); repeatable. Default: any labels.
        #[arg(long, value_name = "KEY=VALUE")]
        label: Vec<String>,
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
    /// A worker token's scope.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub worker_ids: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub worker_apps: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub worker_labels: Vec<String>,
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
            worker_ids: t.worker_ids.clone(),
            worker_apps: t.worker_apps.clone(),
            worker_labels: t.worker_labels.clone(),
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
            worker_id,
            label,
            expires,
        } => {
            let parsed = role
                .parse::<ax_core::access::Role>()
                .map_err(CtlError::usage)?;
            let (app, worker_apps) = if parsed == ax_core::access::Role::Worker {
                // Checked here too, so a missing pattern is a usage error before any call.
                ax_core::worker_scope::WorkerScope::parse(&worker_id, &app, &label)
                    .map_err(CtlError::usage)?;
                (String::new(), app)
            } else {
                if !worker_id.is_empty() || !label.is_empty() {
                    return Err(CtlError::usage(
                        "--worker-id and --label are for worker tokens (--role worker)",
                    )
                    .into());
                }
                if app.len() > 1 {
                    return Err(CtlError::usage(format!(
                        "a {parsed} token is scoped to one app at most (several --app are for \
                         worker tokens)"
                    ))
                    .into());
                }
                (app.into_iter().next().unwrap_or_default(), Vec::new())
            };
            let created = client
                .create_token(pb::CreateTokenRequest {
                    name,
                    role,
                    app,
                    lifetime_ms: expires.unwrap_or(0),
                    actor: ctx.actor.clone(),
                    worker_ids: worker_id,
                    worker_apps,
                    worker_labels: label,
                })
                .await
                .map_err(|status| ctx.status(status))?
                .into_inner();
            let token = created.token.unwrap_or_default();
            // The token alone on stdout, so `axctl token create … > worker.token` works; what
            // it is goes to stderr.
            eprintln!(
                "token {:?} ({}{}{}) created; it is shown once: keep it now",
                token.name,
                token.role,
                if token.app.is_empty() {
                    String::new()
                } else {
                    format!(", app {}", token.app)
                },
                worker_scope_text(&token)
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
                let mut table = Table::new(&[
                    "NAME",
                    "ROLE",
                    "APP",
                    "WORKER IDS",
                    "LABELS",
                    "CREATED",
                    "BY",
                    "EXPIRES",
                    "REVOKED",
                ]);
                for t in &tokens {
                    let instant = |ms: i64| if ms > 0 { time(ms) } else { "-".into() };
                    let apps = if t.worker_apps.is_empty() {
                        t.app.clone()
                    } else {
                        t.worker_apps.join(",")
                    };
                    table.row(vec![
                        t.name.clone(),
                        t.role.clone(),
                        or_dash(&apps),
                        or_dash(&t.worker_ids.join(",")),
                        or_dash(&t.worker_labels.join(",")),
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

/// A worker token's scope, as `axctl token create` says what it made: `, worker ids etl-*,
/// apps sales, labels pool=gpu` (empty for other roles).
fn worker_scope_text(token: &pb::Token) -> String {
    if token.worker_ids.is_empty() {
        return String::new();
    }
    let mut text = format!(", worker ids {}", token.worker_ids.join(","));
    if token.worker_ids.iter().any(|id| id == "*") {
        text.push_str(" (any id: whoever holds it may register as any worker)");
    }
    if !token.worker_apps.is_empty() {
        text.push_str(&format!(", apps {}", token.worker_apps.join(",")));
    }
    if !token.worker_labels.is_empty() {
        text.push_str(&format!(", labels {}", token.worker_labels.join(",")));
    }
    text
}
