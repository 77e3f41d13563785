//! Worker choice: which live worker gets an attempt.
//!
//! The caller passes only live workers (heartbeat within the threshold); placement then filters
//! those that can take the attempt now and picks one by the configured [`Strategy`]. A worker is
//! eligible when it may serve the attempt ([`Candidate::may_serve`]: its token allows the task's
//! app, and it carries every label the task requires with the same value), is accepting work and
//! has a free slot (`running < capacity`). The labels a worker carries were checked against its
//! token when it registered (`worker_scope`), so a worker limited to some labels serves only
//! what those labels allow. The choice is a pure function of its inputs and the placer's
//! round-robin cursor; randomness comes in as an argument.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How to pick among the workers that can take an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Fewest running attempts first (the default).
    #[default]
    LeastRunning,
    /// Each eligible worker in turn, in the order of worker ids.
    RoundRobin,
    /// Uniformly at random among the eligible workers.
    Random,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [
        Strategy::LeastRunning,
        Strategy::RoundRobin,
        Strategy::Random,
    ];

    /// The name used in configuration files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::LeastRunning => "least_running",
            Strategy::RoundRobin => "round_robin",
            Strategy::Random => "random",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A placement strategy name that is not one of the allowed values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement strategy \"{0}\"; expected one of least_running, round_robin, random")]
pub struct UnknownStrategy(pub String);

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    /// Accepts the names of [`Strategy::as_str`]; case and `-` for `_` are forgiven because the
    /// value often comes from a command-line flag or an environment variable.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let normalized = s.trim().to_ascii_lowercase().replace('-', "_");
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == normalized)
            .ok_or_else(|| UnknownStrategy(s.to_string()))
    }
}

/// One live worker as placement sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub id: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// The apps whose tasks its token lets it run; `None`: every app.
    pub apps: Option<&'a [String]>,
    /// Attempts the worker runs at once at most.
    pub capacity: u32,
    /// Attempts the worker runs now (including those dispatched to it and not yet started).
    pub running: u32,
    /// False while the worker drains for shutdown or has been cordoned.
    pub accepting: bool,
}

/// What an attempt asks of its worker: its task's required labels and its workflow's app.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub app: &'a str,
}

impl Candidate<'_> {
    /// Whether this worker may serve the attempt at all, busy or not: its token allows the
    /// app, and it carries every required label with the same value. A worker that may not is
    /// never sent the attempt (nor its secrets), whatever the route.
    pub fn may_serve(&self, wanted: &Wanted<'_>) -> bool {
        self.apps
            .is_none_or(|apps| apps.iter().any(|app| app == wanted.app))
            && wanted
                .labels
                .iter()
                .all(|(key, value)| self.labels.get(key) == Some(value))
    }

    /// Whether this worker may take the attempt now: it may serve it, accepts work and has a
    /// free slot.
    pub fn is_eligible(&self, wanted: &Wanted<'_>) -> bool {
        self.accepting && self.running < self.capacity && self.may_serve(wanted)
    }
}

/// Picks workers by a strategy, remembering where round robin left off.
#[derive(Debug, Clone, Default)]
pub struct Placer {
    strategy: Strategy,
    /// Id of the worker round robin chose last. Keyed by id rather than by position so that
    /// workers joining or leaving the list do not make the rotation skip or repeat anyone.
    last_chosen: Option<String>,
}

impl Placer {
    pub fn new(strategy: Strategy) -> Placer {
        Placer {
            strategy,
            last_chosen: None,
        }
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Index of the chosen candidate, or None if none may serve the attempt, is accepting and
    /// has a free slot (running < capacity). `random` is any random number; only the `Random`
    /// strategy uses it.
    pub fn choose(
        &mut self,
        candidates: &[Candidate<'_>],
        wanted: &Wanted<'_>,
        random: u64,
    ) -> Option<usize> {
        let eligible: Vec<usize> = candidates
            .iter()
            .enumerate()
            .filter(|(_, candidate)| candidate.is_eligible(wanted))
            .map(|(index, _)| index)
            .collect();
        if eligible.is_empty() {
            return None;
        }
        match self.strategy {
            Strategy::LeastRunning => eligible
                .into_iter()
                .min_by(|&a, &b| compare_load(&candidates[a], &candidates[b]).then(a.cmp(&b))),
            Strategy::RoundRobin => {
                let id_of = |index: usize| candidates[index].id;
                let lowest = |indices: &mut dyn Iterator<Item = usize>| {
                    // The first index among equal ids, so duplicates resolve deterministically.
                    indices.min_by(|&a, &b| id_of(a).cmp(id_of(b)).then(a.cmp(&b)))
                };
                let after_cursor = match &self.last_chosen {
                    Some(last) => lowest(
                        &mut eligible
                            .iter()
                            .copied()
                            .filter(|&i| id_of(i) > last.as_str()),
                    ),
                    None => None,
                };
                let chosen = after_cursor.or_else(|| lowest(&mut eligible.iter().copied()))?;
                self.last_chosen = Some(id_of(chosen).to_string());
                Some(chosen)
            }
            Strategy::Random => {
                // Multiply-shift maps the 64-bit number onto 0..len with a bias of at most
                // len / 2^64, and uses its high bits, which are the best ones of weak generators.
                let len = eligible.len() as u128;
                let pick = ((random as u128 * len) >> 64) as usize;
                eligible.get(pick).copied()
            }
        }
    }
}

/// How one attempt's worker is chosen: a task's `routing` resolved against the scheduler's
/// configured strategy (see [`Route::for_task`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// One of the plain strategies (round robin shares the placer's cursor).
    Strategy(Strategy),
    /// Rendezvous hashing of `key` (workflow and task) over the eligible workers (the caller
    /// passes the cluster's live workers, see [`Route::spans_the_cluster`]): the same key
    /// lands on the same worker while it lives and has a free slot, else on the next one in the
    /// key's hash order. Adding or removing a worker moves only the keys that ranked it first.
    ConsistentHash(&'a str),
    /// The eligible worker with the lowest id (of the cluster's live workers).
    Failover,
    /// Only this worker (a shard of a sharded broadcast is pinned to its worker).
    Pinned(&'a str),
}

impl<'a> Route<'a> {
    /// The route of a task with `routing`, under the configured `strategy`. `key` identifies the
    /// task for consistent hashing; `pinned` is the worker a shard is pinned to. A sharded task's
    /// parent is never placed; its shards (which have `pinned`) are.
    pub fn for_task(
        routing: crate::spec::Routing,
        strategy: Strategy,
        key: &'a str,
        pinned: Option<&'a str>,
    ) -> Route<'a> {
        use crate::spec::Routing;
        if let Some(worker) = pinned {
            return Route::Pinned(worker);
        }
        match routing {
            Routing::Default | Routing::ShardedBroadcast => Route::Strategy(strategy),
            Routing::LeastRunning => Route::Strategy(Strategy::LeastRunning),
            Routing::RoundRobin => Route::Strategy(Strategy::RoundRobin),
            Routing::Random => Route::Strategy(Strategy::Random),
            Routing::ConsistentHash => Route::ConsistentHash(key),
            Routing::Failover => Route::Failover,
        }
    }
}

impl Route<'_> {
    /// Whether the choice depends on the whole worker set, not only on the workers one node
    /// holds: the same key must land on the same worker whichever node dispatches it. Such a
    /// route is chosen among the cluster's live workers, and the node holding the chosen one
    /// dispatches.
    pub fn spans_the_cluster(&self) -> bool {
        matches!(self, Route::ConsistentHash(_) | Route::Failover)
    }
}

impl Placer {
    /// Like [`Placer::choose`], by `route` instead of the placer's own strategy.
    pub fn choose_routed(
        &mut self,
        route: Route<'_>,
        candidates: &[Candidate<'_>],
        wanted: &Wanted<'_>,
        random: u64,
    ) -> Option<usize> {
        let eligible = |index: &usize| candidates[*index].is_eligible(wanted);
        match route {
            Route::Strategy(strategy) if strategy == self.strategy => {
                self.choose(candidates, wanted, random)
            }
            Route::Strategy(strategy) => {
                // Round robin keeps one cursor per placer whatever the configured strategy.
                let mut other = Placer {
                    strategy,
                    last_chosen: self.last_chosen.take(),
                };
                let chosen = other.choose(candidates, wanted, random);
                self.last_chosen = other.last_chosen;
                chosen
            }
            Route::ConsistentHash(key) => {
                rendezvous_order(key, candidates).into_iter().find(eligible)
            }
            Route::Failover => (0..candidates.len())
                .filter(eligible)
                .min_by(|&a, &b| candidates[a].id.cmp(candidates[b].id).then(a.cmp(&b))),
            Route::Pinned(worker) => (0..candidates.len())
                .filter(eligible)
                .find(|&index| candidates[index].id == worker),
        }
    }
}

/// Whether any of the live `candidates` may serve the attempt, busy or not: when none may, the
/// instance waits for a worker that does not exist (a NoWorker decision), not for a free slot.
pub fn any_may_serve(candidates: &[Candidate<'_>], wanted: &Wanted<'_>) -> bool {
    candidates
        .iter()
        .any(|candidate| candidate.may_serve(wanted))
}

/// Indices of `candidates` in `key`'s rendezvous order: highest hash of (key, worker id) first,
/// ties by id. Stable across processes and releases (FNV-1a and a fixed mixer, no random seed).
pub fn rendezvous_order(key: &str, candidates: &[Candidate<'_>]) -> Vec<usize> {
    let mut order: Vec<(u64, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(index, candidate)| (rendezvous_score(key, candidate.id), index))
        .collect();
    order.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| candidates[a.1].id.cmp(candidates[b.1].id))
            .then(a.1.cmp(&b.1))
    });
    order.into_iter().map(|(_, index)| index).collect()
}

/// The rendezvous weight of `worker` for `key`.
pub fn rendezvous_score(key: &str, worker: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes().chain([0xff]).chain(worker.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // SplitMix64's finalizer spreads FNV's weak low bits over the whole word.
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    hash ^ (hash >> 31)
}

/// Fewer running attempts first; on a tie the lower share of capacity in use.
fn compare_load(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    a.running.cmp(&b.running).then_with(|| {
        // running_a / capacity_a against running_b / capacity_b without division; capacities
        // are positive here because an eligible worker has running < capacity.
        let left = u64::from(a.running) * u64::from(b.capacity);
        let right = u64::from(b.running) * u64::from(a.capacity);
        left.cmp(&right)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Owned worker data, so tests can build `Candidate`s that borrow from it.
    struct Worker {
        id: String,
        labels: BTreeMap<String, String>,
        apps: Option<Vec<String>>,
        capacity: u32,
        running: u32,
        accepting: bool,
    }

    fn worker(id: &str, capacity: u32, running: u32) -> Worker {
        Worker {
            id: id.to_string(),
            labels: BTreeMap::new(),
            apps: None,
            capacity,
            running,
            accepting: true,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A task of app "sales" requiring `labels`.
    fn wanted(labels: &BTreeMap<String, String>) -> Wanted<'_> {
        Wanted {
            labels,
            app: "sales",
        }
    }

    fn candidates(workers: &[Worker]) -> Vec<Candidate<'_>> {
        workers
            .iter()
            .map(|w| Candidate {
                id: &w.id,
                labels: &w.labels,
                apps: w.apps.as_deref(),
                capacity: w.capacity,
                running: w.running,
                accepting: w.accepting,
            })
            .collect()
    }

    fn choose(
        placer: &mut Placer,
        workers: &[Worker],
        required: &BTreeMap<String, String>,
    ) -> Option<usize> {
        placer.choose(&candidates(workers), &wanted(required), 0)
    }

    /// A small deterministic generator (SplitMix64) for the property-style tests.
    fn next_random(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn least_running_picks_fewest_then_lowest_share_then_first() {
        let none = BTreeMap::new();
        let mut placer = Placer::new(Strategy::LeastRunning);
        let workers = [worker("a", 20, 5), worker("b", 20, 2), worker("c", 20, 3)];
        assert_eq!(choose(&mut placer, &workers, &none), Some(1));
        // Same running count: the larger capacity has the lower share in use.
        let workers = [worker("a", 10, 4), worker("b", 40, 4), worker("c", 20, 4)];
        assert_eq!(choose(&mut placer, &workers, &none), Some(1));
        // A complete tie goes to the lowest index, every time.
        let workers = [worker("z", 20, 1), worker("a", 20, 1)];
        for _ in 0..3 {
            assert_eq!(choose(&mut placer, &workers, &none), Some(0));
        }
    }

    #[test]
    fn round_robin_rotates_fairly_over_three_workers() {
        let none = BTreeMap::new();
        let mut placer = Placer::new(Strategy::RoundRobin);
        // Listed out of id order: the rotation follows ids, not positions.
        let workers = [
            worker("w2", 20, 0),
            worker("w1", 20, 0),
            worker("w3", 20, 0),
        ];
        let mut counts = BTreeMap::new();
        let mut order = Vec::new();
        for _ in 0..30 {
            let index = choose(&mut placer, &workers, &none).unwrap();
            order.push(workers[index].id.clone());
            *counts.entry(workers[index].id.clone()).or_insert(0) += 1;
        }
        assert_eq!(order[..4], ["w1", "w2", "w3", "w1"]);
        assert_eq!(counts.values().copied().collect::<Vec<_>>(), [10, 10, 10]);
    }

    #[test]
    fn round_robin_stays_fair_when_the_list_changes() {
        let none = BTreeMap::new();
        let mut placer = Placer::new(Strategy::RoundRobin);
        let all = [worker("a", 20, 0), worker("b", 20, 0), worker("c", 20, 0)];
        assert_eq!(all[choose(&mut placer, &all, &none).unwrap()].id, "a");
        // "b" left; the next after "a" is "c", not a repeat of "a".
        let without_b = [worker("a", 20, 0), worker("c", 20, 0)];
        assert_eq!(
            without_b[choose(&mut placer, &without_b, &none).unwrap()].id,
            "c"
        );
        // "b" is back and "c" went last, so the rotation wraps to "a", then "b".
        assert_eq!(all[choose(&mut placer, &all, &none).unwrap()].id, "a");
        assert_eq!(all[choose(&mut placer, &all, &none).unwrap()].id, "b");
        // An ineligible worker is skipped, not waited for.
        let c_full = [worker("a", 20, 0), worker("b", 20, 0), worker("c", 1, 1)];
        assert_eq!(c_full[choose(&mut placer, &c_full, &none).unwrap()].id, "a");
    }

    #[test]
    fn random_is_spread_over_the_eligible_workers_by_the_given_number() {
        let none = BTreeMap::new();
        let mut placer = Placer::new(Strategy::Random);
        let workers = [
            worker("a", 20, 0),
            worker("full", 1, 1),
            worker("b", 20, 0),
            worker("c", 20, 0),
        ];
        let list = candidates(&workers);
        assert_eq!(placer.choose(&list, &wanted(&none), 0), Some(0));
        assert_eq!(placer.choose(&list, &wanted(&none), u64::MAX), Some(3));
        assert_eq!(placer.choose(&list, &wanted(&none), u64::MAX / 2), Some(2));
        let mut counts = [0u32; 4];
        let mut state = 7;
        for _ in 0..3_000 {
            counts[placer
                .choose(&list, &wanted(&none), next_random(&mut state))
                .unwrap()] += 1;
        }
        assert_eq!(counts[1], 0);
        for index in [0, 2, 3] {
            assert!((850..1150).contains(&counts[index]), "{counts:?}");
        }
    }

    #[test]
    fn capacity_is_never_exceeded_when_choosing_repeatedly() {
        let none = BTreeMap::new();
        for strategy in Strategy::ALL {
            let mut placer = Placer::new(strategy);
            let mut workers = [worker("a", 3, 0), worker("b", 1, 0), worker("c", 2, 1)];
            let mut state = 1;
            let mut placed = 0;
            while let Some(index) = placer.choose(
                &candidates(&workers),
                &wanted(&none),
                next_random(&mut state),
            ) {
                workers[index].running += 1;
                placed += 1;
                assert!(placed <= 100, "{strategy}: placement never stops");
            }
            // 3 + 1 + 1 free slots in all.
            assert_eq!(placed, 5, "{strategy}");
            assert!(
                workers.iter().all(|w| w.running == w.capacity),
                "{strategy}"
            );
        }
    }

    #[test]
    fn required_labels_must_all_match() {
        let mut placer = Placer::new(Strategy::LeastRunning);
        let mut gpu = worker("gpu", 20, 5);
        gpu.labels = labels(&[("gpu", "a100"), ("zone", "east")]);
        let mut other_gpu = worker("other-gpu", 20, 0);
        other_gpu.labels = labels(&[("gpu", "t4"), ("zone", "east")]);
        let plain = worker("plain", 20, 0);
        let workers = [plain, other_gpu, gpu];
        assert_eq!(
            choose(&mut placer, &workers, &labels(&[("gpu", "a100")])),
            Some(2)
        );
        assert_eq!(
            choose(&mut placer, &workers, &labels(&[("zone", "east")])),
            Some(1)
        );
        assert_eq!(
            choose(
                &mut placer,
                &workers,
                &labels(&[("gpu", "a100"), ("zone", "west")])
            ),
            None
        );
        assert_eq!(choose(&mut placer, &workers, &BTreeMap::new()), Some(0));
    }

    #[test]
    fn none_eligible_gives_none() {
        let none = BTreeMap::new();
        let mut draining = worker("draining", 20, 0);
        draining.accepting = false;
        let workers = [draining, worker("full", 2, 2), worker("zero", 0, 0)];
        for strategy in Strategy::ALL {
            assert_eq!(
                Placer::new(strategy).choose(&candidates(&workers), &wanted(&none), 42),
                None
            );
            assert_eq!(Placer::new(strategy).choose(&[], &wanted(&none), 42), None);
        }
    }

    #[test]
    fn the_chosen_worker_is_always_eligible_and_least_running_is_minimal() {
        let label_values = ["x", "y"];
        let mut state = 2026;
        for round in 0..2_000 {
            let strategy = Strategy::ALL[round % 3];
            let mut placer = Placer::new(strategy);
            let count = (next_random(&mut state) % 6) as usize;
            let workers: Vec<Worker> = (0..count)
                .map(|_| {
                    let capacity = (next_random(&mut state) % 4) as u32;
                    let mut w = worker(&format!("w{}", next_random(&mut state) % 5), capacity, 0);
                    w.running = (next_random(&mut state) % 5) as u32;
                    w.accepting = !next_random(&mut state).is_multiple_of(5);
                    if next_random(&mut state).is_multiple_of(2) {
                        let value = label_values[(next_random(&mut state) % 2) as usize];
                        w.labels = labels(&[("pool", value)]);
                    }
                    w
                })
                .collect();
            let required = match next_random(&mut state) % 3 {
                0 => BTreeMap::new(),
                1 => labels(&[("pool", "x")]),
                _ => labels(&[("pool", "y")]),
            };
            let list = candidates(&workers);
            let any_eligible = list.iter().any(|c| c.is_eligible(&wanted(&required)));
            // Several choices in a row exercise the round-robin cursor too.
            for _ in 0..3 {
                let chosen = placer.choose(&list, &wanted(&required), next_random(&mut state));
                assert_eq!(chosen.is_some(), any_eligible, "{strategy}");
                if let Some(index) = chosen {
                    let c = &list[index];
                    assert!(c.accepting && c.running < c.capacity, "{strategy}");
                    assert!(
                        required.iter().all(|(k, v)| c.labels.get(k) == Some(v)),
                        "{strategy}"
                    );
                    if strategy == Strategy::LeastRunning {
                        let min = list
                            .iter()
                            .filter(|c| c.is_eligible(&wanted(&required)))
                            .map(|c| c.running)
                            .min();
                        assert_eq!(Some(c.running), min);
                    }
                }
            }
        }
    }

    fn route(placer: &mut Placer, route: Route<'_>, workers: &[Worker]) -> Option<String> {
        placer
            .choose_routed(route, &candidates(workers), &wanted(&BTreeMap::new()), 0)
            .map(|index| workers[index].id.clone())
    }

    #[test]
    fn consistent_hash_sticks_to_one_worker_and_moves_only_when_it_is_full_or_gone() {
        let mut placer = Placer::new(Strategy::LeastRunning);
        let workers = [worker("w1", 4, 0), worker("w2", 4, 0), worker("w3", 4, 0)];
        let mut homes = BTreeMap::new();
        for task in 0..60 {
            let key = format!("wf/t{task}");
            let home = route(&mut placer, Route::ConsistentHash(&key), &workers).unwrap();
            // The same key, with other loads and list orders, lands on the same worker.
            let mut shuffled = [worker("w3", 4, 3), worker("w1", 4, 2), worker("w2", 4, 0)];
            assert_eq!(
                route(&mut placer, Route::ConsistentHash(&key), &shuffled),
                Some(home.clone())
            );
            // Its home full: the next in the key's hash order, the same one every time.
            for w in shuffled.iter_mut() {
                if w.id == home {
                    w.running = w.capacity;
                }
            }
            let second = route(&mut placer, Route::ConsistentHash(&key), &shuffled).unwrap();
            assert_ne!(second, home);
            let order = rendezvous_order(&key, &candidates(&workers));
            assert_eq!(workers[order[0]].id, home);
            assert_eq!(workers[order[1]].id, second);
            homes.insert(key, home);
        }
        // Every worker is home to some keys.
        let used: std::collections::BTreeSet<_> = homes.values().cloned().collect();
        assert_eq!(used.len(), 3, "{homes:?}");
        // A worker leaving moves only the keys that lived on it.
        let without_w2 = [worker("w1", 4, 0), worker("w3", 4, 0)];
        for (key, home) in &homes {
            let now = route(&mut placer, Route::ConsistentHash(key), &without_w2).unwrap();
            if home != "w2" {
                assert_eq!(&now, home, "{key}");
            }
        }
        assert_eq!(rendezvous_score("a", "b"), rendezvous_score("a", "b"));
        assert_ne!(rendezvous_score("ab", "c"), rendezvous_score("a", "bc"));
    }

    #[test]
    fn failover_takes_the_lowest_eligible_id() {
        let mut placer = Placer::new(Strategy::RoundRobin);
        let workers = [worker("w3", 4, 0), worker("w1", 4, 3), worker("w2", 4, 0)];
        for _ in 0..3 {
            assert_eq!(
                route(&mut placer, Route::Failover, &workers).as_deref(),
                Some("w1")
            );
        }
        let w1_full = [worker("w3", 4, 0), worker("w1", 4, 4), worker("w2", 4, 0)];
        assert_eq!(
            route(&mut placer, Route::Failover, &w1_full).as_deref(),
            Some("w2")
        );
        assert_eq!(route(&mut placer, Route::Failover, &[]), None);
    }

    #[test]
    fn pinned_goes_only_to_its_worker() {
        let mut placer = Placer::new(Strategy::LeastRunning);
        let workers = [worker("w1", 4, 0), worker("w2", 4, 1)];
        assert_eq!(
            route(&mut placer, Route::Pinned("w2"), &workers).as_deref(),
            Some("w2")
        );
        let w2_full = [worker("w1", 4, 0), worker("w2", 1, 1)];
        assert_eq!(route(&mut placer, Route::Pinned("w2"), &w2_full), None);
        assert_eq!(route(&mut placer, Route::Pinned("gone"), &workers), None);
    }

    #[test]
    fn a_task_routing_overrides_the_configured_strategy() {
        use crate::spec::Routing;
        let s = Strategy::Random;
        assert_eq!(
            Route::for_task(Routing::Default, s, "k", None),
            Route::Strategy(s)
        );
        assert_eq!(
            Route::for_task(Routing::RoundRobin, s, "k", None),
            Route::Strategy(Strategy::RoundRobin)
        );
        assert_eq!(
            Route::for_task(Routing::LeastRunning, s, "k", None),
            Route::Strategy(Strategy::LeastRunning)
        );
        assert_eq!(
            Route::for_task(Routing::Random, Strategy::LeastRunning, "k", None),
            Route::Strategy(Strategy::Random)
        );
        assert_eq!(
            Route::for_task(Routing::ConsistentHash, s, "k", None),
            Route::ConsistentHash("k")
        );
        assert_eq!(
            Route::for_task(Routing::Failover, s, "k", None),
            Route::Failover
        );
        assert_eq!(
            Route::for_task(Routing::ShardedBroadcast, s, "k", Some("w9")),
            Route::Pinned("w9")
        );
        // A round-robin task under a least-running scheduler still rotates.
        let mut placer = Placer::new(Strategy::LeastRunning);
        let workers = [worker("a", 4, 0), worker("b", 4, 0)];
        let rr = Route::Strategy(Strategy::RoundRobin);
        assert_eq!(route(&mut placer, rr, &workers).as_deref(), Some("a"));
        assert_eq!(route(&mut placer, rr, &workers).as_deref(), Some("b"));
        assert_eq!(route(&mut placer, rr, &workers).as_deref(), Some("a"));
    }

    #[test]
    fn any_may_serve_ignores_load_but_not_labels_or_apps() {
        let mut busy = worker("busy", 1, 1);
        busy.labels = labels(&[("gpu", "a100")]);
        busy.accepting = false;
        let workers = [busy, worker("plain", 4, 0)];
        let list = candidates(&workers);
        assert!(any_may_serve(&list, &wanted(&labels(&[("gpu", "a100")]))));
        assert!(!any_may_serve(&list, &wanted(&labels(&[("gpu", "t4")]))));
        assert!(any_may_serve(&list, &wanted(&BTreeMap::new())));
        assert!(!any_may_serve(&[], &wanted(&BTreeMap::new())));
        // Workers whose tokens allow other apps only: nobody may serve a sales task.
        let mut finance = worker("finance", 4, 0);
        finance.apps = Some(vec!["finance".into()]);
        let only_finance = [finance];
        assert!(!any_may_serve(
            &candidates(&only_finance),
            &wanted(&BTreeMap::new())
        ));
    }

    #[test]
    fn a_worker_is_never_chosen_for_an_app_its_token_does_not_allow_whatever_the_route() {
        // "finance" is idle and first by every measure; "sales" is busier and last by id.
        let mut finance = worker("a-finance", 8, 0);
        finance.apps = Some(vec!["finance".into()]);
        let mut sales = worker("z-sales", 8, 5);
        sales.apps = Some(vec!["sales".into(), "hr".into()]);
        let anything = worker("m-any", 8, 6);
        let workers = [finance, sales, anything];
        let list = candidates(&workers);
        let none = BTreeMap::new();
        let sales_task = wanted(&none);
        let finance_task = Wanted {
            labels: &none,
            app: "finance",
        };
        assert!(!list[0].may_serve(&sales_task) && list[0].may_serve(&finance_task));
        assert!(list[1].may_serve(&sales_task) && !list[1].may_serve(&finance_task));
        assert!(list[2].may_serve(&sales_task) && list[2].may_serve(&finance_task));
        let routes = [
            Route::Strategy(Strategy::LeastRunning),
            Route::Strategy(Strategy::RoundRobin),
            Route::Strategy(Strategy::Random),
            Route::ConsistentHash("wf/t"),
            Route::Failover,
            Route::Pinned("a-finance"),
        ];
        let mut state = 9;
        for route in routes {
            let mut placer = Placer::new(Strategy::LeastRunning);
            for _ in 0..50 {
                let chosen =
                    placer.choose_routed(route, &list, &sales_task, next_random(&mut state));
                assert_ne!(
                    chosen,
                    Some(0),
                    "{route:?} sent a sales task to a finance worker"
                );
            }
        }
        // Pinned to the finance worker, a sales shard goes nowhere.
        let mut placer = Placer::new(Strategy::LeastRunning);
        assert_eq!(
            placer.choose_routed(Route::Pinned("a-finance"), &list, &sales_task, 0),
            None
        );
        assert_eq!(
            placer.choose_routed(Route::Failover, &list, &finance_task, 0),
            Some(0)
        );
    }

    #[test]
    fn strategy_names_round_trip() {
        for strategy in Strategy::ALL {
            assert_eq!(strategy.to_string().parse::<Strategy>(), Ok(strategy));
        }
        assert_eq!("Round-Robin".parse::<Strategy>(), Ok(Strategy::RoundRobin));
        assert_eq!(
            "fastest".parse::<Strategy>().unwrap_err().to_string(),
            "unknown placement strategy \"fastest\"; expected one of least_running, round_robin, random"
        );
        assert_eq!(Strategy::default(), Strategy::LeastRunning);
        assert_eq!(Placer::new(Strategy::Random).strategy(), Strategy::Random);
        let json = serde_json::to_string(&Strategy::RoundRobin).unwrap();
        assert_eq!(json, "\"round_robin\"");
    }
}
