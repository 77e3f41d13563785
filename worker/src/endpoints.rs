//! The scheduler endpoints a worker knows, as the addresses it dials in turn.
//!
//! Each configured endpoint (`http://host:port`) counts as every address its host resolves to,
//! so one DNS name in front of several nodes spreads workers as a list of the nodes would. The
//! names are resolved again at the start of every pass over the addresses, so a changed record
//! is followed; a name that does not resolve is skipped for that pass with a warning (and, for
//! self-fencing, proves nothing: see `fence`). Addresses of one name are sorted, and an address
//! listed twice is dialed once, so the order does not depend on the resolver's shuffling.
//!
//! Workers started with the same list begin at different places in it: the first address is
//! chosen by a hash of the worker id, so a fleet spreads over the nodes from its start and a
//! restarted worker goes back where it was. After that the worker goes round the list, one
//! address per broken stream. A node that asks the worker to move (`MoveElsewhere`) names where;
//! the worker goes there only when it is one of its own addresses ([`Rotation::after_move`]).

use std::fmt::Debug;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tonic::codegen::http::Uri;

/// What a resolution of one host name gives.
pub type Resolution<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Turns an endpoint's host and port into the addresses to dial. The system's resolver
/// ([`SystemResolver`]) unless the embedding program brings its own (service discovery, tests).
pub trait Resolve: Debug + Send + Sync {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolution<'a>;
}

/// `getaddrinfo`, through tokio: `/etc/hosts`, then DNS. An IP address resolves to itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolution<'a> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// A configured endpoint that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid scheduler endpoint {endpoint:?}: {reason} (expected http://host:port)")]
pub struct EndpointError {
    pub endpoint: String,
    pub reason: String,
}

/// A configured endpoint: scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    text: String,
    scheme: String,
    host: String,
    port: u16,
}

impl Endpoint {
    pub(crate) fn parse(text: &str) -> Result<Endpoint, EndpointError> {
        let error = |reason: &str| EndpointError {
            endpoint: text.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = text.trim().parse().map_err(|_| error("not a URL"))?;
        let scheme = match uri.scheme_str() {
            Some(scheme @ ("http" | "https")) => scheme.to_string(),
            Some(_) => return Err(error("the scheme must be http or https")),
            None => return Err(error("no scheme")),
        };
        let host = uri
            .host()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| error("no host"))?;
        // An IPv6 literal comes bracketed, as URLs write it; the resolver takes it bare.
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        Ok(Endpoint {
            text: text.trim().to_string(),
            scheme,
            host,
            port,
        })
    }
}

/// One address to dial, and the URL the connection is made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) address: SocketAddr,
    pub(crate) url: String,
    /// The host name the endpoint was given with: what a node's TLS certificate must name,
    /// whichever of its addresses is dialed.
    pub(crate) host: String,
}

/// The addresses of one pass over the endpoints.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) targets: Vec<Target>,
    /// Endpoints that resolved to nothing this pass.
    pub(crate) unresolved: Vec<String>,
}

/// Resolves every endpoint, in the configured order; a failure is logged and skips that
/// endpoint.
pub(crate) async fn resolve_all(endpoints: &[Endpoint], resolver: &dyn Resolve) -> Resolved {
    let mut resolved = Resolved::default();
    for endpoint in endpoints {
        let mut addresses = match resolver.resolve(&endpoint.host, endpoint.port).await {
            Ok(addresses) => addresses,
            Err(error) => {
                tracing::warn!(endpoint = %endpoint.text, %error, "the scheduler endpoint does not resolve; skipping it this pass");
                resolved.unresolved.push(endpoint.text.clone());
                continue;
            }
        };
        if addresses.is_empty() {
            tracing::warn!(endpoint = %endpoint.text, "the scheduler endpoint resolves to no address; skipping it this pass");
            resolved.unresolved.push(endpoint.text.clone());
            continue;
        }
        addresses.sort();
        addresses.dedup();
        for address in addresses {
            if resolved.targets.iter().any(|t| t.address == address) {
                continue;
            }
            resolved.targets.push(Target {
                address,
                url: format!("{}://{address}", endpoint.scheme),
                host: endpoint.host.clone(),
            });
        }
    }
    resolved
}

/// Where a worker with this id starts in a list of `len` addresses: FNV-1a of the id, so the
/// choice is stable across restarts and spreads a fleet whose ids differ anyhow.
pub fn first_index(worker_id: &str, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in worker_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % len as u64) as usize
}

/// The worker's way round its addresses.
#[derive(Debug)]
pub(crate) struct Rotation {
    endpoints: Vec<Endpoint>,
    resolver: Arc<dyn Resolve>,
    worker_id: String,
    resolved: Resolved,
    /// Bumped at every resolution, so the fence judges the latest list.
    generation: u64,
    /// Index in `resolved.targets` of the next address to dial.
    next: usize,
    /// Addresses still to dial before the names are resolved again.
    left_in_pass: usize,
    /// The address dialed last.
    current: Option<SocketAddr>,
}

impl Rotation {
    pub(crate) fn new(
        endpoints: Vec<Endpoint>,
        resolver: Arc<dyn Resolve>,
        worker_id: &str,
    ) -> Rotation {
        Rotation {
            endpoints,
            resolver,
            worker_id: worker_id.to_string(),
            resolved: Resolved::default(),
            generation: 0,
            next: 0,
            left_in_pass: 0,
            current: None,
        }
    }

    /// The addresses of the latest pass, and the endpoints that did not resolve in it.
    pub(crate) fn resolved(&self) -> &Resolved {
        &self.resolved
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Addresses in the latest pass.
    pub(crate) fn len(&self) -> usize {
        self.resolved.targets.len()
    }

    /// The next address to dial, resolving the names again when a pass is over; `None` when
    /// nothing resolves (the next call tries again).
    pub(crate) async fn next(&mut self) -> Option<Target> {
        if self.left_in_pass == 0 {
            self.resolve().await;
        }
        let len = self.resolved.targets.len();
        if len == 0 {
            return None;
        }
        let target = self.resolved.targets[self.next % len].clone();
        self.next = (self.next + 1) % len;
        self.left_in_pass -= 1;
        self.current = Some(target.address);
        Some(target)
    }

    /// A node asked this worker to move, naming `to_address`: a new pass starts with that
    /// address when it is one of the worker's own (it resolves to one of them, or is written as
    /// one of the endpoints), else with the address after the one just left. Returns whether
    /// `to_address` was found.
    pub(crate) async fn after_move(&mut self, to_address: &str) -> bool {
        self.resolve().await;
        let named = self.find(to_address).await;
        if let Some(index) = named {
            self.next = index;
        }
        named.is_some()
    }

    async fn find(&self, to_address: &str) -> Option<usize> {
        let to_address = to_address.trim().trim_end_matches('/');
        if to_address.is_empty() {
            return None;
        }
        let targets = &self.resolved.targets;
        if let Some(index) = targets.iter().position(|t| t.url == to_address) {
            return Some(index);
        }
        // The address is used only to find one of the worker's own: a node cannot make the
        // worker dial anywhere else.
        let endpoint = Endpoint::parse(to_address).ok()?;
        let addresses = self
            .resolver
            .resolve(&endpoint.host, endpoint.port)
            .await
            .ok()?;
        targets
            .iter()
            .position(|target| addresses.contains(&target.address))
    }

    async fn resolve(&mut self) {
        self.resolved = resolve_all(&self.endpoints, self.resolver.as_ref()).await;
        self.generation += 1;
        let targets = &self.resolved.targets;
        self.left_in_pass = targets.len();
        if targets.is_empty() {
            return;
        }
        self.next = match self.current {
            // The first pass starts where this worker's id says.
            None => first_index(&self.worker_id, targets.len()),
            // Later passes go on after the address dialed last, wherever it is now.
            Some(current) => match targets.iter().position(|t| t.address == current) {
                Some(index) => (index + 1) % targets.len(),
                None => self.next % targets.len(),
            },
        };
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    /// Answers from a table the test changes; a name not in it does not resolve.
    #[derive(Debug, Default)]
    struct TableResolver(Mutex<HashMap<String, Vec<SocketAddr>>>);

    impl TableResolver {
        fn set(&self, host: &str, addresses: &[&str]) {
            let addresses = addresses
                .iter()
                .map(|a| a.parse().expect("address"))
                .collect();
            self.0
                .lock()
                .expect("table")
                .insert(host.to_string(), addresses);
        }
    }

    impl Resolve for TableResolver {
        fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> Resolution<'a> {
            let found = self.0.lock().expect("table").get(host).cloned();
            Box::pin(async move {
                found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such host"))
            })
        }
    }

    fn endpoints(texts: &[&str]) -> Vec<Endpoint> {
        texts
            .iter()
            .map(|text| Endpoint::parse(text).expect("endpoint"))
            .collect()
    }

    fn urls(resolved: &Resolved) -> Vec<&str> {
        resolved.targets.iter().map(|t| t.url.as_str()).collect()
    }

    #[test]
    fn endpoints_parse_with_their_ports_and_bad_ones_say_why() {
        let parsed = Endpoint::parse("http://sched-1:7070").expect("valid");
        assert_eq!((parsed.host.as_str(), parsed.port), ("sched-1", 7070));
        let parsed = Endpoint::parse("http://[::1]:7070").expect("IPv6");
        assert_eq!((parsed.host.as_str(), parsed.port), ("::1", 7070));
        assert_eq!(Endpoint::parse("https://sched").expect("https").port, 443);
        assert_eq!(Endpoint::parse("http://sched").expect("http").port, 80);
        for (text, says) in [
            ("sched-1:7070", "scheme"),
            ("ftp://sched-1:21", "http or https"),
            ("not a url", "not a URL"),
        ] {
            let error = Endpoint::parse(text).expect_err(text).to_string();
            assert!(error.contains(says) && error.contains(text), "{error}");
        }
    }

    #[tokio::test]
    async fn a_name_counts_as_each_of_its_addresses_sorted_once_each() {
        let resolver = TableResolver::default();
        resolver.set(
            "cluster",
            &["10.0.0.3:7070", "10.0.0.1:7070", "[fd00::2]:7070"],
        );
        resolver.set("node-1", &["10.0.0.1:7070"]);
        let resolved = resolve_all(
            &endpoints(&[
                "http://cluster:7070",
                "http://node-1:7070",
                "http://gone:7070",
            ]),
            &resolver,
        )
        .await;
        assert_eq!(
            urls(&resolved),
            [
                "http://10.0.0.1:7070",
                "http://10.0.0.3:7070",
                "http://[fd00::2]:7070"
            ]
        );
        assert_eq!(resolved.unresolved, ["http://gone:7070"]);
    }

    #[tokio::test]
    async fn the_system_resolver_resolves_localhost_and_addresses() {
        let resolved = resolve_all(
            &endpoints(&["http://localhost:7070", "http://127.0.0.1:7071"]),
            &SystemResolver,
        )
        .await;
        assert!(resolved.unresolved.is_empty(), "{resolved:?}");
        assert!(
            resolved
                .targets
                .iter()
                .any(|t| t.address.ip().is_loopback() && t.address.port() == 7070),
            "{resolved:?}"
        );
        assert!(urls(&resolved).contains(&"http://127.0.0.1:7071"));
    }

    #[test]
    fn first_choices_spread_over_the_list() {
        let mut counts = [0usize; 3];
        for n in 0..300 {
            counts[first_index(&format!("worker-{n}"), 3)] += 1;
        }
        assert!(counts.iter().all(|&c| c >= 60), "{counts:?}");
        // Stable: the same id starts at the same place.
        assert_eq!(first_index("w1", 3), first_index("w1", 3));
        assert_eq!(first_index("w1", 0), 0);
    }

    #[tokio::test]
    async fn the_rotation_starts_at_the_ids_place_goes_round_and_follows_a_changed_record() {
        let resolver = Arc::new(TableResolver::default());
        resolver.set("cluster", &["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]);
        let id = (0..)
            .map(|n| format!("w{n}"))
            .find(|id| first_index(id, 3) == 1)
            .expect("an id");
        let mut rotation = Rotation::new(endpoints(&["http://cluster:1"]), resolver.clone(), &id);
        let mut dialed = Vec::new();
        for _ in 0..4 {
            dialed.push(rotation.next().await.expect("a target").url);
        }
        assert_eq!(
            dialed,
            [
                "http://10.0.0.2:1",
                "http://10.0.0.3:1",
                "http://10.0.0.1:1",
                "http://10.0.0.2:1"
            ]
        );
        // The record changes: the pass that began at the fourth dial still has the old list;
        // the one after it has the new one, from the same place in it (the address dialed last
        // is gone from it).
        resolver.set("cluster", &["10.0.0.2:1", "10.0.0.4:1"]);
        let generation = rotation.generation();
        dialed.clear();
        for _ in 0..4 {
            dialed.push(rotation.next().await.expect("a target").url);
        }
        assert_eq!(
            dialed,
            [
                "http://10.0.0.3:1",
                "http://10.0.0.1:1",
                "http://10.0.0.4:1",
                "http://10.0.0.2:1"
            ]
        );
        assert!(rotation.generation() > generation);
        assert_eq!(rotation.len(), 2);
    }

    #[tokio::test]
    async fn nothing_resolving_gives_no_target_until_something_does() {
        let resolver = Arc::new(TableResolver::default());
        let mut rotation = Rotation::new(endpoints(&["http://later:1"]), resolver.clone(), "w");
        assert_eq!(rotation.next().await, None);
        assert_eq!(rotation.resolved().unresolved, ["http://later:1"]);
        resolver.set("later", &["10.0.0.9:1"]);
        let target = rotation.next().await.expect("resolves now");
        assert_eq!(target.url, "http://10.0.0.9:1");
        assert!(rotation.resolved().unresolved.is_empty());
    }

    #[tokio::test]
    async fn a_move_goes_to_the_named_node_when_it_is_ours_else_past_the_current_one() {
        let resolver = Arc::new(TableResolver::default());
        resolver.set("node-a", &["10.0.0.1:7070"]);
        resolver.set("node-b", &["10.0.0.2:7070"]);
        resolver.set("node-c", &["10.0.0.3:7070"]);
        resolver.set("node-c.example", &["10.0.0.3:7070"]);
        resolver.set("elsewhere", &["192.0.2.1:7070"]);
        let list = endpoints(&[
            "http://node-a:7070",
            "http://node-b:7070",
            "http://node-c:7070",
        ]);
        let id = (0..)
            .map(|n| format!("w{n}"))
            .find(|id| first_index(id, 3) == 0)
            .expect("an id");
        let mut rotation = Rotation::new(list, resolver, &id);
        assert_eq!(
            rotation.next().await.expect("first").url,
            "http://10.0.0.1:7070"
        );
        // Named by another name of the same address: found after resolution.
        assert!(rotation.after_move("http://node-c.example:7070/").await);
        assert_eq!(
            rotation.next().await.expect("moved").url,
            "http://10.0.0.3:7070"
        );
        // Named by its address as the worker dials it.
        assert!(rotation.after_move("http://10.0.0.2:7070").await);
        assert_eq!(
            rotation.next().await.expect("moved").url,
            "http://10.0.0.2:7070"
        );
        // Not one of ours (or not an address at all): the next one, never the named one.
        for named in ["http://elsewhere:7070", "", "garbage"] {
            let left = rotation.current.expect("dialed");
            assert!(!rotation.after_move(named).await, "{named}");
            let next = rotation.next().await.expect("another");
            assert_ne!(next.address, left, "{named}");
            assert_ne!(next.address.ip().to_string(), "192.0.2.1");
        }
    }
}
