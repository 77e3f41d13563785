//! The connection to a scheduler node and what every command shares.

use std::time::Duration;

use ax_proto::client::{Bearer, ClientAuth};
use ax_proto::v1::control_service_client::ControlServiceClient;
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::error::{self, CtlError};
use crate::output::Output;

pub type Client = ControlServiceClient<InterceptedService<Channel, Bearer>>;

/// How long to wait for the TCP/HTTP2 connection before calling the server unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer axctl decodes.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// The global options, resolved once in `main` and passed to every command.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub server: String,
    pub output: Output,
    pub actor: String,
    /// The token and the CA to trust.
    pub auth: ClientAuth,
}

impl Ctx {
    /// Opens the connection eagerly, so an unreachable server is reported once, up front, with
    /// its address, rather than as an opaque transport error from the first call.
    pub async fn connect(&self) -> Result<Client, CtlError> {
        let endpoint = self
            .auth
            .endpoint(&self.server, None)
            .map_err(|e| CtlError::usage(format!("--server {:?}: {e}", self.server)))?
            .connect_timeout(CONNECT_TIMEOUT);
        let bearer = self
            .auth
            .bearer()
            .map_err(|e| CtlError::usage(format!("--token: {e}")))?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| error::unreachable(&self.server, &e))?;
        // A workflow of 10,000 tasks comes back with its source and every task: more than
        // tonic's default 4 MiB.
        Ok(ControlServiceClient::with_interceptor(channel, bearer)
            .max_decoding_message_size(MAX_RESPONSE_BYTES))
    }

    /// Turns a failed call into the error `main` reports (message and exit code).
    pub fn status(&self, status: Status) -> anyhow::Error {
        error::from_status(&status, &self.server).into()
    }
}

/// `host:port` is accepted for convenience; gRPC needs a scheme.
pub fn normalize_server(server: &str) -> String {
    let server = server.trim().trim_end_matches('/');
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// `$USER@hostname`, the default audit identity.
pub fn default_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = ax_proto::hostname().unwrap_or_else(|| "localhost".into());
    format!("{user}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_without_scheme_gets_http() {
        assert_eq!(normalize_server("127.0.0.1:7070"), "http://127.0.0.1:7070");
        assert_eq!(
            normalize_server("https://ax.example/"),
            "https://ax.example"
        );
    }

    #[test]
    fn actor_has_user_and_host() {
        let actor = default_actor();
        let (user, host) = actor.split_once('@').expect("user@host");
        assert!(!user.is_empty() && !host.is_empty(), "{actor}");
    }
}
