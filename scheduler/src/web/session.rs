//! The web UI's sign-in: the page posts a token, the node checks it as it checks every call
//! (audited and throttled when it fails) and hands it back as a session cookie (`HttpOnly`,
//! `SameSite=Strict`, `Secure` over TLS, no expiry: the browser forgets it when its session
//! ends). From then on the browser sends the token with every request, the event streams'
//! too, which cannot carry a header of their own.

use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::actions::Action;
use super::{Api, Peer, answer};
use crate::auth::SESSION_COOKIE;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SignIn {
    token: String,
    /// Filled in by the action reader; unused.
    #[serde(default)]
    #[allow(dead_code)]
    actor: String,
}

pub(super) async fn sign_in(
    State(api): State<Api>,
    peer: Peer,
    Action(body): Action<SignIn>,
) -> Response {
    let gate = &api.node().gate;
    if gate.mode() == crate::auth::AuthMode::Off {
        return answer(api.who_am_i(peer.request(pb::WhoAmIRequest {})).await);
    }
    let token = body.token.trim();
    match gate
        .authenticate(token, peer.remote(), "/api/v1/session")
        .await
    {
        Ok(identity) => {
            let secure = if peer.over_tls { "; Secure" } else { "" };
            let cookie =
                format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}");
            let body = pb::Identity {
                token: identity.token,
                role: identity.role.to_string(),
                app: identity.app.unwrap_or_default(),
                authentication: true,
            };
            ([(header::SET_COOKIE, cookie)], axum::Json(body)).into_response()
        }
        Err(refusal) => refusal.into_response(),
    }
}

pub(super) async fn sign_out() -> Response {
    let cookie = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    (
        [(header::SET_COOKIE, cookie)],
        axum::Json(serde_json::json!({})),
    )
        .into_response()
}

pub(super) async fn who_am_i(State(api): State<Api>, peer: Peer) -> Response {
    answer(api.who_am_i(peer.request(pb::WhoAmIRequest {})).await)
}
