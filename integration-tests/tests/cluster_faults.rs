//! The scheduler cluster's proof by faults: three real `ax-scheduler` nodes on one MariaDB
//! database (with Redis, or with each node's in-process guards), three real workers spread over
//! them, real shell tasks, and faults dealt to the nodes: kill -9 of each node in turn, a rolling
//! restart, a node partitioned from the database by a proxy (cut, or blackholed), a node whose
//! database answers late through it (not cut off), and a soak of per-second cron workflows with
//! a node killed every few seconds.
//!
//! Every test judges from a ledger the tasks append to outside ax (`fault_kit`: `instance
//! attempt pid ms start|tick|end`), joined with the store's attempt history: every run ends
//! SUCCESS, no attempt started twice, no two attempts of one instance overlapped, nothing that
//! ran to its end ran again, and every acknowledged log line is stored (each task prints
//! numbered lines, all of which must be in `GetLogs` of its successful attempt).
//!
//! The soak runs 45 s; `AX_SOAK_SECS=300` (any number of seconds) makes it longer. It prints
//! its figures (fires, duplicates, missed slots, kills) on a `soak:` line. Waits give up after
//! generous hang guards; nothing asserts on timing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ax_integration_tests::client::{RUN_GUARD, summary};
use ax_integration_tests::fault_kit::{
    Lines, Note, Scenario, Scene, check_invariants_of_runs, numbered_lines, read_notes, script,
};
use ax_integration_tests::galera::{self, GALERA, GaleraDb};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{HANG_GUARD, ProcessCluster, RedisChoice, WorkerSettings};
use ax_integration_tests::requirements::{MYSQL, REDIS};
use ax_integration_tests::{Backend, TestClient};
use ax_proto::v1 as pb;
use pb::InstanceState as S;
use sqlx::Connection;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(fault_cluster_a_start_after_an_end_is_caught_as_ran_again),
        trial!(async(multi_thread = 2) fault_cluster_kill_9_of_each_node_in_turn_with_redis_loses_nothing_and_runs_nothing_twice).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_cluster_kill_9_of_each_node_in_turn_without_redis_loses_nothing_and_runs_nothing_twice).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_cluster_rolling_restart_of_every_node_under_load_loses_nothing).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_cluster_a_node_cut_off_from_the_database_hands_its_workers_over).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_cluster_a_node_blackholed_from_the_database_hands_its_workers_over).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_cluster_a_node_whose_database_answers_late_is_not_cut_off).requires(&MYSQL),
        trial!(fault_cluster_slot_judge_catches_misses_duplicates_and_tasks_not_run_once),
        trial!(async(multi_thread = 2) fault_cluster_soak_of_per_second_cron_with_nodes_killed_fires_every_slot_once).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_galera_kill_9_of_a_database_member_under_load_cuts_off_only_its_node_and_loses_nothing).requires(&GALERA).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_galera_kill_9_of_each_node_in_turn_loses_nothing_and_runs_nothing_twice).requires(&GALERA).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_galera_soak_of_per_second_cron_with_nodes_killed_fires_every_slot_once).requires(&GALERA).requires(&REDIS),
    ]
}

/// Nodes and workers of every test here.
const NODES: usize = 3;
const WORKERS: usize = 3;
/// Instances of one run of [`dag_workflow`].
const TASKS_PER_RUN: u32 = 200;
/// Runs of the DAG going at once.
const RUNS: u32 = 3;
/// Numbered lines each DAG task prints.
const LINES: u32 = 3;
/// How long the short soak runs; `AX_SOAK_SECS` overrides it.
const SOAK: Duration = Duration::from_secs(45);
/// How often the soak kills a node.
const KILL_EVERY: Duration = Duration::from_secs(3);
/// How long a killed node stays down in the soak before its restart begins.
const DOWN_FOR: Duration = Duration::from_secs(1);
/// A slot this close to the soak's start or end may rightly not have fired (the schedule was
/// just applied, or just paused); every slot between must have.
const SOAK_EDGE_MS: i64 = 2_000;
/// How long a partition lasts at least.
const PARTITION: Duration = Duration::from_secs(8);
/// How often a wait polls.
const POLL: Duration = Duration::from_millis(100);
/// How late a slow proxy passes each chunk on. A lease renewal (a ping, a read of the
/// database's clock and an update: three round trips, each crossing the delay twice) takes at
/// least 480 ms, past the renewal interval (400 ms, a fifth of the 2 s lease). One that must
/// open its connection first (a handshake, the session's settings, the statements' preparation:
/// nine round trips) takes about 1.5 s, still within the 2 s cut-off.
const LATE: Duration = Duration::from_millis(80);
/// How long the database answers late: three cut-off times.
const LATE_FOR: Duration = Duration::from_secs(6);

// ---------------------------------------------------------------------------------------------
// The sandbox.

/// Three nodes, three workers, a client of each node and the tasks' ledger.
struct Nodes {
    cluster: ProcessCluster,
    clients: Vec<TestClient>,
    effects: PathBuf,
    /// The settings of its workers.
    worker: WorkerSettings,
}

/// Three nodes, on a lease of 2 s (the sandbox's), with a dead-worker threshold of twice that
/// (8 × 500 ms), as the defaults have it (20 s and 10 s): a node that loses its store has its
/// lease's length to hand its workers over before the other nodes would find them dead. The
/// workers' kill grace is under the self-fencing margin (3/4 of the 4 s threshold): a fenced
/// task's process group is dead before the other nodes could find its worker dead.
fn scenario(redis: RedisChoice, database_proxies: bool, galera: Option<&GaleraDb>) -> Scenario {
    let scenario = Scenario::new(Backend::MySql);
    // On Galera the default threshold, 20 s (40 × 500 ms): a commit stall of the cluster's
    // (5 s while it drops a member) must not outlast half of it (`membership`).
    let (scenario, dead_after) = match galera {
        Some(db) => (scenario.galera(db), 40),
        None => (scenario, 8),
    };
    scenario
        .nodes(NODES)
        .redis(redis)
        .database_proxies(database_proxies)
        .heartbeats("500ms")
        .dead_after(dead_after)
        .worker_settings(WorkerSettings {
            capacity: Some(8),
            kill_grace: Some("1s".into()),
            ..WorkerSettings::default()
        })
}

impl Nodes {
    /// Starts the nodes and the workers (each knowing every node) and waits until each node holds
    /// one (the nodes spread them).
    async fn start(redis: RedisChoice, database_proxies: bool) -> Nodes {
        Nodes::start_on(redis, database_proxies, None).await
    }

    /// [`Nodes::start`], on `galera` (each node on a member of its own) when given.
    async fn start_on(
        redis: RedisChoice,
        database_proxies: bool,
        galera: Option<&GaleraDb>,
    ) -> Nodes {
        let Scene {
            mut cluster,
            effects,
            worker,
            ..
        } = scenario(redis, database_proxies, galera).start().await;
        let mut clients = Vec::new();
        for index in 0..NODES {
            clients.push(
                cluster
                    .node_client(index)
                    .await
                    .expect("a client of a node"),
            );
        }
        for id in 1..=WORKERS {
            cluster
                .start_worker_with(&format!("w{id}"), &worker)
                .expect("a worker starts");
        }
        let nodes = Nodes {
            effects,
            cluster,
            clients,
            worker,
        };
        let ids: Vec<String> = (0..NODES)
            .map(|index| nodes.id(index).to_string())
            .collect();
        nodes
            .wait_workers(0, "one worker on each node", |on| {
                on.len() == WORKERS
                    && ids
                        .iter()
                        .all(|id| on.values().filter(|node| *node == id).count() == 1)
            })
            .await;
        nodes
    }

    fn id(&self, index: usize) -> &str {
        self.cluster.node_id(index)
    }

    /// The LIVE workers and the node each is on, as node `ask` sees them.
    async fn workers_seen_by(&self, ask: usize) -> anyhow::Result<BTreeMap<String, String>> {
        Ok(self.clients[ask]
            .workers()
            .await?
            .into_iter()
            .filter(|w| w.state() == pb::WorkerState::Live)
            .map(|w| (w.id, w.scheduler_node))
            .collect())
    }

    /// The workers whose stream is on node `index`, as it says itself.
    async fn workers_on(&self, index: usize) -> BTreeSet<String> {
        let seen = self
            .workers_seen_by(index)
            .await
            .expect("the node lists its workers");
        seen.into_iter()
            .filter(|(_, node)| node == self.id(index))
            .map(|(worker, _)| worker)
            .collect()
    }

    /// Waits until the LIVE workers as node `ask` sees them satisfy `done`.
    async fn wait_workers(
        &self,
        ask: usize,
        what: &str,
        done: impl Fn(&BTreeMap<String, String>) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            let last = match self.workers_seen_by(ask).await {
                Ok(seen) if done(&seen) => return,
                Ok(seen) => format!("{seen:?}"),
                Err(err) => format!("{err:#}"),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "not {what} after {HANG_GUARD:?} (asked {}); last seen: {last}",
                self.id(ask)
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until every worker of `moved` is LIVE on a node other than `from`, as node `ask`
    /// sees them from the store.
    async fn wait_moved(&self, ask: usize, moved: &BTreeSet<String>, from: usize) {
        let from = self.id(from).to_string();
        self.wait_workers(ask, &format!("{moved:?} moved off {from}"), |seen| {
            moved
                .iter()
                .all(|w| seen.get(w).is_some_and(|node| *node != from))
        })
        .await;
    }

    /// Applies the 200-task DAG and triggers it [`RUNS`] times.
    async fn start_dag_runs(&self) -> Vec<i64> {
        let dir = self.cluster.dir().to_path_buf();
        let command = script(&dir, "dag", &self.effects, &numbered_lines(LINES, "0.1"));
        let client = &self.clients[0];
        client
            .apply(&dag_workflow("dag", &command))
            .await
            .expect("apply the DAG");
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            runs.push(client.trigger_run("dag").await.expect("trigger").id);
        }
        runs
    }

    /// The instances of `run` not ended yet, with their attempts, as each node reads them from
    /// its own store (on Galera, its own member): what a run that does not end is waiting for.
    async fn unfinished(&self, run: i64) -> String {
        let mut seen = String::new();
        for (index, client) in self.clients.iter().enumerate() {
            let unfinished = client.instances(run).await.map(|instances| {
                instances
                    .into_iter()
                    .filter(|i| matches!(i.state(), S::Waiting | S::Dispatched | S::Running))
                    .collect::<Vec<_>>()
            });
            seen.push_str(&format!(
                "unfinished as {} reads them: {unfinished:#?}\n",
                self.id(index)
            ));
        }
        seen
    }

    /// Waits for the DAG runs to end and checks every invariant; returns the instances.
    async fn finish_dag_runs(&self, runs: &[i64]) -> Vec<pb::Instance> {
        let client = &self.clients[0];
        for run in runs {
            if let Err(err) = client.wait_run(*run).await {
                panic!("the run ends: {err:#}\n{}", self.unfinished(*run).await);
            }
        }
        let instances =
            check_invariants_of_runs(client, runs, &self.effects, Lines::Exactly(LINES.into()))
                .await;
        let failures = ran_again(&read_notes(&self.effects));
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert_eq!(
            instances.len(),
            (RUNS * TASKS_PER_RUN) as usize,
            "instances lost or doubled"
        );
        for instance in &instances {
            assert_eq!(instance.state(), S::Success, "{}", summary(&instances));
        }
        for run in runs {
            let run = client.get_run(*run).await.expect("the run");
            assert_eq!(run.state(), pb::RunState::Success, "run {}", run.id);
        }
        let listed: Vec<i64> = client
            .runs("dag")
            .await
            .expect("the runs")
            .iter()
            .map(|r| r.id)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut expected = runs.to_vec();
        expected.sort();
        assert_eq!(listed, expected, "runs lost or doubled");
        instances
    }

    /// Waits until node `ask` lists every node live.
    async fn wait_all_nodes_live(&self, ask: usize) {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            let last = match self.clients[ask]
                .control()
                .list_nodes(pb::ListNodesRequest {})
                .await
            {
                Ok(listed) => {
                    let nodes = listed.into_inner().nodes;
                    if nodes.len() == NODES && nodes.iter().all(|n| n.live) {
                        return;
                    }
                    format!("{nodes:?}")
                }
                Err(status) => status.to_string(),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "not every node live after {HANG_GUARD:?}: {last}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

/// A 200-task DAG of fan-outs, fan-ins and chains, every task running `command`: a root fans
/// out to three branches, each a chain of six that fans out to fifty and back into a join; the
/// joins meet in a sink that fans out to twenty-six and back into the last task.
fn dag_workflow(name: &str, command: &str) -> String {
    let mut tasks: Vec<(String, Vec<String>)> = vec![("root".into(), Vec::new())];
    let mut joins = Vec::new();
    for branch in 1..=3 {
        let mut previous = "root".to_string();
        for link in 1..=6 {
            let task = format!("b{branch}-chain{link}");
            tasks.push((task.clone(), vec![previous]));
            previous = task;
        }
        let fan: Vec<String> = (1..=50).map(|f| format!("b{branch}-fan{f:02}")).collect();
        for task in &fan {
            tasks.push((task.clone(), vec![previous.clone()]));
        }
        let join = format!("b{branch}-join");
        tasks.push((join.clone(), fan));
        joins.push(join);
    }
    tasks.push(("sink".into(), joins));
    let fan: Vec<String> = (1..=26).map(|f| format!("tail{f:02}")).collect();
    for task in &fan {
        tasks.push((task.clone(), vec!["sink".into()]));
    }
    tasks.push(("last".into(), fan));
    assert_eq!(tasks.len(), TASKS_PER_RUN as usize);

    let mut yaml =
        format!("name: {name}\ndefaults: {{ retries: 3, retry_backoff: 100ms }}\ntasks:\n");
    let command = command.replace('\\', "\\\\").replace('"', "\\\"");
    for (task, upstream) in tasks {
        yaml.push_str(&format!("  - name: {task}\n    command: \"{command}\"\n"));
        if !upstream.is_empty() {
            yaml.push_str(&format!("    upstream: [{}]\n", upstream.join(", ")));
        }
    }
    yaml
}

/// Instances that succeeded across `runs`, as one node counts them.
async fn succeeded(client: &TestClient, runs: &[i64]) -> anyhow::Result<u32> {
    let mut total = 0;
    for run in runs {
        total += client.get_run(*run).await?.counts.map_or(0, |c| c.success);
    }
    Ok(total)
}

/// Waits until at least `at_least` instances of `runs` succeeded, and returns how many did.
async fn wait_succeeded(client: &TestClient, runs: &[i64], at_least: u32, what: &str) -> u32 {
    let deadline = tokio::time::Instant::now() + RUN_GUARD;
    loop {
        let last = match succeeded(client, runs).await {
            Ok(done) if done >= at_least => return done,
            Ok(done) => format!("{done} succeeded"),
            Err(err) => format!("no answer from {}: {err:#}", client.endpoint()),
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {at_least} instances succeeded ({what}) after {RUN_GUARD:?}; last seen: {last}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Attempts that had started and not ended, by the ledger.
pub(crate) fn in_flight(notes: &[Note]) -> usize {
    let ended: BTreeSet<(i64, u32)> = notes
        .iter()
        .filter(|n| n.what == "end")
        .map(|n| (n.instance, n.attempt))
        .collect();
    notes
        .iter()
        .filter(|n| n.what == "start" && !ended.contains(&(n.instance, n.attempt)))
        .count()
}

/// Nothing that ran to its end ran again: no attempt of an instance starts after an attempt of
/// it wrote its `end` note (the tasks here cannot fail once they are there).
pub(crate) fn ran_again(notes: &[Note]) -> Vec<String> {
    let mut ended: BTreeMap<i64, &Note> = BTreeMap::new();
    let mut failures = Vec::new();
    for note in notes {
        if let Some(end) = ended.get(&note.instance)
            && note.what == "start"
        {
            failures.push(format!(
                "instance {} ran again as attempt {} (line {}) after attempt {} ran to its end (line {})",
                note.instance, note.attempt, note.index, end.attempt, end.index
            ));
        }
        if note.what == "end" {
            ended.insert(note.instance, note);
        }
    }
    failures
}

/// Instances that needed more than one attempt.
pub(crate) fn retried(instances: &[pb::Instance]) -> usize {
    instances.iter().filter(|i| i.attempts.len() > 1).count()
}

/// The ran-again check itself: a retry after a failed attempt passes, a start after an end is
/// caught.
fn fault_cluster_a_start_after_an_end_is_caught_as_ran_again() {
    let note = |index: usize, attempt: u32, what: &str| Note {
        index,
        instance: 1,
        attempt,
        pid: 10 + attempt,
        at_ms: index as i64,
        what: what.into(),
    };
    let retried = [note(0, 1, "start"), note(1, 2, "start"), note(2, 2, "end")];
    assert_eq!(ran_again(&retried), Vec::<String>::new());
    let again = [note(0, 1, "start"), note(1, 1, "end"), note(2, 2, "start")];
    let found = ran_again(&again);
    assert!(
        found.len() == 1 && found[0].contains("ran again as attempt 2"),
        "{found:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Kill -9 of each node in turn, and a rolling restart.

/// How a node is taken down.
#[derive(Debug, Clone, Copy)]
enum Down {
    /// kill -9: no lease given up, no stream closed; the restart waits out the old lease.
    Killed,
    /// SIGTERM and a clean exit; the restart follows at once.
    Stopped,
}

/// Takes each node down in turn (n1, n2, n3) while DAG runs are going, each when another
/// quarter of the instances has succeeded; checks that its workers move to the other nodes and
/// that work goes on without it, then starts it again (same id, same port) before the next.
async fn each_node_down_in_turn(redis: RedisChoice, down: Down, galera: Option<&GaleraDb>) {
    let mut nodes = Nodes::start_on(redis, false, galera).await;
    let runs = nodes.start_dag_runs().await;
    let total = RUNS * TASKS_PER_RUN;
    let mut in_flight_at = Vec::new();
    for index in 0..NODES {
        let other = (index + 1) % NODES;
        let quarter = total * (index as u32 + 1) / 4;
        wait_succeeded(&nodes.clients[other], &runs, quarter, "before the fault").await;
        let held = nodes.workers_on(index).await;
        assert!(
            !held.is_empty(),
            "{} holds no worker when it goes down",
            nodes.id(index)
        );
        match down {
            Down::Killed => nodes.cluster.kill_node(index).await.expect("kill -9"),
            Down::Stopped => nodes.cluster.stop_node(index).await.expect("SIGTERM"),
        }
        in_flight_at.push(in_flight(&read_notes(&nodes.effects)));
        nodes.wait_moved(other, &held, index).await;
        let done = succeeded(&nodes.clients[other], &runs).await.unwrap_or(0);
        let what = format!("while {} is down", nodes.id(index));
        // On a slow machine most of the work may be done by the time the workers moved.
        wait_succeeded(&nodes.clients[other], &runs, (done + 30).min(total), &what).await;
        nodes
            .cluster
            .start_node(index)
            .await
            .expect("the node starts again under its id");
    }
    nodes.wait_all_nodes_live(0).await;
    let instances = nodes.finish_dag_runs(&runs).await;
    assert!(
        in_flight_at.iter().sum::<usize>() > 0,
        "no attempt was in flight at any fault: the test proved nothing"
    );
    println!(
        "{down:?} each node in turn: {} runs of {TASKS_PER_RUN} tasks; attempts in flight at the faults {in_flight_at:?}; {} instances needed another attempt",
        runs.len(),
        retried(&instances)
    );
    nodes.cluster.shutdown().await.expect("clean shutdown");
}

async fn fault_cluster_kill_9_of_each_node_in_turn_with_redis_loses_nothing_and_runs_nothing_twice()
{
    each_node_down_in_turn(RedisChoice::FromEnv, Down::Killed, None).await;
}

async fn fault_cluster_kill_9_of_each_node_in_turn_without_redis_loses_nothing_and_runs_nothing_twice()
 {
    each_node_down_in_turn(RedisChoice::None, Down::Killed, None).await;
}

async fn fault_cluster_rolling_restart_of_every_node_under_load_loses_nothing() {
    each_node_down_in_turn(RedisChoice::FromEnv, Down::Stopped, None).await;
}

// ---------------------------------------------------------------------------------------------
// A node partitioned from the database.

/// How the proxy partitions the node from MariaDB.
#[derive(Debug, Clone, Copy)]
enum Partition {
    /// Connections closed and refused: every store call fails at once.
    Cut,
    /// Connections silent: store calls hang until the node's own timeouts.
    Blackhole,
}

/// Partitions `n2` from the database while DAG runs are going. The node stops dispatching and
/// closes its workers' streams, so they move to the other nodes; nothing is lost and nothing
/// runs twice; after the heal the node holds its lease again and dispatches to a worker that
/// knows only it.
async fn a_node_partitioned_from_the_database(redis: RedisChoice, partition: Partition) {
    let mut nodes = Nodes::start(redis, true).await;
    let cut_off = 1;
    let runs = nodes.start_dag_runs().await;
    let total = RUNS * TASKS_PER_RUN;
    wait_succeeded(&nodes.clients[0], &runs, total / 4, "before the partition").await;
    let held = nodes.workers_on(cut_off).await;
    assert!(!held.is_empty(), "n2 holds no worker at the partition");
    let proxy = nodes
        .cluster
        .database_proxy(cut_off)
        .expect("n2's proxy to the database");
    match partition {
        Partition::Cut => proxy.cut(),
        Partition::Blackhole => proxy.blackhole(),
    }
    let partitioned_at = tokio::time::Instant::now();
    let in_flight_at_partition = in_flight(&read_notes(&nodes.effects));

    nodes.wait_moved(0, &held, cut_off).await;
    // The cut-off node answers at once, with the reason (it used to wait for a database
    // connection until its pool gave up, 30 s; 5 s only catches a hang).
    let asked = tokio::time::Instant::now();
    let answer = nodes.clients[cut_off]
        .control()
        .get_run(pb::GetRunRequest { id: runs[0] })
        .await;
    assert!(
        matches!(&answer, Err(status) if status.code() == tonic::Code::Unavailable
            && status.message().contains("cannot reach its store")),
        "{answer:?}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the cut-off node took {:?} to answer",
        asked.elapsed()
    );
    let done = succeeded(&nodes.clients[0], &runs).await.unwrap_or(0);
    // On a slow machine most of the work may be done by the time the workers moved.
    wait_succeeded(
        &nodes.clients[0],
        &runs,
        (done + 30).min(total),
        "while n2 is cut off",
    )
    .await;
    tokio::time::sleep(PARTITION.saturating_sub(partitioned_at.elapsed())).await;
    nodes
        .cluster
        .database_proxy(cut_off)
        .expect("n2's proxy to the database")
        .heal();

    // n2 serves again: its lease is live and it dispatches to a worker that knows only it.
    nodes.wait_all_nodes_live(0).await;
    let only_n2 = WorkerSettings {
        endpoint: Some(nodes.cluster.node_endpoint(cut_off)),
        labels: vec![("only".into(), "n2".into())],
        ..nodes.worker.clone()
    };
    nodes
        .cluster
        .start_worker_with("w4", &only_n2)
        .expect("a worker of n2 alone");
    nodes
        .wait_workers(0, "w4 on n2", |seen| {
            seen.get("w4").map(String::as_str) == Some("n2")
        })
        .await;
    let after = "name: after-heal\ntasks:\n  - name: on-n2\n    command: echo served\n    labels: {only: n2}\n";
    nodes.clients[0].apply(after).await.expect("apply");
    let (_, ended) = nodes.clients[0]
        .run_to_end("after-heal")
        .await
        .expect("a run after the heal");
    assert_eq!(
        ended.state(),
        pb::RunState::Success,
        "n2 does not dispatch after the heal"
    );

    let instances = nodes.finish_dag_runs(&runs).await;
    println!(
        "{partition:?} of n2 from the database: {in_flight_at_partition} attempts in flight at the partition; workers {held:?} moved; {} instances needed another attempt",
        retried(&instances)
    );
    nodes.cluster.shutdown().await.expect("clean shutdown");
}

async fn fault_cluster_a_node_cut_off_from_the_database_hands_its_workers_over() {
    a_node_partitioned_from_the_database(RedisChoice::None, Partition::Cut).await;
}

async fn fault_cluster_a_node_blackholed_from_the_database_hands_its_workers_over() {
    a_node_partitioned_from_the_database(RedisChoice::FromEnv, Partition::Blackhole).await;
}

/// A node whose database answers every renewal later than the renewal interval, but within the
/// cut-off time, still reaches its store: it is not cut off (its workers would leave it for
/// nothing), and its lease stays live.
async fn fault_cluster_a_node_whose_database_answers_late_is_not_cut_off() {
    let Scene {
        cluster, client, ..
    } = scenario(RedisChoice::None, true, None)
        .nodes(1)
        .start()
        .await;
    let proxy = cluster
        .database_proxy(0)
        .expect("n1's proxy to the database");
    wait_renewed(&client).await;
    proxy.slow(LATE);
    tokio::time::sleep(LATE_FOR).await;
    let nodes = client
        .control()
        .list_nodes(pb::ListNodesRequest {})
        .await
        .expect("n1 lists the nodes")
        .into_inner()
        .nodes;
    proxy.heal();
    let log = cluster.node_logs(0);
    assert!(
        !log.contains("this node cannot reach its store"),
        "a database that answers late cut n1 off:\n{log}"
    );
    assert!(
        nodes.iter().all(|node| node.live),
        "n1's lease lapsed while its database answered late: {nodes:?}"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

/// Waits until the node of `client` has renewed its lease since it claimed it: its lease
/// connection is open then, and a renewal is its three round trips.
async fn wait_renewed(client: &TestClient) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let last = match client.control().list_nodes(pb::ListNodesRequest {}).await {
            Ok(listed) => {
                let nodes = listed.into_inner().nodes;
                if nodes.iter().all(|n| n.renewed_at_ms > n.started_at_ms) {
                    return;
                }
                format!("{nodes:?}")
            }
            Err(status) => status.to_string(),
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lease renewed after {HANG_GUARD:?}: {last}"
        );
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The soak.

/// Per-second cron workflows of the soak.
const SOAK_WORKFLOWS: [&str; 3] = ["soak-a", "soak-b", "soak-c"];
/// Numbered lines each soak task prints.
const SOAK_LINES: u32 = 2;

/// One line of the soak's slot ledger: `workflow slot instance attempt start|end`.
#[derive(Debug)]
pub(crate) struct SlotNote {
    pub(crate) workflow: String,
    pub(crate) slot_ms: i64,
    pub(crate) what: String,
}

pub(crate) fn read_slot_notes(path: &Path) -> Vec<SlotNote> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 5, "malformed ledger line {line:?}");
            let slot_ms = chrono::DateTime::parse_from_rfc3339(fields[1])
                .unwrap_or_else(|e| panic!("ledger line {line:?}: {e}"))
                .timestamp_millis();
            SlotNote {
                workflow: fields[0].to_string(),
                slot_ms,
                what: fields[4].to_string(),
            }
        })
        .collect()
}

/// A run as the store has it.
#[derive(Debug)]
pub(crate) struct StoredRun {
    pub(crate) id: i64,
    pub(crate) workflow: String,
    pub(crate) logical_time: i64,
    pub(crate) dedup_key: Option<String>,
    pub(crate) state: String,
}

/// Every run of the store, read from the database itself.
pub(crate) async fn stored_runs(url: &str) -> Vec<StoredRun> {
    let mut conn = sqlx::MySqlConnection::connect(url)
        .await
        .expect("connect to the store");
    let rows: Vec<(i64, String, i64, Option<String>, String)> = sqlx::query_as(
        "SELECT r.id, w.name, r.logical_time, r.dedup_key, r.state \
         FROM run r JOIN workflow w ON w.id = r.workflow_id ORDER BY r.id",
    )
    .fetch_all(&mut conn)
    .await
    .expect("read the runs");
    rows.into_iter()
        .map(|(id, workflow, logical_time, dedup_key, state)| StoredRun {
            id,
            workflow,
            logical_time,
            dedup_key,
            state,
        })
        .collect()
}

/// The soak's verdict on one workflow's slots.
#[derive(Debug, Default)]
pub(crate) struct SlotFigures {
    pub(crate) fires: usize,
    pub(crate) in_window: usize,
    pub(crate) duplicates: Vec<String>,
    pub(crate) missed: Vec<i64>,
    pub(crate) not_run_once: Vec<String>,
}

/// Judges one workflow: every slot of the window has exactly one run (dedup key
/// `cron:<slot>`), every run's task ran exactly once to its end by the ledger, and no slot has
/// two runs or two executions.
pub(crate) fn judge_slots(
    workflow: &str,
    runs: &[StoredRun],
    ledger: &[SlotNote],
    window: (i64, i64),
) -> SlotFigures {
    let mut figures = SlotFigures::default();
    let mut by_slot: BTreeMap<i64, Vec<&StoredRun>> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.workflow == workflow) {
        by_slot.entry(run.logical_time).or_default().push(run);
        figures.fires += 1;
        let expected = format!("cron:{}", run.logical_time);
        if run.dedup_key.as_deref() != Some(expected.as_str()) {
            figures.duplicates.push(format!(
                "run {} of slot {} has dedup key {:?}",
                run.id, run.logical_time, run.dedup_key
            ));
        }
    }
    for (slot, runs) in &by_slot {
        if runs.len() > 1 {
            figures
                .duplicates
                .push(format!("slot {slot} has {} runs", runs.len()));
        }
        let count = |what: &str| {
            ledger
                .iter()
                .filter(|n| n.workflow == workflow && n.slot_ms == *slot && n.what == what)
                .count()
        };
        let (starts, ends) = (count("start"), count("end"));
        if starts > 1 {
            figures
                .duplicates
                .push(format!("slot {slot} started {starts} times"));
        }
        if starts != 1 || ends != 1 {
            figures
                .not_run_once
                .push(format!("slot {slot}: {starts} starts, {ends} ends"));
        }
    }
    let (first, last) = window;
    let mut slot = (first + 999).div_euclid(1_000) * 1_000;
    while slot <= last {
        figures.in_window += 1;
        if !by_slot.contains_key(&slot) {
            figures.missed.push(slot);
        }
        slot += 1_000;
    }
    figures
}

/// The slot judge itself: a clean history passes, and a missed slot, a doubled run, a run with
/// another key and a task run twice or not at all are each caught. Without this, a judge that
/// never complains would make the soak pass.
fn fault_cluster_slot_judge_catches_misses_duplicates_and_tasks_not_run_once() {
    let run = |id: i64, slot: i64, key: &str| StoredRun {
        id,
        workflow: "w".into(),
        logical_time: slot,
        dedup_key: Some(key.into()),
        state: "SUCCESS".into(),
    };
    let note = |slot: i64, what: &str| SlotNote {
        workflow: "w".into(),
        slot_ms: slot,
        what: what.into(),
    };
    let ran = |slots: &[i64]| -> Vec<SlotNote> {
        slots
            .iter()
            .flat_map(|s| [note(*s, "start"), note(*s, "end")])
            .collect()
    };
    let clean = [run(1, 1_000, "cron:1000"), run(2, 2_000, "cron:2000")];
    let figures = judge_slots("w", &clean, &ran(&[1_000, 2_000]), (1_000, 2_000));
    assert_eq!((figures.fires, figures.in_window), (2, 2), "{figures:?}");
    assert!(
        figures.duplicates.is_empty() && figures.missed.is_empty(),
        "{figures:?}"
    );
    assert!(figures.not_run_once.is_empty(), "{figures:?}");

    let missed = judge_slots("w", &clean, &ran(&[1_000, 2_000]), (1_000, 3_000));
    assert_eq!(missed.missed, [3_000], "{missed:?}");

    let doubled = [run(1, 1_000, "cron:1000"), run(2, 1_000, "key:again")];
    let figures = judge_slots("w", &doubled, &ran(&[1_000]), (1_000, 1_000));
    assert_eq!(figures.duplicates.len(), 2, "{figures:?}");

    let mut twice = ran(&[1_000, 2_000]);
    twice.push(note(2_000, "start"));
    let figures = judge_slots("w", &clean, &twice, (1_000, 2_000));
    assert_eq!(figures.duplicates.len(), 1, "{figures:?}");
    assert_eq!(figures.not_run_once.len(), 1, "{figures:?}");

    let figures = judge_slots("w", &clean, &ran(&[1_000]), (1_000, 2_000));
    assert_eq!(figures.not_run_once.len(), 1, "{figures:?}");
}

fn soak_duration() -> Duration {
    match std::env::var("AX_SOAK_SECS") {
        Ok(secs) => Duration::from_secs(
            secs.trim()
                .parse()
                .unwrap_or_else(|_| panic!("AX_SOAK_SECS={secs:?} is not a number of seconds")),
        ),
        Err(_) => SOAK,
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Three per-second cron workflows over three nodes, a node killed with -9 every few seconds
/// (one at a time, so at least one is always up) and started again: 0 duplicate fires, 0 slots
/// missed, every slot's task run exactly once to SUCCESS, no attempt started twice or
/// overlapping. 45 s by default; `AX_SOAK_SECS=300` for a longer soak.
async fn fault_cluster_soak_of_per_second_cron_with_nodes_killed_fires_every_slot_once() {
    soak_with_nodes_killed(None).await;
}

/// The soak, on `galera` (each node on a member of its own) when given.
async fn soak_with_nodes_killed(galera: Option<&GaleraDb>) {
    let soak = soak_duration();
    let mut nodes = Nodes::start_on(RedisChoice::FromEnv, false, galera).await;
    let dir = nodes.cluster.dir().to_path_buf();
    let ledger = dir.join("slots");
    let body = format!(
        "S='{}'\nslot() {{ echo \"$AX_WORKFLOW $AX_LOGICAL_TIME $AX_INSTANCE_ID $AX_ATTEMPT $1\" >> \"$S\"; }}\nslot start\n{}\nslot end",
        ledger.display(),
        numbered_lines(SOAK_LINES, "0.1")
    );
    // One script writes both: the shared checker's notes (through `script`) and the slots.
    let command = script(&dir, "soak", &nodes.effects, &body);
    let applied_ms = now_ms();
    for workflow in SOAK_WORKFLOWS {
        let yaml = format!(
            "name: {workflow}\n\
             schedule: {{cron: '* * * * * *', misfire: catch_up, max_catch_up: 1000}}\n\
             defaults: {{ retries: 3, retry_backoff: 100ms }}\n\
             tasks:\n  - name: tick\n    command: \"{}\"\n",
            command.replace('\\', "\\\\").replace('"', "\\\"")
        );
        nodes.clients[0].apply(&yaml).await.expect("apply");
    }

    let started = tokio::time::Instant::now();
    let mut kills = 0usize;
    while started.elapsed() + KILL_EVERY < soak {
        tokio::time::sleep(KILL_EVERY).await;
        let index = kills % NODES;
        nodes.cluster.kill_node(index).await.expect("kill -9");
        kills += 1;
        tokio::time::sleep(DOWN_FOR).await;
        nodes
            .cluster
            .start_node(index)
            .await
            .expect("the node starts again under its id");
    }
    tokio::time::sleep(soak.saturating_sub(started.elapsed())).await;
    let paused_ms = now_ms();
    for workflow in SOAK_WORKFLOWS {
        nodes.clients[0].pause(workflow).await.expect("pause");
    }

    // A fire pass under way at the pause may still create a run: read until none is new.
    let url = nodes.cluster.store_url().to_string();
    let mut runs = stored_runs(&url).await;
    loop {
        for run in &runs {
            nodes.clients[0]
                .wait_run(run.id)
                .await
                .expect("the run ends");
        }
        let again = stored_runs(&url).await;
        let settled = again.len() == runs.len();
        runs = again;
        if settled {
            break;
        }
    }
    let run_ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
    let instances = check_invariants_of_runs(
        &nodes.clients[0],
        &run_ids,
        &nodes.effects,
        Lines::Exactly(SOAK_LINES.into()),
    )
    .await;
    let failures = ran_again(&read_notes(&nodes.effects));
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    let slots = read_slot_notes(&ledger);
    let window = (applied_ms + SOAK_EDGE_MS, paused_ms - SOAK_EDGE_MS);
    let mut fires = 0;
    let mut in_window = 0;
    let mut duplicates = Vec::new();
    let mut missed = Vec::new();
    let mut not_run_once = Vec::new();
    for workflow in SOAK_WORKFLOWS {
        let figures = judge_slots(workflow, &runs, &slots, window);
        fires += figures.fires;
        in_window += figures.in_window;
        duplicates.extend(
            figures
                .duplicates
                .iter()
                .map(|d| format!("{workflow}: {d}")),
        );
        missed.extend(figures.missed.iter().map(|m| format!("{workflow}: {m}")));
        not_run_once.extend(
            figures
                .not_run_once
                .iter()
                .map(|n| format!("{workflow}: {n}")),
        );
    }
    let unsuccessful: Vec<String> = runs
        .iter()
        .filter(|r| r.state != "SUCCESS")
        .map(|r| {
            format!(
                "run {} ({} slot {}): {}",
                r.id, r.workflow, r.logical_time, r.state
            )
        })
        .collect();
    println!(
        "soak: {} s, {} workflows, {kills} kills, {fires} fires, {in_window} slots in the window, {} duplicates, {} missed, {} not run exactly once, {} runs not SUCCESS, {} instances needed another attempt",
        soak.as_secs(),
        SOAK_WORKFLOWS.len(),
        duplicates.len(),
        missed.len(),
        not_run_once.len(),
        unsuccessful.len(),
        retried(&instances)
    );
    assert!(duplicates.is_empty(), "duplicate fires: {duplicates:?}");
    assert!(missed.is_empty(), "missed slots: {missed:?}");
    assert!(
        not_run_once.is_empty(),
        "slots not run exactly once: {not_run_once:?}"
    );
    assert!(
        unsuccessful.is_empty(),
        "runs not SUCCESS: {unsuccessful:?}"
    );
    assert!(kills >= 3, "only {kills} kills: the soak proved little");
    assert!(
        in_window as u64 >= SOAK_WORKFLOWS.len() as u64 * (soak.as_secs() - 5),
        "the window holds only {in_window} slots"
    );
    nodes.cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// On a multi-primary Galera cluster: each node on a member of its own.

/// How long a killed Galera member stays down.
const MEMBER_DOWN: Duration = Duration::from_secs(10);

/// Runs `test` on a database of its own on the Galera cluster, alone among the Galera tests.
async fn on_galera<F, Fut>(test: F)
where
    F: FnOnce(GaleraDb) -> Fut,
    Fut: std::future::Future<Output = GaleraDb>,
{
    let _alone = galera::exclusive().await;
    let db = GaleraDb::create().await.expect("a Galera database");
    let db = test(db).await;
    db.drop_database().await.expect("drop the Galera database");
}

/// kill -9 of the Galera member under `n2` while DAG runs are going, and its rejoin. `n2`'s
/// renewals fail, so it is cut off and its workers move; `n1` and `n3` wait out the cluster's
/// commit stall while it drops the member and are not cut off. Nothing is lost or run twice.
async fn fault_galera_kill_9_of_a_database_member_under_load_cuts_off_only_its_node_and_loses_nothing()
 {
    on_galera(|db| async move {
        let nodes = Nodes::start_on(RedisChoice::FromEnv, false, Some(&db)).await;
        let (member, node) = (2, 1);
        let runs = nodes.start_dag_runs().await;
        let total = RUNS * TASKS_PER_RUN;
        wait_succeeded(&nodes.clients[0], &runs, total / 4, "before the kill").await;
        let held = nodes.workers_on(node).await;
        assert!(!held.is_empty(), "n2 holds no worker when its member dies");
        galera::kill(member).await.expect("kill -9 of member 2");
        let killed_at = tokio::time::Instant::now();
        let in_flight_at_kill = in_flight(&read_notes(&nodes.effects));
        nodes.wait_moved(0, &held, node).await;
        let done = succeeded(&nodes.clients[0], &runs).await.unwrap_or(0);
        wait_succeeded(
            &nodes.clients[0],
            &runs,
            (done + 30).min(total),
            "while member 2 is down",
        )
        .await;
        tokio::time::sleep(MEMBER_DOWN.saturating_sub(killed_at.elapsed())).await;
        galera::rejoin(member).await.expect("member 2 rejoins");
        nodes.wait_all_nodes_live(0).await;
        let instances = nodes.finish_dag_runs(&runs).await;
        for index in [0, 2] {
            let log = nodes.cluster.node_logs(index);
            assert!(
                !log.contains("this node cannot reach its store"),
                "{} was cut off by another member's death:\n{log}",
                nodes.id(index)
            );
        }
        assert!(
            nodes
                .cluster
                .node_logs(node)
                .contains("this node cannot reach its store"),
            "n2 was not cut off when its member died"
        );
        println!(
            "Galera member 2 killed for {} s: {in_flight_at_kill} attempts in flight at the kill; workers {held:?} moved; {} instances needed another attempt",
            MEMBER_DOWN.as_secs(),
            retried(&instances)
        );
        nodes.cluster.shutdown().await.expect("clean shutdown");
        db
    })
    .await;
}

async fn fault_galera_kill_9_of_each_node_in_turn_loses_nothing_and_runs_nothing_twice() {
    on_galera(|db| async move {
        each_node_down_in_turn(RedisChoice::FromEnv, Down::Killed, Some(&db)).await;
        db
    })
    .await;
}

async fn fault_galera_soak_of_per_second_cron_with_nodes_killed_fires_every_slot_once() {
    on_galera(|db| async move {
        soak_with_nodes_killed(Some(&db)).await;
        db
    })
    .await;
}
