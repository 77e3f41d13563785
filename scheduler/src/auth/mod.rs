//! Who is calling: every request on the node's port passes the [`Gate`] (as a tower layer,
//! `layer.rs`) before it reaches a gRPC service, the JSON API or `/metrics`.
//!
//! A request carries a bearer token (`authorization: Bearer axt_…`, or the web UI's session
//! cookie). The gate hashes it, finds the token in the store (remembered for a few seconds, so
//! a revocation reaches every node within [`CACHE_FOR`]), checks what the call needs
//! (`ax_core::access`) and puts the caller's [`Identity`] in the request's extensions, where
//! handlers find it for app scopes and audit rows. A failed authentication is audited and
//! counted per address; an address past the limit is refused for a while without a look at its
//! token. Refusals never say whether a token name exists.
//!
//! With authentication off (the loopback default), every request passes with no identity.

mod layer;
pub mod tokens;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax_core::access::{self, FailureThrottle, Identity, Need, Throttled};
use ax_store::{AuditRecord, Store, TokenRecord};

pub use layer::AuthLayer;

use crate::audit_writer::AuditWriter;
use crate::clock::now_ms;

/// How long a token looked up in the store is trusted without another look: the longest a
/// revoked token still works on a node that saw it just before.
pub const CACHE_FOR: Duration = Duration::from_secs(5);
/// Failed authentications an address may make within [`THROTTLE_WINDOW_MS`] before it is
/// refused without a look at its token, by default.
pub const FAILURES_PER_ADDRESS: u32 = 20;
const THROTTLE_WINDOW_MS: i64 = 60_000;
/// The web UI's session cookie: the token, for the browser session only.
pub const SESSION_COOKIE: &str = "ax_session";

/// Whether a node asks callers who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Every call but health checks and the page's files needs a token.
    Tokens,
    /// Anyone who reaches the port may do anything (loopback development, or `--insecure`).
    Off,
}

impl std::str::FromStr for AuthMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "tokens" => Ok(AuthMode::Tokens),
            "none" => Ok(AuthMode::Off),
            other => Err(format!("auth {other:?}: expected tokens or none")),
        }
    }
}

/// Why a request was turned away, as the caller is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: tonic::Code,
    pub message: String,
}

impl Refusal {
    fn unauthenticated(message: impl Into<String>) -> Self {
        Refusal {
            code: tonic::Code::Unauthenticated,
            message: message.into(),
        }
    }
}

/// Why a presented token did not authenticate, as the audit row records it. The caller hears
/// only that it is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Malformed,
    Unknown,
    Expired,
    Revoked,
}

impl Failure {
    fn as_str(self) -> &'static str {
        match self {
            Failure::Malformed => "malformed token",
            Failure::Unknown => "unknown token",
            Failure::Expired => "expired token",
            Failure::Revoked => "revoked token",
        }
    }
}

struct Cached {
    token: Option<TokenRecord>,
    at: Instant,
}

/// The check every request passes.
pub struct Gate {
    mode: AuthMode,
    failure_limit: u32,
    store: Arc<dyn Store>,
    audit: AuditWriter,
    cache: Mutex<HashMap<String, Cached>>,
    throttle: Mutex<FailureThrottle>,
}

impl Gate {
    /// `failure_limit`: failed authentications an address may make within a minute.
    pub fn new(
        mode: AuthMode,
        failure_limit: u32,
        store: Arc<dyn Store>,
        audit: AuditWriter,
    ) -> Gate {
        Gate {
            mode,
            failure_limit,
            store,
            audit,
            cache: Mutex::new(HashMap::new()),
            throttle: Mutex::new(FailureThrottle::new(failure_limit, THROTTLE_WINDOW_MS)),
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Decides a request: `Ok(Some(identity))` for an authenticated caller, `Ok(None)` when no
    /// identity is needed (authentication off, or an open path).
    pub async fn check(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        remote: Option<SocketAddr>,
    ) -> Result<Option<Identity>, Refusal> {
        if self.mode == AuthMode::Off {
            return Ok(None);
        }
        let need = access::request_needs(method, path);
        if need == Need::Nothing {
            return Ok(None);
        }
        let Some(token) = token else {
            return Err(Refusal::unauthenticated(
                "this call needs a token: give axctl --token or AX_TOKEN (header \
                 `authorization: Bearer <token>`)",
            ));
        };
        let identity = self.authenticate(token, remote, path).await?;
        if !identity.role.allows(need) {
            return Err(Refusal {
                code: tonic::Code::PermissionDenied,
                message: format!(
                    "token {:?} ({}) may not call {}: {}",
                    identity.token,
                    identity.role,
                    call_name(path),
                    needs_text(need)
                ),
            });
        }
        Ok(Some(identity))
    }

    /// The identity behind `token`, or the refusal. Used by the gate and by the web UI's login.
    pub async fn authenticate(
        &self,
        token: &str,
        remote: Option<SocketAddr>,
        path: &str,
    ) -> Result<Identity, Refusal> {
        let address = remote.map(|r| r.ip());
        if let Some(ip) = address
            && let Throttled::For(ms) = self.lock_throttle().check(ip, now_ms())
        {
            return Err(Refusal {
                code: tonic::Code::ResourceExhausted,
                message: format!(
                    "too many failed authentications from {ip}; try again in {}",
                    ax_core::humane_duration(ms)
                ),
            });
        }
        let verdict = if access::is_token_shaped(token) {
            self.look_up(token).await?
        } else {
            Err((Failure::Malformed, None))
        };
        match verdict {
            Ok(identity) => {
                if let Some(ip) = address {
                    self.lock_throttle().succeed(ip);
                }
                Ok(identity)
            }
            Err((failure, name)) => {
                self.failed(failure, name, remote, path);
                Err(Refusal::unauthenticated(
                    "the token is not valid (malformed, unknown, expired or revoked)",
                ))
            }
        }
    }

    async fn look_up(
        &self,
        token: &str,
    ) -> Result<Result<Identity, (Failure, Option<String>)>, Refusal> {
        let hash = tokens::hash(token);
        let cached = self
            .lock_cache()
            .get(&hash)
            .filter(|c| c.at.elapsed() < CACHE_FOR)
            .map(|c| c.token.clone());
        let record = match cached {
            Some(record) => record,
            None => {
                let record = self.store.token_by_hash(&hash).await.map_err(|err| {
                    tracing::warn!(error = %err, "cannot read tokens from the store");
                    Refusal {
                        code: tonic::Code::Unavailable,
                        message: "cannot check the token: the store is not answering".into(),
                    }
                })?;
                let mut cache = self.lock_cache();
                // Unknown tokens are remembered too (a client retrying a bad token costs no
                // store reads); the map is cleared when it grows past any honest use.
                if cache.len() > 10_000 {
                    cache.clear();
                }
                cache.insert(
                    hash,
                    Cached {
                        token: record.clone(),
                        at: Instant::now(),
                    },
                );
                record
            }
        };
        let Some(record) = record else {
            return Ok(Err((Failure::Unknown, None)));
        };
        let now = now_ms();
        if record.revoked_at.is_some() {
            return Ok(Err((Failure::Revoked, Some(record.name))));
        }
        if record.expires_at.is_some_and(|at| now >= at) {
            return Ok(Err((Failure::Expired, Some(record.name))));
        }
        Ok(Ok(Identity {
            token: record.name,
            role: record.role,
            app: record.app,
            worker: record.worker,
        }))
    }

    /// Counts and audits a failed authentication (the audit row is written off the request's
    /// path: a flood of bad tokens is not a flood of waiting requests).
    fn failed(
        &self,
        failure: Failure,
        name: Option<String>,
        remote: Option<SocketAddr>,
        path: &str,
    ) {
        let now = now_ms();
        let throttled = remote.is_some_and(|r| self.lock_throttle().fail(r.ip(), now));
        tracing::warn!(
            remote = ?remote,
            path,
            reason = failure.as_str(),
            token = name.as_deref().unwrap_or(""),
            "authentication failed"
        );
        let detail = if throttled {
            format!(
                "{}; this address is refused for {}s after {} failures",
                failure.as_str(),
                THROTTLE_WINDOW_MS / 1000,
                self.failure_limit
            )
        } else {
            failure.as_str().to_string()
        };
        let record = AuditRecord {
            at: now,
            actor: "anonymous".into(),
            action: "auth_failed".into(),
            target: call_name(path),
            detail,
            remote: remote.map(|r| r.to_string()).unwrap_or_default(),
            token: name.unwrap_or_default(),
        };
        let audit = self.audit.clone();
        tokio::spawn(async move {
            if let Err(err) = audit.record(record).await {
                tracing::error!(error = %err, "writing the auth_failed audit row failed");
            }
        });
    }

    /// Forgets what was looked up, so a revocation made through this node holds here at once.
    pub fn forget_cached(&self) {
        self.lock_cache().clear();
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_throttle(&self) -> std::sync::MutexGuard<'_, FailureThrottle> {
        self.throttle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A path as people name the call: `TriggerWorkflow`, or `POST /api/v1/…`.
fn call_name(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((service, method)) if service.starts_with("/ax.") || service.starts_with("/grpc.") => {
            method.to_string()
        }
        _ => path.to_string(),
    }
}

fn needs_text(need: Need) -> String {
    match need {
        Need::Nothing => "it is open".into(),
        Need::Role(role) => format!("it needs a token of role {role} or above"),
        Need::WorkerStream => {
            "it needs a worker token (axctl token create --role worker --worker-id PATTERN)".into()
        }
    }
}

/// The bearer token of a request: its `authorization` header, else the web UI's session
/// cookie.
pub fn presented_token(headers: &axum::http::HeaderMap) -> Option<String> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let text = value.to_str().ok()?.trim();
        let token = text
            .strip_prefix("Bearer ")
            .or_else(|| text.strip_prefix("bearer "))
            .unwrap_or(text);
        return Some(token.trim().to_string());
    }
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue, header};

    #[test]
    fn the_token_comes_from_the_header_else_the_session_cookie() {
        let mut headers = HeaderMap::new();
        assert_eq!(presented_token(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("theme=dark; ax_session=axt_cookie"),
        );
        assert_eq!(presented_token(&headers).as_deref(), Some("axt_cookie"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer axt_header"),
        );
        assert_eq!(presented_token(&headers).as_deref(), Some("axt_header"));
    }

    #[test]
    fn calls_are_named_as_people_know_them() {
        assert_eq!(
            call_name("/ax.v1.ControlService/TriggerWorkflow"),
            "TriggerWorkflow"
        );
        assert_eq!(call_name("/api/v1/runs"), "/api/v1/runs");
    }
}
