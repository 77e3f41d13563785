//! Who may do what: token roles, what each call needs, app scopes and the throttle on failed
//! authentications.
//!
//! A workflow's commands run on the workers, so defining one is the most powerful act in ax:
//! applying workflows and managing tokens and secrets is `admin`'s; triggering, cancelling,
//! retrying, rerunning, marking, pausing and backfilling is `operator`'s; reading is `viewer`'s. Each
//! role includes the ones below it. `worker` is a role of its own: it may hold a worker stream
//! and nothing else, and only a worker token may (a worker receives tasks' secrets, so no other
//! role is one by accident); what it may register and run is its [`WorkerScope`]. A token
//! scoped to an app sees and acts on that app's workflows only; to it, another app's workflow
//! does not exist.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::Millis;
use crate::worker_scope::WorkerScope;

/// A token's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Viewer,
    Operator,
    Admin,
    /// Holds a worker stream; reads nothing.
    Worker,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Operator, Role::Admin, Role::Worker];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
            Role::Worker => "worker",
        }
    }

    /// Whether a token of this role may make a call that needs `need`.
    pub fn allows(self, need: Need) -> bool {
        match need {
            Need::Nothing => true,
            Need::WorkerStream => self == Role::Worker,
            Need::Role(wanted) => match self {
                Role::Worker => false,
                _ => self.rank() >= wanted.rank(),
            },
        }
    }

    fn rank(self) -> u8 {
        match self {
            Role::Worker => 0,
            Role::Viewer => 1,
            Role::Operator => 2,
            Role::Admin => 3,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == text)
            .ok_or_else(|| format!("role {text:?} is not one of viewer, operator, admin, worker"))
    }
}

/// What a call needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Open to anyone: health checks, the page's own files, the login form.
    Nothing,
    /// A token of at least this role (`worker` tokens never qualify).
    Role(Role),
    /// A worker's stream: a `worker` token, nothing else.
    WorkerStream,
}

/// An authenticated caller: the token's name, role and app scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub token: String,
    pub role: Role,
    /// `Some(app)`: this token sees and acts on that app's workflows only.
    pub app: Option<String>,
    /// A worker token's scope: the worker ids, apps and labels it may take (`None` for the
    /// other roles).
    pub worker: Option<WorkerScope>,
}

impl Identity {
    /// Whether the caller may see a workflow of `app`.
    pub fn sees_app(&self, app: &str) -> bool {
        self.app.as_deref().is_none_or(|scope| scope == app)
    }
}

/// What a `ControlService` method needs, by its name (`TriggerWorkflow`). An unknown method
/// needs `admin`: a method added to the API is closed until it is listed here.
pub fn control_method_needs(method: &str) -> Need {
    match method {
        "ListWorkflows" | "GetWorkflow" | "ListRuns" | "GetRun" | "WatchRun" | "ListInstances"
        | "GetInstance" | "GetLogs" | "ListWorkers" | "ListNodes" | "GetDag" | "GetGrid"
        | "ExplainWorkflow" | "ListAudit" | "WhoAmI" => Need::Role(Role::Viewer),
        "TriggerWorkflow" | "CancelRun" | "CancelInstance" | "RetryInstance" | "RerunRun"
        | "MarkInstance" | "PauseWorkflow" | "ResumeWorkflow" | "BackfillWorkflow" => {
            Need::Role(Role::Operator)
        }
        // Deleting history is an admin's call, like defining what runs and who may call;
        // deleting a workflow is part of defining what runs.
        "ApplyWorkflow" | "ApplyWorkflows" | "DeleteWorkflow" | "CreateToken" | "ListTokens"
        | "RevokeToken" | "SetSecret" | "ListSecrets" | "DeleteSecret" | "PurgeRuns" => {
            Need::Role(Role::Admin)
        }
        _ => Need::Role(Role::Admin),
    }
}

/// What a request on the node's port needs, by its gRPC path (`/ax.v1.ControlService/GetRun`)
/// or HTTP method and path.
pub fn request_needs(method: &str, path: &str) -> Need {
    if let Some(rpc) = path.strip_prefix("/ax.v1.ControlService/") {
        return control_method_needs(rpc);
    }
    if path == "/ax.v1.WorkerService/Connect" {
        return Need::WorkerStream;
    }
    if path == "/grpc.health.v1.Health/Check" {
        return Need::Nothing;
    }
    if path.starts_with("/grpc.health.v1.Health/") {
        // `Watch` is a stream that never ends: open to anyone, it would hold a connection
        // busy forever (probes use `Check`).
        return Need::Role(Role::Viewer);
    }
    if path.starts_with("/grpc.reflection.") {
        return Need::Role(Role::Viewer);
    }
    if path == "/api/v1/session" {
        // Logging in and out: the token is checked by the handler itself.
        return Need::Nothing;
    }
    if path.starts_with("/api/") || path == "/metrics" {
        return if method == "GET" || method == "HEAD" {
            Need::Role(Role::Viewer)
        } else {
            Need::Role(Role::Operator)
        };
    }
    if path.starts_with("/ax.") || path.starts_with("/grpc.") {
        // Any other gRPC service or method.
        return Need::Role(Role::Admin);
    }
    // The page and its files carry no data; the page asks for a token when the API refuses.
    Need::Nothing
}

/// The shape of a token: `axt_` and 43 URL-safe base64 characters (256 random bits). Checking
/// it first answers a garbled header without a store read.
pub fn is_token_shaped(text: &str) -> bool {
    text.strip_prefix(TOKEN_PREFIX).is_some_and(|rest| {
        rest.len() == 43
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

pub const TOKEN_PREFIX: &str = "axt_";

/// A token's name: what audit rows and `axctl token list` show.
pub fn check_token_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("token name {name:?}: 1 to 64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
    {
        return Err(format!(
            "token name {name:?}: letters, digits and - _ . @ only"
        ));
    }
    Ok(())
}

/// `90d`, `12h`, `30m`: how long a new token lasts, a duration with a unit
/// ([`crate::duration::parse_with_unit`]), more than zero and at most 100 years.
pub fn parse_lifetime_ms(text: &str) -> Result<i64, String> {
    let lifetime =
        crate::duration::parse_with_unit(text).map_err(|err| format!("expiry: {err}"))?;
    let text = text.trim();
    match i64::try_from(lifetime.as_millis()) {
        Ok(0) => Err(format!("expiry {text:?}: must be more than zero")),
        Ok(ms) if ms <= 100 * 365 * 86_400_000 => Ok(ms),
        _ => Err(format!("expiry {text:?}: at most 100 years")),
    }
}

/// Counts failed authentications per address. Past `limit` failures within `window_ms`, the
/// address is refused without a look at its token until the window has passed since its
/// last failure, so a token cannot be guessed by volume and the audit trail is not flooded.
#[derive(Debug)]
pub struct FailureThrottle {
    limit: u32,
    window_ms: Millis,
    by_address: HashMap<IpAddr, Failures>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Millis,
}

/// The throttle's answer about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Throttled {
    No,
    /// Refused for this long still.
    For(Millis),
}

impl FailureThrottle {
    pub fn new(limit: u32, window_ms: Millis) -> Self {
        FailureThrottle {
            limit,
            window_ms,
            by_address: HashMap::new(),
        }
    }

    /// Whether `address` is refused at `now`.
    pub fn check(&self, address: IpAddr, now: Millis) -> Throttled {
        match self.by_address.get(&address) {
            Some(failures) if failures.count >= self.limit => {
                let until = failures.last + self.window_ms;
                if now < until {
                    Throttled::For(until - now)
                } else {
                    Throttled::No
                }
            }
            _ => Throttled::No,
        }
    }

    /// Records a failure; answers whether it is the one that starts the refusal.
    pub fn fail(&mut self, address: IpAddr, now: Millis) -> bool {
        let window = self.window_ms;
        let failures = self.by_address.entry(address).or_insert(Failures {
            count: 0,
            last: now,
        });
        if now - failures.last >= window {
            failures.count = 0;
        }
        failures.count += 1;
        failures.last = now;
        // Addresses whose window has passed are forgotten, so the map stays the size of the
        // current attack, not of its history.
        if self.by_address.len() > 10_000 {
            self.by_address.retain(|_, f| now - f.last < window);
        }
        self.by_address
            .get(&address)
            .is_some_and(|f| f.count == self.limit)
    }

    /// A success from `address` clears its count.
    pub fn succeed(&mut self, address: IpAddr) {
        self.by_address.remove(&address);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_includes_the_ones_below_it_and_only_worker_holds_a_stream() {
        use Role::{Admin, Operator, Viewer, Worker};
        let table = [
            // (role, nothing, viewer, operator, admin, worker stream)
            (Viewer, true, true, false, false, false),
            (Operator, true, true, true, false, false),
            (Admin, true, true, true, true, false),
            (Worker, true, false, false, false, true),
        ];
        for (role, nothing, viewer, operator, admin, stream) in table {
            assert_eq!(role.allows(Need::Nothing), nothing, "{role} nothing");
            assert_eq!(role.allows(Need::Role(Viewer)), viewer, "{role} viewer");
            assert_eq!(role.allows(Need::Role(Operator)), operator, "{role} op");
            assert_eq!(role.allows(Need::Role(Admin)), admin, "{role} admin");
            assert_eq!(role.allows(Need::WorkerStream), stream, "{role} stream");
        }
    }

    #[test]
    fn paths_map_to_what_they_need() {
        let cases = [
            (
                "POST",
                "/ax.v1.ControlService/ApplyWorkflow",
                Need::Role(Role::Admin),
            ),
            (
                "POST",
                "/ax.v1.ControlService/ApplyWorkflows",
                Need::Role(Role::Admin),
            ),
            (
                "POST",
                "/ax.v1.ControlService/DeleteWorkflow",
                Need::Role(Role::Admin),
            ),
            (
                "POST",
                "/ax.v1.ControlService/CreateToken",
                Need::Role(Role::Admin),
            ),
            (
                "POST",
                "/ax.v1.ControlService/SetSecret",
                Need::Role(Role::Admin),
            ),
            (
                "POST",
                "/ax.v1.ControlService/PurgeRuns",
                Need::Role(Role::Admin),
            ),
            (
                "POST",
                "/ax.v1.ControlService/NotYetListed",
                Need::Role(Role::Admin),
            ),
            (
                "POST",
                "/ax.v1.ControlService/TriggerWorkflow",
                Need::Role(Role::Operator),
            ),
            (
                "POST",
                "/ax.v1.ControlService/BackfillWorkflow",
                Need::Role(Role::Operator),
            ),
            (
                "POST",
                "/ax.v1.ControlService/GetLogs",
                Need::Role(Role::Viewer),
            ),
            (
                "POST",
                "/ax.v1.ControlService/MarkInstance",
                Need::Role(Role::Operator),
            ),
            ("POST", "/ax.v1.WorkerService/Connect", Need::WorkerStream),
            ("POST", "/grpc.health.v1.Health/Check", Need::Nothing),
            (
                "POST",
                "/grpc.health.v1.Health/Watch",
                Need::Role(Role::Viewer),
            ),
            (
                "POST",
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                Need::Role(Role::Viewer),
            ),
            ("POST", "/ax.v2.Other/Call", Need::Role(Role::Admin)),
            ("GET", "/api/v1/runs", Need::Role(Role::Viewer)),
            (
                "GET",
                "/api/v1/workflows/etl/grid",
                Need::Role(Role::Viewer),
            ),
            (
                "GET",
                "/api/v1/workflows/etl/grid/events",
                Need::Role(Role::Viewer),
            ),
            (
                "POST",
                "/ax.v1.ControlService/GetGrid",
                Need::Role(Role::Viewer),
            ),
            (
                "POST",
                "/api/v1/workflows/etl/trigger",
                Need::Role(Role::Operator),
            ),
            (
                "POST",
                "/api/v1/workflows/etl/backfill",
                Need::Role(Role::Operator),
            ),
            ("POST", "/api/v1/session", Need::Nothing),
            (
                "POST",
                "/api/v1/instances/7/mark",
                Need::Role(Role::Operator),
            ),
            ("GET", "/metrics", Need::Role(Role::Viewer)),
            ("GET", "/", Need::Nothing),
            ("GET", "/runs/12", Need::Nothing),
            ("GET", "/assets/app.js", Need::Nothing),
        ];
        for (method, path, need) in cases {
            assert_eq!(request_needs(method, path), need, "{method} {path}");
        }
    }

    #[test]
    fn a_scoped_identity_sees_its_app_only() {
        let scoped = Identity {
            token: "ci".into(),
            role: Role::Operator,
            app: Some("sales".into()),
            worker: None,
        };
        assert!(scoped.sees_app("sales"));
        assert!(!scoped.sees_app("finance"));
        let whole = Identity {
            app: None,
            ..scoped
        };
        assert!(whole.sees_app("finance"));
    }

    #[test]
    fn token_shapes_names_and_lifetimes() {
        let good = format!("axt_{}", "a".repeat(43));
        assert!(is_token_shaped(&good));
        assert!(!is_token_shaped(&format!("axt_{}", "a".repeat(42))));
        assert!(!is_token_shaped(&format!("axt_{}!", "a".repeat(42))));
        assert!(!is_token_shaped(&format!("xxx_{}", "a".repeat(43))));
        assert!(check_token_name("ci-bot@sales").is_ok());
        assert!(check_token_name("").is_err());
        assert!(check_token_name("has space").is_err());
        assert_eq!(parse_lifetime_ms("90d"), Ok(90 * 86_400_000));
        assert_eq!(parse_lifetime_ms("12h"), Ok(12 * 3_600_000));
        assert!(
            parse_lifetime_ms("0d")
                .unwrap_err()
                .contains("more than zero")
        );
        assert_eq!(parse_lifetime_ms("+30m"), Ok(30 * 60_000));
        assert_eq!(parse_lifetime_ms("1.5h"), Ok(90 * 60_000));
        assert!(parse_lifetime_ms("soon").unwrap_err().contains("90d"));
        assert!(parse_lifetime_ms("90").unwrap_err().contains("no unit"));
        assert!(
            parse_lifetime_ms("99999d")
                .unwrap_err()
                .contains("100 years")
        );
        assert_eq!(
            "auditor".parse::<Role>().unwrap_err(),
            "role \"auditor\" is not one of viewer, operator, admin, worker"
        );
    }

    #[test]
    fn the_throttle_refuses_an_address_past_its_limit_until_the_window_passes() {
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let mut throttle = FailureThrottle::new(3, 60_000);
        assert!(!throttle.fail(a, 0));
        assert!(!throttle.fail(a, 10));
        assert_eq!(throttle.check(a, 20), Throttled::No);
        assert!(throttle.fail(a, 20), "the third failure starts the refusal");
        assert_eq!(throttle.check(a, 30), Throttled::For(59_990));
        assert_eq!(
            throttle.check(b, 30),
            Throttled::No,
            "other addresses are not refused"
        );
        assert_eq!(throttle.check(a, 60_020), Throttled::No);
        // After the window, the count starts again.
        assert!(!throttle.fail(a, 60_020));
        assert_eq!(throttle.check(a, 60_030), Throttled::No);
        throttle.fail(b, 0);
        throttle.succeed(b);
        throttle.fail(b, 1);
        throttle.fail(b, 2);
        assert_eq!(
            throttle.check(b, 3),
            Throttled::No,
            "a success cleared b's count"
        );
    }
}
