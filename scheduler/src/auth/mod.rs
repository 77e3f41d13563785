//! Who is calling: every request on the node's port passes the [`Gate`] (as a tower layer,
//! `layer.rs`) before it reaches a gRPC service, the JSON API or `/metrics`.
//!
//! A request carries a bearer token (`authorization: Bearer axt_…`, or, on the JSON API from
//! the node's own origin, the web UI's session cookie). The gate hashes it, finds the token in the store (remembered for a few seconds, so
//! a revocation reaches every node within [`CACHE_FOR`]), checks what the call needs
//! (`ax_core::access`) and puts the caller's [`Identity`] in the request's extensions, where
//! handlers find it for app scopes and audit rows. A failed authentication is counted per
//! address and audited (`ax_core::failure_audit` bounds the rows a flood writes). Past the
//! limit, an address's failures are answered `ResourceExhausted` after a pause, which slows a
//! guesser down; a valid token from the same address still passes at once, so clients behind
//! one NAT or proxy are not locked out by a neighbour's bad token. Refusals never say whether a
//! token name exists.
//!
//! With authentication off (the loopback default), every request passes with no identity.

pub(crate) mod layer;
pub mod tokens;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax_core::access::{self, FailureThrottle, Identity, Need, Throttled};
use ax_core::failure_audit::{AuditRow, FailureAudit, FailureKind};
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
/// How long a throttled address waits for the answer to a failed authentication.
const THROTTLED_FAILURE_PAUSE: Duration = Duration::from_secs(1);
/// Failed authentications written as audit rows of their own per minute (the rest are counted
/// in summary rows).
const FAILURE_ROWS_PER_MINUTE: usize = 100;
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
    store: Arc<Store>,
    audit: AuditWriter,
    /// Where audit rows of failures are written, off the requests' paths.
    tasks: tokio_util::task::TaskTracker,
    cache: Mutex<HashMap<String, Cached>>,
    throttle: Mutex<FailureThrottle>,
    failure_audit: Mutex<FailureAudit>,
}

impl Gate {
    /// `failure_limit`: failed authentications an address may make within a minute.
    pub fn new(
        mode: AuthMode,
        failure_limit: u32,
        store: Arc<Store>,
        audit: AuditWriter,
        tasks: tokio_util::task::TaskTracker,
    ) -> Gate {
        Gate {
            mode,
            failure_limit,
            store,
            audit,
            tasks,
            cache: Mutex::new(HashMap::new()),
            throttle: Mutex::new(FailureThrottle::new(failure_limit, THROTTLE_WINDOW_MS)),
            failure_audit: Mutex::new(FailureAudit::new(
                THROTTLE_WINDOW_MS,
                FAILURE_ROWS_PER_MINUTE,
            )),
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
        let throttled = address.and_then(|ip| match self.lock_throttle().check(ip, now_ms()) {
            Throttled::For(ms) => Some((ip, ms)),
            Throttled::No => None,
        });
        // The token is judged whatever the throttle says: it governs failures only.
        let verdict = if access::is_token_shaped(token) {
            self.look_up(token).await?
        } else {
            Err((Failure::Malformed, None))
        };
        match verdict {
            Ok(identity) => {
                if let Some(ip) = address
                    && throttled.is_none()
                {
                    self.lock_throttle().succeed(ip);
                }
                Ok(identity)
            }
            Err((failure, name)) => {
                self.failed(failure, name, remote, path);
                if let Some((ip, ms)) = throttled {
                    tokio::time::sleep(THROTTLED_FAILURE_PAUSE).await;
                    return Err(Refusal {
                        code: tonic::Code::ResourceExhausted,
                        message: format!(
                            "too many failed authentications from {ip}; the token is not valid \
                             (a valid one is taken at once; failures wait {} more)",
                            ax_core::humane_duration(ms)
                        ),
                    });
                }
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

    /// Counts and audits a failed authentication (the audit rows are written off the request's
    /// path: a flood of bad tokens is not a flood of waiting requests, nor of rows).
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
        let kind = FailureKind {
            address: remote.map(|r| r.ip().to_string()).unwrap_or_default(),
            reason: if throttled {
                format!(
                    "{}; this address's failures are slowed for {}s after {} of them",
                    failure.as_str(),
                    THROTTLE_WINDOW_MS / 1000,
                    self.failure_limit
                )
            } else {
                failure.as_str().to_string()
            },
            token: name.unwrap_or_default(),
        };
        let rows = self.lock_failure_audit().record(kind, now);
        self.write_failure_rows(rows, remote, path);
    }

    fn write_failure_rows(&self, rows: Vec<AuditRow>, remote: Option<SocketAddr>, path: &str) {
        if rows.is_empty() {
            return;
        }
        let records = failure_records(rows, remote, path);
        let audit = self.audit.clone();
        // Off the request's path: a refusal never waits for the audit trail.
        self.tasks.spawn(write_all(audit, records));
    }

    /// Writes the failure summaries every few seconds until `cancel`, and the last ones then.
    pub async fn flush_failures_until(
        self: Arc<Self>,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(Duration::from_secs(5)) => {
                    let rows = self.lock_failure_audit().close_if_ended(now_ms());
                    self.write_failure_rows(rows, None, "");
                }
            }
        }
        let rows = self.lock_failure_audit().close();
        write_all(self.audit.clone(), failure_records(rows, None, "")).await;
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

    fn lock_failure_audit(&self) -> std::sync::MutexGuard<'_, FailureAudit> {
        self.failure_audit.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn write_all(audit: AuditWriter, records: Vec<AuditRecord>) {
    for record in records {
        if let Err(err) = audit.record(record).await {
            tracing::error!(error = %err, "writing an auth_failed audit row failed");
        }
    }
}

fn failure_records(
    rows: Vec<AuditRow>,
    remote: Option<SocketAddr>,
    path: &str,
) -> Vec<AuditRecord> {
    let now = now_ms();
    rows.into_iter()
        .map(|row| failure_record(row, now, remote, path))
        .collect()
}

/// The audit row of a failure, or of a window's summary.
fn failure_record(
    row: AuditRow,
    now: ax_core::Millis,
    remote: Option<SocketAddr>,
    path: &str,
) -> AuditRecord {
    let anonymous = |target: String, detail: String, remote: String, token: String| AuditRecord {
        at: now,
        actor: "anonymous".into(),
        action: "auth_failed".into(),
        target,
        detail,
        remote,
        token,
    };
    match row {
        AuditRow::First(kind) => anonymous(
            call_name(path),
            kind.reason,
            remote.map(|r| r.to_string()).unwrap_or(kind.address),
            kind.token,
        ),
        AuditRow::Repeated { kind, count, since } => anonymous(
            "(summary)".into(),
            format!(
                "{count} more failures like the first ({}) from {} since {}",
                kind.reason,
                kind.address,
                ax_core::rfc3339(since)
            ),
            kind.address,
            kind.token,
        ),
        AuditRow::Overflow {
            failures,
            addresses,
            since,
        } => anonymous(
            "(summary)".into(),
            format!(
                "{failures} failures from {addresses} addresses since {}, past the {} rows a \
                 minute written one by one",
                ax_core::rfc3339(since),
                FAILURE_ROWS_PER_MINUTE
            ),
            String::new(),
            String::new(),
        ),
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

/// The bearer token of a request's `authorization` header.
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?;
    let text = value.to_str().ok()?.trim();
    let token = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .unwrap_or(text);
    Some(token.trim().to_string())
}

/// The web UI's session cookie. Only the JSON API and its event streams read it, and only for
/// a request of the node's own origin (`ax_core::cross_site`); gRPC never does.
pub fn session_cookie(headers: &axum::http::HeaderMap) -> Option<String> {
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
    fn the_token_comes_from_the_header_and_the_session_from_its_cookie() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), None);
        assert_eq!(session_cookie(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("theme=dark; ax_session=axt_cookie"),
        );
        assert_eq!(bearer_token(&headers), None);
        assert_eq!(session_cookie(&headers).as_deref(), Some("axt_cookie"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer axt_header"),
        );
        assert_eq!(bearer_token(&headers).as_deref(), Some("axt_header"));
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
