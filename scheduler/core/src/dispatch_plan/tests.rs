//! The plan's rules as tables of inputs → actions, on a fake clock.

use super::*;
use crate::placement::rendezvous_order;

const NOW: Millis = 1_000_000;
const DEAD_AFTER: Millis = 20_000;
/// The stream every test slot was read from.
const STREAM: u64 = 7;

fn settings(strategy: Strategy) -> Settings {
    Settings {
        strategy,
        worker_dead_after_ms: DEAD_AFTER,
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A worker connected to this node, accepting, every app.
fn slot(id: &str, capacity: u32, running: u32) -> Slot {
    Slot {
        id: id.into(),
        connection: STREAM,
        labels: BTreeMap::new(),
        apps: None,
        capacity,
        running,
        accepting: true,
    }
}

fn slot_with(id: &str, pairs: &[(&str, &str)]) -> Slot {
    Slot {
        labels: labels(pairs),
        ..slot(id, 4, 0)
    }
}

/// A worker record of the cluster, connected and heard from a second ago.
fn record(id: &str, capacity: u32, running: u32) -> ClusterWorker {
    ClusterWorker {
        id: id.into(),
        labels: BTreeMap::new(),
        apps: None,
        capacity,
        running,
        draining: false,
        connected: true,
        last_heartbeat: NOW - 1_000,
    }
}

/// The records of this node's own slots, as the store holds them.
fn records_of(slots: &[Slot]) -> Vec<ClusterWorker> {
    slots
        .iter()
        .map(|slot| ClusterWorker {
            labels: slot.labels.clone(),
            apps: slot.apps.as_deref().map(<[String]>::to_vec),
            ..record(&slot.id, slot.capacity, slot.running)
        })
        .collect()
}

/// A waiting instance of app "sales", owned so that a [`Waiting`] can borrow it.
#[derive(Clone)]
struct Item {
    id: i64,
    key: String,
    routing: Routing,
    labels: BTreeMap<String, String>,
    limits: Vec<Limit>,
    pinned: Option<String>,
    secrets_unavailable: Option<String>,
}

fn item(id: i64) -> Item {
    Item {
        id,
        key: "wf/t".into(),
        routing: Routing::Default,
        labels: BTreeMap::new(),
        limits: Vec::new(),
        pinned: None,
        secrets_unavailable: None,
    }
}

impl Item {
    fn routing(mut self, routing: Routing) -> Item {
        self.routing = routing;
        self
    }
    fn key(mut self, key: &str) -> Item {
        self.key = key.into();
        self
    }
    fn labels(mut self, pairs: &[(&str, &str)]) -> Item {
        self.labels = labels(pairs);
        self
    }
    fn limit(mut self, scope: &str, max: u32) -> Item {
        self.limits.push(Limit {
            scope: scope.into(),
            max,
        });
        self.limits.sort();
        self
    }
    fn shard_of(mut self, worker: &str) -> Item {
        self.routing = Routing::ShardedBroadcast;
        self.pinned = Some(worker.into());
        self
    }
    fn secrets_unavailable(mut self, why: &str) -> Item {
        self.secrets_unavailable = Some(why.into());
        self
    }
    fn waiting(&self) -> Waiting<'_> {
        Waiting {
            instance: InstanceId(self.id),
            attempt: Attempt(1),
            key: &self.key,
            routing: self.routing,
            wanted: Wanted {
                labels: &self.labels,
                app: "sales",
            },
            limits: &self.limits,
            pinned: self.pinned.as_deref(),
            secrets_unavailable: self.secrets_unavailable.as_deref(),
        }
    }
}

/// What one pass plans on.
#[derive(Clone)]
struct World {
    strategy: Strategy,
    now: Millis,
    slots: Vec<Slot>,
    used: BTreeMap<String, u32>,
    cluster: Vec<ClusterWorker>,
}

fn world(slots: Vec<Slot>) -> World {
    World {
        strategy: Strategy::LeastRunning,
        now: NOW,
        cluster: records_of(&slots),
        slots,
        used: BTreeMap::new(),
    }
}

impl World {
    fn strategy(mut self, strategy: Strategy) -> World {
        self.strategy = strategy;
        self
    }
    fn at(mut self, now: Millis) -> World {
        self.now = now;
        self
    }
    fn used(mut self, scope: &str, used: u32) -> World {
        self.used.insert(scope.into(), used);
        self
    }
    fn with(mut self, worker: ClusterWorker) -> World {
        self.cluster.push(worker);
        self
    }
}

/// A pass's plan as the dispatcher makes it: in order, the cluster read when asked, every
/// reservation granted.
struct Planned {
    actions: Vec<Action>,
    cluster_reads: usize,
    slots: Vec<Slot>,
}

fn plan_with(world: &World, placer: &mut Placer, items: &[Item], random: u64) -> Planned {
    let mut planner = Planner::new(
        settings(world.strategy),
        world.now,
        world.slots.clone(),
        world.used.clone(),
        placer,
    );
    let mut cluster_reads = 0;
    let mut actions = Vec::new();
    for item in items {
        let action = loop {
            match planner.decide(&item.waiting(), random) {
                Ok(action) => break action,
                Err(NeedsCluster) => {
                    cluster_reads += 1;
                    assert_eq!(cluster_reads, 1, "the cluster is read once a pass");
                    planner.learn_cluster(world.cluster.clone());
                }
            }
        };
        actions.push(action);
    }
    Planned {
        actions,
        cluster_reads,
        slots: planner.slots().to_vec(),
    }
}

fn plan(world: &World, items: &[Item]) -> Planned {
    plan_with(world, &mut Placer::new(world.strategy), items, 0)
}

fn actions(world: &World, items: &[Item]) -> Vec<Action> {
    plan(world, items).actions
}

fn dispatch(worker: &str) -> Action {
    Action::Dispatch {
        worker: worker.into(),
        connection: STREAM,
    }
}

fn hold(kind: DecisionKind, detail: &str) -> Action {
    Action::Hold {
        kind,
        detail: detail.into(),
    }
}

fn no_worker(detail: &str) -> Action {
    hold(DecisionKind::NoWorker, detail)
}

fn throttled(detail: &str) -> Action {
    hold(DecisionKind::Throttled, detail)
}

fn fan_out(workers: &[&str]) -> Action {
    Action::FanOut {
        workers: workers.iter().map(|w| w.to_string()).collect(),
    }
}

// ---- empty inputs ----

#[test]
fn an_empty_batch_plans_nothing_and_reads_nothing() {
    let planned = plan(&world(vec![slot("w1", 4, 0)]), &[]);
    assert!(planned.actions.is_empty());
    assert_eq!(planned.cluster_reads, 0);
    assert_eq!(planned.slots, vec![slot("w1", 4, 0)]);
}

#[test]
fn with_no_worker_anywhere_every_instance_is_no_worker() {
    let nobody = world(Vec::new());
    assert_eq!(
        actions(&nobody, &[item(1), item(2).labels(&[("gpu", "a100")])]),
        [
            no_worker("no live worker"),
            no_worker("no live worker with labels gpu=a100"),
        ]
    );
    // Nor a worker anywhere for a sharded task.
    assert_eq!(
        actions(&nobody, &[item(3).routing(Routing::ShardedBroadcast)]),
        [no_worker("no live worker")]
    );
}

// ---- strategies ----

#[test]
fn strategies_choose_among_this_nodes_workers() {
    let slots = || vec![slot("w2", 3, 1), slot("w1", 3, 2), slot("w3", 3, 0)];
    let four = [item(1), item(2), item(3), item(4)];
    // (strategy, random number, the workers chosen in order)
    let table: [(Strategy, u64, [&str; 4]); 4] = [
        // Fewest running first, the first listed on a tie.
        (Strategy::LeastRunning, 0, ["w3", "w2", "w3", "w2"]),
        // Each in turn by id, skipping the full ones.
        (Strategy::RoundRobin, 0, ["w1", "w2", "w3", "w2"]),
        // The drawn number picks among the eligible, in listed order.
        (Strategy::Random, 0, ["w2", "w2", "w1", "w3"]),
        (Strategy::Random, u64::MAX, ["w3", "w3", "w3", "w1"]),
    ];
    for (strategy, random, chosen) in table {
        let world = world(slots()).strategy(strategy);
        let planned = plan_with(&world, &mut Placer::new(strategy), &four, random);
        let expected: Vec<Action> = chosen.iter().map(|w| dispatch(w)).collect();
        assert_eq!(planned.actions, expected, "{strategy}");
        assert_eq!(planned.cluster_reads, 0, "{strategy}");
    }
}

#[test]
fn a_tasks_routing_overrides_the_configured_strategy() {
    let world = world(vec![slot("a", 4, 3), slot("b", 4, 0)]).strategy(Strategy::RoundRobin);
    let least = item(1).routing(Routing::LeastRunning);
    let rotating = item(2).routing(Routing::RoundRobin);
    assert_eq!(
        actions(&world, &[least.clone(), least, rotating.clone(), rotating]),
        [dispatch("b"), dispatch("b"), dispatch("a"), dispatch("b")]
    );
}

#[test]
fn the_round_robin_cursor_carries_over_between_passes() {
    let world = world(vec![slot("a", 4, 0), slot("b", 4, 0), slot("c", 4, 0)])
        .strategy(Strategy::RoundRobin);
    let mut placer = Placer::new(Strategy::RoundRobin);
    let first = plan_with(&world, &mut placer, &[item(1), item(2)], 0);
    let second = plan_with(&world, &mut placer, &[item(3), item(4)], 0);
    assert_eq!(first.actions, [dispatch("a"), dispatch("b")]);
    assert_eq!(second.actions, [dispatch("c"), dispatch("a")]);
}

#[test]
fn a_pass_never_fills_a_worker_past_its_capacity() {
    for strategy in Strategy::ALL {
        let mut world =
            world(vec![slot("w1", 2, 1), slot("w2", 1, 0), slot("off", 5, 0)]).strategy(strategy);
        world.slots[2].accepting = false;
        let items: Vec<Item> = (1..=4).map(item).collect();
        let planned = plan(&world, &items);
        let sent = planned
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Dispatch { .. }))
            .count();
        assert_eq!(sent, 2, "{strategy}");
        assert_eq!(
            planned.actions[2..],
            [Action::Wait, Action::Wait],
            "{strategy}"
        );
        let running: Vec<u32> = planned.slots.iter().map(|s| s.running).collect();
        assert_eq!(running, [2, 1, 0], "{strategy}");
    }
}

// ---- labels, apps, no worker ----

#[test]
fn labels_and_apps_choose_the_worker_that_may_serve() {
    let mut finance = slot("finance", 4, 0);
    finance.apps = Some(Arc::from(vec!["finance".to_string()]));
    let slots = vec![
        finance,
        slot_with("gpu", &[("gpu", "a100"), ("zone", "east")]),
        slot("plain", 4, 3),
    ];
    let world = world(slots);
    // (the task's labels, what it gets)
    let table: [(&[(&str, &str)], Action); 4] = [
        (&[("gpu", "a100")], dispatch("gpu")),
        (&[("zone", "east")], dispatch("gpu")),
        // "finance" is idle, but its token does not allow app sales.
        (&[], dispatch("gpu")),
        (
            &[("gpu", "t4")],
            no_worker("no live worker with labels gpu=t4"),
        ),
    ];
    for (wanted, expected) in table {
        assert_eq!(
            actions(&world, &[item(1).labels(wanted)]),
            [expected],
            "{wanted:?}"
        );
    }
}

#[test]
fn no_worker_says_when_only_the_token_stands_in_the_way() {
    let mut finance = slot_with("finance", &[("gpu", "a100")]);
    finance.apps = Some(Arc::from(vec!["finance".to_string()]));
    let world = world(vec![finance]);
    assert_eq!(
        actions(&world, &[item(1).labels(&[("gpu", "a100")])]),
        [no_worker(
            "no live worker with labels gpu=a100 whose token allows app sales"
        )]
    );
}

#[test]
fn a_busy_worker_that_may_serve_means_waiting_not_no_worker() {
    let world = world(vec![slot("w1", 2, 2)]);
    let planned = plan(&world, &[item(1), item(2)]);
    assert_eq!(planned.actions, [Action::Wait, Action::Wait]);
    assert!(!planned.actions[0].holds_back());
    assert_eq!(planned.cluster_reads, 0);
}

#[test]
fn an_instance_only_another_nodes_worker_may_serve_is_left_to_it() {
    let gpu = ClusterWorker {
        labels: labels(&[("gpu", "a100")]),
        ..record("there", 4, 4)
    };
    let base = world(vec![slot("here", 4, 0)]);
    let task = [item(1).labels(&[("gpu", "a100")])];
    let dead = ClusterWorker {
        last_heartbeat: NOW - DEAD_AFTER - 1,
        ..gpu.clone()
    };
    let draining = ClusterWorker {
        draining: true,
        ..gpu.clone()
    };
    let disconnected = ClusterWorker {
        connected: false,
        ..gpu.clone()
    };
    let just_live = ClusterWorker {
        last_heartbeat: NOW - DEAD_AFTER,
        ..gpu.clone()
    };
    let gone = no_worker("no live worker with labels gpu=a100");
    // (the other node's gpu worker, what the instance gets here)
    let table = [
        (gpu, Action::LeaveToOtherNode),
        (just_live, Action::LeaveToOtherNode),
        (dead, gone.clone()),
        (draining, gone.clone()),
        (disconnected, gone),
    ];
    for (worker, expected) in table {
        let planned = plan(&base.clone().with(worker.clone()), &task);
        assert_eq!(planned.actions, [expected], "{worker:?}");
        assert!(planned.actions[0].holds_back());
    }
}

// ---- cross-node routes ----

/// A key whose rendezvous home among `here` and `there` is `home`.
fn key_homed_on(home: &str) -> String {
    let (a, b) = (record("here", 1, 0), record("there", 1, 0));
    let labels = BTreeMap::new();
    let candidates = [&a, &b].map(|w| Candidate {
        id: &w.id,
        labels: &labels,
        apps: None,
        capacity: 1,
        running: 0,
        accepting: true,
    });
    (0..)
        .map(|i| format!("wf/t{i}"))
        .find(|key| candidates[rendezvous_order(key, &candidates)[0]].id == home)
        .unwrap_or_default()
}

#[test]
fn consistent_hash_goes_to_its_home_worker_on_whichever_node() {
    let here_home = key_homed_on("here");
    let there_home = key_homed_on("there");
    let task = |key: &str| item(1).routing(Routing::ConsistentHash).key(key);
    let base = world(vec![slot("here", 4, 0)]);
    let there = record("there", 4, 0);
    let full = record("there", 4, 4);
    let draining = ClusterWorker {
        draining: true,
        ..record("there", 4, 0)
    };
    let dead = ClusterWorker {
        last_heartbeat: NOW - DEAD_AFTER - 1,
        ..record("there", 4, 0)
    };
    // (the other node's worker, the key, what the instance gets here)
    let table = [
        (there.clone(), &here_home, dispatch("here")),
        (there, &there_home, Action::LeaveToOtherNode),
        // Its home full, draining or dead: the next in the key's order, here.
        (full, &there_home, dispatch("here")),
        (draining, &there_home, dispatch("here")),
        (dead, &there_home, dispatch("here")),
    ];
    for (worker, key, expected) in table {
        let planned = plan(&base.clone().with(worker.clone()), &[task(key)]);
        assert_eq!(planned.actions, [expected], "{key} {worker:?}");
        assert_eq!(planned.cluster_reads, 1);
    }
}

#[test]
fn failover_takes_the_lowest_live_id_of_the_cluster() {
    let task = [item(1).routing(Routing::Failover)];
    let base = world(vec![slot("w2", 4, 0), slot("w3", 4, 0)]);
    let w1 = record("w1", 4, 0);
    // (the other node's w1, what the instance gets here)
    let table = [
        (w1.clone(), Action::LeaveToOtherNode),
        (
            ClusterWorker {
                last_heartbeat: NOW - DEAD_AFTER - 1,
                ..w1.clone()
            },
            dispatch("w2"),
        ),
        (
            ClusterWorker {
                connected: false,
                ..w1.clone()
            },
            dispatch("w2"),
        ),
        (record("w1", 4, 4), dispatch("w2")),
    ];
    for (worker, expected) in table {
        assert_eq!(
            actions(&base.clone().with(worker.clone()), &task),
            [expected],
            "{worker:?}"
        );
    }
    // Its own slots count what the pass planned: w2 full, w3 is next.
    let small = world(vec![slot("w2", 1, 0), slot("w3", 4, 0)]);
    assert_eq!(
        actions(&small, &[task[0].clone(), task[0].clone()]),
        [dispatch("w2"), dispatch("w3")]
    );
}

#[test]
fn a_cluster_route_with_no_worker_anywhere_is_no_worker() {
    let task = [item(1)
        .routing(Routing::Failover)
        .labels(&[("gpu", "a100")])];
    let planned = plan(&world(vec![slot("w1", 4, 0)]), &task);
    assert_eq!(
        planned.actions,
        [no_worker("no live worker with labels gpu=a100")]
    );
    // One that may serve here but is busy: it waits for it.
    assert_eq!(
        actions(
            &world(vec![slot("w1", 1, 1)]),
            &[item(2).routing(Routing::Failover)]
        ),
        [Action::Wait]
    );
}

#[test]
fn the_cluster_is_read_only_when_a_rule_needs_it() {
    let here = world(vec![slot("w1", 4, 0)]);
    // (the batch, whether the cluster is read)
    let table: [(Vec<Item>, usize); 6] = [
        (vec![item(1), item(2)], 0),
        (vec![item(1).shard_of("w1")], 0),
        (vec![item(1).routing(Routing::ConsistentHash)], 1),
        (vec![item(1).routing(Routing::ShardedBroadcast)], 1),
        (vec![item(1).labels(&[("gpu", "a100")])], 1),
        // Throttled before its route is looked at.
        (
            vec![item(1).routing(Routing::Failover).limit("task:1:t", 1)],
            0,
        ),
    ];
    let here = here.used("task:1:t", 1);
    for (batch, reads) in table {
        assert_eq!(plan(&here, &batch).cluster_reads, reads);
    }
}

// ---- sharded tasks ----

#[test]
fn a_sharded_parent_fans_out_to_every_live_worker_that_may_serve_it() {
    let gpu = |id: &str| ClusterWorker {
        labels: labels(&[("gpu", "a100")]),
        ..record(id, 4, 4)
    };
    let finance = ClusterWorker {
        apps: Some(vec!["finance".into()]),
        ..gpu("w6")
    };
    let world = world(vec![slot_with("w1", &[("gpu", "a100")])])
        .with(gpu("w3"))
        .with(gpu("w2"))
        .with(gpu("w3"))
        .with(ClusterWorker {
            last_heartbeat: NOW - DEAD_AFTER - 1,
            ..gpu("w4")
        })
        .with(ClusterWorker {
            draining: true,
            ..gpu("w5")
        })
        .with(finance)
        .with(ClusterWorker {
            connected: false,
            ..gpu("w7")
        })
        .with(record("w8", 4, 0));
    let parent = item(1)
        .routing(Routing::ShardedBroadcast)
        .labels(&[("gpu", "a100")]);
    // Busy workers count, and neither its limits nor its secrets hold the parent back: each
    // shard is held back on its own.
    let held = parent
        .clone()
        .limit("task:1:t", 1)
        .secrets_unavailable("no key");
    let planned = plan(&world.used("task:1:t", 1), &[parent, held]);
    assert_eq!(
        planned.actions,
        [fan_out(&["w1", "w2", "w3"]), fan_out(&["w1", "w2", "w3"])]
    );
    assert!(!planned.actions[0].holds_back());
    assert_eq!(planned.slots[0].running, 0, "a parent takes no slot");
}

#[test]
fn a_shard_goes_only_to_its_worker_and_fails_once_it_is_gone_for_good() {
    let heard = NOW - 5_000;
    let base = world(vec![slot("w1", 4, 0), slot("w2", 1, 1)]).with(ClusterWorker {
        last_heartbeat: heard,
        ..record("w9", 4, 0)
    });
    let gone = |worker: &str| Action::FailShard {
        reason: format!("worker {worker} of this shard is gone"),
    };
    // (pinned worker, now, what the shard gets)
    let table = [
        // Its worker here, free: it goes there, never to another one.
        ("w1", NOW, dispatch("w1")),
        // Its worker here, busy: it waits for it.
        ("w2", NOW, Action::Wait),
        // Its worker on another node, live until the threshold has passed since its heartbeat.
        ("w9", heard + DEAD_AFTER, Action::Wait),
        ("w9", heard + DEAD_AFTER + 1, gone("w9")),
        // No record of it at all.
        ("w0", NOW, gone("w0")),
    ];
    for (pinned, now, expected) in table {
        let planned = plan(&base.clone().at(now), &[item(1).shard_of(pinned)]);
        assert!(!expected.holds_back());
        assert_eq!(planned.actions, [expected], "{pinned} at {now}");
    }
}

// ---- limits ----

#[test]
fn limits_throttle_in_priority_order_and_leave_room_for_other_tasks() {
    let world = world(vec![slot("w1", 10, 0)]).used("task:1:a", 1);
    let a = || item(1).limit("task:1:a", 2);
    let planned = plan(&world, &[a(), a(), item(3), a()]);
    assert_eq!(
        planned.actions,
        [
            dispatch("w1"),
            throttled("task limit 2 reached"),
            dispatch("w1"),
            throttled("task limit 2 reached"),
        ]
    );
    assert!(planned.actions[1].holds_back());
}

#[test]
fn pool_and_workflow_limits_are_shared_by_their_tasks() {
    let world = world(vec![slot("w1", 10, 0)]);
    // (the limit both tasks count against, its counter, what the two get)
    let table = [
        (
            "pool:etl",
            1,
            0,
            [dispatch("w1"), throttled("pool limit 1 reached")],
        ),
        (
            "pool:etl",
            2,
            1,
            [dispatch("w1"), throttled("pool limit 2 reached")],
        ),
        ("pool:etl", 3, 1, [dispatch("w1"), dispatch("w1")]),
        (
            "workflow:1",
            1,
            0,
            [dispatch("w1"), throttled("workflow limit 1 reached")],
        ),
    ];
    for (scope, max, used, expected) in table {
        let items = [
            item(1).key("wf/a").limit(scope, max),
            item(2).key("wf/b").limit(scope, max).limit("task:1:b", 5),
        ];
        assert_eq!(
            actions(&world.clone().used(scope, used), &items),
            expected,
            "{scope} {max} {used}"
        );
    }
}

#[test]
fn an_instance_that_goes_nowhere_holds_no_limit_unit() {
    let pool = |item: Item| item.limit("pool:etl", 1);
    let base = world(vec![slot("w1", 10, 0), slot("busy", 1, 1)]).with(record("a-there", 4, 0));
    // (the first instance, what it gets); the second, of the same pool, goes every time.
    let table = [
        // Waiting for its busy shard worker.
        (pool(item(1).shard_of("busy")), Action::Wait),
        // Its route chose another node's worker.
        (
            pool(item(1).routing(Routing::Failover)),
            Action::LeaveToOtherNode,
        ),
        // No worker anywhere carries its labels.
        (
            pool(item(1).labels(&[("gpu", "a100")])),
            no_worker("no live worker with labels gpu=a100"),
        ),
        // Its secrets are missing.
        (
            pool(item(1).secrets_unavailable("no key")),
            hold(DecisionKind::SecretUnavailable, "no key"),
        ),
    ];
    for (first, expected) in table {
        assert_eq!(
            actions(&base, &[first, pool(item(2))]),
            [expected.clone(), dispatch("w1")],
            "{expected:?}"
        );
    }
}

#[test]
fn a_refused_reservation_gives_its_limit_units_and_its_slot_back() {
    let mut placer = Placer::new(Strategy::LeastRunning);
    let mut planner = Planner::new(
        settings(Strategy::LeastRunning),
        NOW,
        vec![slot("w1", 4, 0), slot("w2", 4, 1)],
        BTreeMap::new(),
        &mut placer,
    );
    let a = item(1).limit("pool:etl", 1);
    let b = item(2).limit("pool:etl", 1);
    assert_eq!(planner.decide(&a.waiting(), 0), Ok(dispatch("w1")));
    assert_eq!(
        planner.decide(&b.waiting(), 0),
        Ok(throttled("pool limit 1 reached"))
    );
    // w1's reservation failed: a stays WAITING, b may have the unit, w1 counts as full.
    planner.refused(&a.waiting(), "w1");
    assert_eq!(planner.slots()[0].running, 4);
    assert_eq!(planner.decide(&b.waiting(), 0), Ok(dispatch("w2")));
    assert_eq!(planner.slots()[1].running, 2);
}

// ---- secrets ----

#[test]
fn a_task_whose_secrets_are_unavailable_waits_saying_why() {
    let world = world(vec![slot("w1", 1, 0)]);
    let why = "secret \"db\" (DB_PASSWORD): this node has no secret key";
    let planned = plan(&world, &[item(1).secrets_unavailable(why), item(2)]);
    assert_eq!(
        planned.actions,
        [
            hold(DecisionKind::SecretUnavailable, why),
            // It took no slot.
            dispatch("w1"),
        ]
    );
    assert!(planned.actions[0].holds_back());
}

// ---- placed at creation ----

#[test]
fn only_plain_routes_without_limits_or_secrets_are_placed_at_creation() {
    let s = Strategy::RoundRobin;
    // (routing, limited, needs secrets, the route at creation)
    let table = [
        (Routing::Default, false, false, Some(Route::Strategy(s))),
        (
            Routing::LeastRunning,
            false,
            false,
            Some(Route::Strategy(Strategy::LeastRunning)),
        ),
        (
            Routing::Random,
            false,
            false,
            Some(Route::Strategy(Strategy::Random)),
        ),
        (Routing::Default, true, false, None),
        (Routing::Default, false, true, None),
        (Routing::ShardedBroadcast, false, false, None),
        (Routing::ConsistentHash, false, false, None),
        (Routing::Failover, false, false, None),
    ];
    for (routing, limited, secrets, expected) in table {
        assert_eq!(
            route_at_creation(routing, s, "wf/t", limited, secrets),
            expected,
            "{routing:?} {limited} {secrets}"
        );
    }
}

// ---- details ----

#[test]
fn holding_back_is_what_makes_the_dispatcher_read_deeper() {
    let table = [
        (dispatch("w1"), false),
        (fan_out(&["w1"]), false),
        (
            Action::FailShard {
                reason: "gone".into(),
            },
            false,
        ),
        (throttled("task limit 1 reached"), true),
        (no_worker("no live worker"), true),
        (Action::LeaveToOtherNode, true),
        (Action::Wait, false),
    ];
    for (action, held) in table {
        assert_eq!(action.holds_back(), held, "{action:?}");
    }
}

#[test]
fn no_worker_details_name_the_labels() {
    assert_eq!(labels_text(&BTreeMap::new()), "no live worker");
    let labels = labels(&[("zone", "east"), ("gpu", "a100")]);
    assert_eq!(
        labels_text(&labels),
        "no live worker with labels gpu=a100,zone=east"
    );
}
