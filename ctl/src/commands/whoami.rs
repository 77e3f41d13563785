//! `axctl whoami`: the token the node sees, its role and app.

use ax_proto::v1 as pb;
use serde::Serialize;

use crate::client::Ctx;
use crate::output;

#[derive(Debug, clap::Args)]
pub struct Args {}

#[derive(Debug, Serialize)]
struct IdentityView {
    token: Option<String>,
    role: Option<String>,
    app: Option<String>,
    authentication: bool,
}

pub async fn run(ctx: &Ctx, _args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let identity = client
        .who_am_i(pb::WhoAmIRequest {})
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    let some = |text: &str| (!text.is_empty()).then(|| text.to_string());
    let view = IdentityView {
        token: some(&identity.token),
        role: some(&identity.role),
        app: some(&identity.app),
        authentication: identity.authentication,
    };
    output::emit(ctx.output, &view, || {
        if !identity.authentication {
            return format!("{} asks for no token: every call is allowed\n", ctx.server);
        }
        let app = if identity.app.is_empty() {
            "every app".to_string()
        } else {
            format!("app {}", identity.app)
        };
        format!("token {} ({}, {app})\n", identity.token, identity.role)
    })
}
