//! What a request that a browser may have sent needs before the node acts on it.
//!
//! A node runs shell commands on its workers, so a web page that makes an operator's browser
//! call it is an attacker with the operator's rights. A browser attaches two kinds of ambient
//! authority that the page does not choose: the session cookie, and the network position of
//! the operator's machine (a node on loopback with no tokens trusts whoever reaches it). Three
//! rules keep both out of a foreign page's reach:
//!
//! - **Host**: the request must name the node by a name it answers to (an IP literal,
//!   `localhost`, its own names, a configured public URL). A DNS-rebinding page talks to the
//!   node under the attacker's name and is refused, so it can neither act nor read answers. A
//!   request that carries its own token in `Authorization` (with tokens on) is not a browser's
//!   ambient request and may name the node however its network does.
//! - **gRPC is for gRPC clients**: a gRPC path answers only `application/grpc` bodies and never
//!   reads the cookie. A browser cannot send that content type to another origin without a
//!   preflight, which the node never grants.
//! - **The JSON API and its event streams are same-origin only** when they act on ambient
//!   authority: a browser's `Origin` (or, where it sends none, `Sec-Fetch-Site`) must name the
//!   node's own origin, and a state-changing request must also carry `Content-Type:
//!   application/json` or the `X-Ax-Request` header, which no form and no `no-cors` fetch can
//!   send. Clients that are not browsers send neither header and are unaffected.
//!
//! The page itself and its files carry no data and are served to any origin (under the Host
//! rule), with headers that forbid framing.

use std::fmt;
use std::net::IpAddr;

/// The header the web UI adds to every request it makes; a cross-origin page cannot add it
/// without a preflight.
pub const REQUEST_HEADER: &str = "x-ax-request";

/// The names and origins a node answers to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeNames {
    /// Host names (lowercase, without port) besides IP literals and `localhost`.
    hosts: Vec<String>,
    /// Origins (`https://ax.example.com`) of the public URLs a proxy serves the node at.
    origins: Vec<String>,
}

impl NodeNames {
    /// `names`: the node's own names (its id, the machine's host name, the host of its
    /// advertised address); `public_urls`: where a proxy serves it (`https://ax.example.com`,
    /// or a bare `ax.example.com`).
    pub fn new<'a>(
        names: impl IntoIterator<Item = &'a str>,
        public_urls: &[String],
    ) -> Result<NodeNames, String> {
        let mut hosts: Vec<String> = Vec::new();
        let mut origins = Vec::new();
        for name in names {
            let host = host_of_authority(name.trim()).to_ascii_lowercase();
            if !host.is_empty() && !hosts.contains(&host) {
                hosts.push(host);
            }
        }
        for url in public_urls {
            let (origin, host) = parse_public_url(url)?;
            if let Some(origin) = origin
                && !origins.contains(&origin)
            {
                origins.push(origin);
            }
            if !hosts.contains(&host) {
                hosts.push(host);
            }
        }
        Ok(NodeNames { hosts, origins })
    }

    /// Whether `authority` (a `Host` header: `name`, `name:port`, `[::1]:7070`) names this
    /// node. IP literals always do: a rebinding page needs a name of its own.
    pub fn answers_to(&self, authority: &str) -> bool {
        let host = host_of_authority(authority.trim());
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() {
            return true;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        host == "localhost" || self.hosts.contains(&host)
    }

    fn is_public_origin(&self, origin: &str) -> bool {
        self.origins.iter().any(|known| known == origin)
    }
}

/// `https://ax.example.com[:443][/path]` → (`Some("https://ax.example.com")`, host);
/// `ax.example.com[:port]` → (`None`, host).
fn parse_public_url(url: &str) -> Result<(Option<String>, String), String> {
    let url = url.trim();
    let invalid = |why: &str| format!("public URL {url:?}: {why}");
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
        None => (None, url),
    };
    if let Some(scheme) = &scheme
        && scheme != "http"
        && scheme != "https"
    {
        return Err(invalid(
            "expected an http:// or https:// URL, or a host name",
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(invalid("a URL with a user name or password"));
    }
    let host = host_of_authority(authority).to_ascii_lowercase();
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b))
    {
        return Err(invalid("expected a host name"));
    }
    let origin = scheme.map(|scheme| normalized_origin(&scheme, &authority.to_ascii_lowercase()));
    Ok((origin, host))
}

/// The host part of an authority, without its port.
fn host_of_authority(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.rsplit_once(':') {
        // One colon: `name:port`. More: a bare IPv6 address, no port.
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => authority,
    }
}

/// `scheme://authority`, with the scheme's default port left out (as browsers send `Origin`).
fn normalized_origin(scheme: &str, authority: &str) -> String {
    let default_port = if scheme == "https" { ":443" } else { ":80" };
    let authority = authority.strip_suffix(default_port).unwrap_or(authority);
    format!("{scheme}://{authority}")
}

/// What a request is, as far as the rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A gRPC method (`/ax.…`, `/grpc.…`).
    Grpc,
    /// The JSON API, its event streams and `/metrics`: data, and actions.
    Api,
    /// The page and its files.
    Page,
}

impl Kind {
    pub fn of_path(path: &str) -> Kind {
        if path.starts_with("/ax.") || path.starts_with("/grpc.") {
            Kind::Grpc
        } else if path.starts_with("/api/") || path == "/api" || path == "/metrics" {
            Kind::Api
        } else {
            Kind::Page
        }
    }
}

/// The facts of one request the rules look at (headers as sent, absent when not sent).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestFacts<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// `Host`, or the HTTP/2 `:authority`.
    pub host: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub fetch_site: Option<&'a str>,
    /// The web UI's [`REQUEST_HEADER`] is present.
    pub request_header: bool,
    /// An `Authorization` header is present.
    pub authorization: bool,
    /// The connection is TLS (the node's own origin is `https://…`).
    pub tls: bool,
}

/// Whether a request may go on, and whether it may authenticate with the session cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow { cookie: bool },
    Refuse(Refusal),
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The `Host` names something the node does not answer to (DNS rebinding, or a proxy not
    /// configured as a public URL).
    UnknownHost(String),
    /// A gRPC path asked with a body that is not gRPC.
    NotGrpc(String),
    /// A browser request from another origin.
    CrossOrigin(String),
    /// A state-changing browser request a form or a `no-cors` fetch could have sent.
    NoRequestHeader,
}

impl Refusal {
    /// The HTTP status the refusal is answered with.
    pub fn http_status(&self) -> u16 {
        match self {
            Refusal::NotGrpc(_) => 415,
            _ => 403,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::UnknownHost(host) => write!(
                f,
                "Host {host:?} is not a name this node answers to; if a proxy or DNS name \
                 serves it, add that URL with --public-url (AX_PUBLIC_URL)"
            ),
            Refusal::NotGrpc(content_type) => write!(
                f,
                "this is a gRPC method: it takes Content-Type application/grpc, not \
                 {content_type:?}"
            ),
            Refusal::CrossOrigin(origin) => write!(
                f,
                "a request from {origin} may not use this node's session or network \
                 position; send a token in the Authorization header, or add the URL the page \
                 is served at with --public-url (AX_PUBLIC_URL)"
            ),
            Refusal::NoRequestHeader => write!(
                f,
                "a browser's state-changing request needs Content-Type application/json or \
                 the {REQUEST_HEADER} header"
            ),
        }
    }
}

/// Judges a request. `tokens`: the node asks callers for tokens (without them, every request
/// acts on the network position alone, which is ambient authority too).
pub fn judge(facts: &RequestFacts<'_>, names: &NodeNames, tokens: bool) -> Verdict {
    let carries_token = tokens && facts.authorization;
    if !carries_token
        && let Some(host) = facts.host
        && !names.answers_to(host)
    {
        return Verdict::Refuse(Refusal::UnknownHost(host.to_string()));
    }
    match Kind::of_path(facts.path) {
        Kind::Grpc => {
            let content_type = facts.content_type.unwrap_or("");
            if !is_grpc(content_type) {
                return Verdict::Refuse(Refusal::NotGrpc(content_type.to_string()));
            }
            // No gRPC client sends Origin; a browser does, and never gets to act.
            if let Some(origin) = facts.origin
                && !is_own_origin(origin, facts, names)
            {
                return Verdict::Refuse(Refusal::CrossOrigin(origin.to_string()));
            }
            Verdict::Allow { cookie: false }
        }
        Kind::Api => {
            if facts.authorization {
                return Verdict::Allow { cookie: false };
            }
            let safe = matches!(facts.method, "GET" | "HEAD" | "OPTIONS");
            match (facts.origin, facts.fetch_site) {
                (Some(origin), _) if !is_own_origin(origin, facts, names) => {
                    return Verdict::Refuse(Refusal::CrossOrigin(origin.to_string()));
                }
                (Some(_), _) => {}
                // A browser's own navigation (the address bar, a bookmark) says `none`.
                (None, Some(site)) if site == "same-origin" || (safe && site == "none") => {}
                (None, Some(site)) => {
                    return Verdict::Refuse(Refusal::CrossOrigin(format!(
                        "a {site} page (Sec-Fetch-Site)"
                    )));
                }
                // Neither header: not a browser (curl, a script), or one too old to tell.
                (None, None) => {}
            }
            if !safe && !facts.request_header && !is_json(facts.content_type.unwrap_or("")) {
                return Verdict::Refuse(Refusal::NoRequestHeader);
            }
            Verdict::Allow { cookie: true }
        }
        Kind::Page => Verdict::Allow { cookie: false },
    }
}

/// `application/grpc`, `application/grpc+proto`, `application/grpc; …` (not gRPC-Web, which
/// the node does not serve).
pub fn is_grpc(content_type: &str) -> bool {
    let lower = content_type.trim().to_ascii_lowercase();
    match lower.strip_prefix("application/grpc") {
        Some(rest) => rest.is_empty() || rest.starts_with('+') || rest.starts_with(';'),
        None => false,
    }
}

fn is_json(content_type: &str) -> bool {
    let lower = content_type.trim().to_ascii_lowercase();
    match lower.strip_prefix("application/json") {
        Some(rest) => rest.is_empty() || rest.starts_with(';') || rest.starts_with(' '),
        None => false,
    }
}

/// Whether `origin` is the node's own: the scheme of the connection with the host the request
/// names, or a configured public URL's.
fn is_own_origin(origin: &str, facts: &RequestFacts<'_>, names: &NodeNames) -> bool {
    let origin = origin.trim().to_ascii_lowercase();
    if names.is_public_origin(&origin) {
        return true;
    }
    let Some(host) = facts.host else {
        return false;
    };
    let scheme = if facts.tls { "https" } else { "http" };
    origin == normalized_origin(scheme, &host.trim().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> NodeNames {
        NodeNames::new(
            ["sched-1", "sched-1.internal:7070"],
            &["https://ax.example.com".to_string()],
        )
        .expect("names")
    }

    fn api<'a>(method: &'a str, host: &'a str) -> RequestFacts<'a> {
        RequestFacts {
            method,
            path: "/api/v1/workflows/w/trigger",
            host: Some(host),
            ..RequestFacts::default()
        }
    }

    fn refused(verdict: Verdict) -> Refusal {
        match verdict {
            Verdict::Refuse(refusal) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_node_answers_to_ip_literals_localhost_its_names_and_public_urls_only() {
        let names = names();
        for host in [
            "127.0.0.1:7070",
            "127.0.0.1",
            "[::1]:7070",
            "::1",
            "10.1.2.3:7070",
            "localhost:7070",
            "LOCALHOST",
            "localhost.:7070",
            "sched-1:7070",
            "Sched-1.Internal",
            "ax.example.com",
            "ax.example.com:8443",
        ] {
            assert!(names.answers_to(host), "{host}");
        }
        for host in [
            "attacker.example:7070",
            "127.0.0.1.nip.io:7070",
            "evil.localhost:7070",
            "sched-10:7070",
            "",
        ] {
            assert!(!names.answers_to(host), "{host}");
        }
    }

    #[test]
    fn public_urls_must_be_http_urls_or_host_names() {
        for bad in ["ftp://x", "https://user:pw@x", "https://", "a b"] {
            assert!(NodeNames::new([], &[bad.to_string()]).is_err(), "{bad}");
        }
        let names = NodeNames::new([], &["https://ax.example.com:443/ui/".to_string()])
            .expect("a URL with a default port and a path");
        assert_eq!(names.origins, vec!["https://ax.example.com".to_string()]);
        assert_eq!(names.hosts, vec!["ax.example.com".to_string()]);
    }

    #[test]
    fn a_rebinding_host_is_refused_with_or_without_tokens_unless_a_token_is_presented() {
        let names = names();
        let facts = RequestFacts {
            method: "GET",
            path: "/api/v1/workflows",
            host: Some("attacker.example:7070"),
            ..RequestFacts::default()
        };
        for tokens in [false, true] {
            let refusal = refused(judge(&facts, &names, tokens));
            assert_eq!(refusal.http_status(), 403);
            assert!(refusal.to_string().contains("--public-url"), "{refusal}");
        }
        let page = RequestFacts { path: "/", ..facts };
        assert!(matches!(
            judge(&page, &names, false),
            Verdict::Refuse(Refusal::UnknownHost(_))
        ));
        let with_token = RequestFacts {
            authorization: true,
            ..facts
        };
        assert_eq!(
            judge(&with_token, &names, true),
            Verdict::Allow { cookie: false }
        );
        // With tokens off an Authorization header proves nothing.
        assert!(matches!(
            judge(&with_token, &names, false),
            Verdict::Refuse(Refusal::UnknownHost(_))
        ));
    }

    #[test]
    fn grpc_paths_take_only_grpc_bodies_and_never_the_cookie() {
        let names = names();
        let grpc = |content_type: Option<&'static str>, origin: Option<&'static str>| {
            judge(
                &RequestFacts {
                    method: "POST",
                    path: "/ax.v1.ControlService/ApplyWorkflow",
                    host: Some("127.0.0.1:7070"),
                    content_type,
                    origin,
                    ..RequestFacts::default()
                },
                &names,
                true,
            )
        };
        for ok in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc; charset=utf-8",
        ] {
            assert_eq!(
                grpc(Some(ok), None),
                Verdict::Allow { cookie: false },
                "{ok}"
            );
        }
        for bad in [
            None,
            Some("text/plain"),
            Some("application/grpc-web"),
            Some("application/grpc-web-text"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
        ] {
            let refusal = refused(grpc(bad, None));
            assert_eq!(refusal.http_status(), 415, "{bad:?}");
        }
        assert!(matches!(
            grpc(Some("application/grpc"), Some("http://127.0.0.1:9999")),
            Verdict::Refuse(Refusal::CrossOrigin(_))
        ));
        assert_eq!(
            grpc(Some("application/grpc"), Some("http://127.0.0.1:7070")),
            Verdict::Allow { cookie: false }
        );
    }

    #[test]
    fn the_api_acts_on_ambient_authority_for_its_own_origin_only() {
        let names = names();
        let host = "127.0.0.1:7070";
        let own = RequestFacts {
            origin: Some("http://127.0.0.1:7070"),
            content_type: Some("application/json"),
            ..api("POST", host)
        };
        assert_eq!(judge(&own, &names, true), Verdict::Allow { cookie: true });
        assert_eq!(judge(&own, &names, false), Verdict::Allow { cookie: true });

        for origin in [
            "http://127.0.0.1:9999",
            "http://localhost:7070",
            "https://127.0.0.1:7070",
            "null",
            "http://attacker.example",
        ] {
            let facts = RequestFacts {
                origin: Some(origin),
                ..own
            };
            for tokens in [false, true] {
                assert!(
                    matches!(
                        judge(&facts, &names, tokens),
                        Verdict::Refuse(Refusal::CrossOrigin(_))
                    ),
                    "{origin}"
                );
            }
        }
        // Over TLS the own origin is https; behind a proxy, the public URL's.
        let tls = RequestFacts {
            origin: Some("https://127.0.0.1:7070"),
            tls: true,
            ..own
        };
        assert_eq!(judge(&tls, &names, true), Verdict::Allow { cookie: true });
        let proxied = RequestFacts {
            origin: Some("https://ax.example.com"),
            host: Some("ax.example.com"),
            ..own
        };
        assert_eq!(
            judge(&proxied, &names, true),
            Verdict::Allow { cookie: true }
        );
        // The default port is implied by the origin.
        let port_80 = RequestFacts {
            origin: Some("http://localhost"),
            host: Some("localhost:80"),
            ..own
        };
        assert_eq!(
            judge(&port_80, &names, true),
            Verdict::Allow { cookie: true }
        );
    }

    #[test]
    fn without_origin_the_fetch_site_decides_and_neither_means_not_a_browser() {
        let names = names();
        let host = "127.0.0.1:7070";
        let site = |method, site: Option<&'static str>| {
            judge(
                &RequestFacts {
                    fetch_site: site,
                    content_type: Some("application/json"),
                    ..api(method, host)
                },
                &names,
                true,
            )
        };
        assert_eq!(
            site("GET", Some("same-origin")),
            Verdict::Allow { cookie: true }
        );
        assert_eq!(site("GET", Some("none")), Verdict::Allow { cookie: true });
        assert_eq!(
            site("POST", Some("same-origin")),
            Verdict::Allow { cookie: true }
        );
        for (method, fetch_site) in [
            ("GET", "same-site"),
            ("GET", "cross-site"),
            ("POST", "none"),
            ("POST", "same-site"),
        ] {
            assert!(
                matches!(
                    site(method, Some(fetch_site)),
                    Verdict::Refuse(Refusal::CrossOrigin(_))
                ),
                "{method} {fetch_site}"
            );
        }
        assert_eq!(site("POST", None), Verdict::Allow { cookie: true });
    }

    #[test]
    fn a_state_changing_request_needs_json_or_the_request_header() {
        let names = names();
        let host = "127.0.0.1:7070";
        let post = |content_type: Option<&'static str>, request_header: bool| {
            judge(
                &RequestFacts {
                    content_type,
                    request_header,
                    fetch_site: Some("same-origin"),
                    ..api("POST", host)
                },
                &names,
                false,
            )
        };
        for form in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonp"),
        ] {
            assert_eq!(
                post(form, false),
                Verdict::Refuse(Refusal::NoRequestHeader),
                "{form:?}"
            );
        }
        assert_eq!(
            post(Some("application/json; charset=utf-8"), false),
            Verdict::Allow { cookie: true }
        );
        assert_eq!(post(None, true), Verdict::Allow { cookie: true });
        let delete = RequestFacts {
            method: "DELETE",
            fetch_site: Some("same-origin"),
            ..api("DELETE", host)
        };
        assert_eq!(
            judge(&delete, &names, true),
            Verdict::Refuse(Refusal::NoRequestHeader)
        );
    }

    #[test]
    fn a_request_with_its_own_token_needs_no_origin() {
        let names = names();
        let facts = RequestFacts {
            origin: Some("http://127.0.0.1:9999"),
            content_type: Some("text/plain"),
            authorization: true,
            ..api("POST", "127.0.0.1:7070")
        };
        assert_eq!(
            judge(&facts, &names, true),
            Verdict::Allow { cookie: false }
        );
    }

    #[test]
    fn pages_are_served_to_anyone_who_names_the_node() {
        let names = names();
        let facts = RequestFacts {
            method: "GET",
            path: "/workflows/x",
            host: Some("localhost:7070"),
            origin: Some("http://127.0.0.1:9999"),
            ..RequestFacts::default()
        };
        assert_eq!(
            judge(&facts, &names, true),
            Verdict::Allow { cookie: false }
        );
        assert_eq!(Kind::of_path("/metrics"), Kind::Api);
        assert_eq!(Kind::of_path("/grpc.health.v1.Health/Check"), Kind::Grpc);
        assert_eq!(Kind::of_path("/assets/app.js"), Kind::Page);
    }
}
