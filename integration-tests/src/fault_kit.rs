//! What the fault tests share: the [`Scenario`] each sets up before its fault, tasks that append
//! to a ledger outside ax (the side-effect file), the checker of the invariants every fault test
//! promises, read from that ledger joined with the store's attempt history (through a
//! [`TestClient`]), and helpers for the processes a fault leaves behind. Waits give up after
//! generous hang guards; nothing here measures time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ax_proto::v1 as pb;
use pb::InstanceState as S;

use crate::Backend;
use crate::client::{RUN_GUARD, TestClient, summary};
use crate::process::{ProcessCluster, RedisChoice, SchedulerSettings, WorkerSettings};
use crate::proxy::TcpProxy;

// ---------------------------------------------------------------------------------------------
// Tasks and their side effects.

/// The shell prelude of every task: `note WHAT` appends `instance attempt pid ms WHAT` to the
/// side-effect file. `$$` is the pid of the `/bin/sh` the worker started, which is the pid the
/// worker reports. A line is one small `O_APPEND` write, so the file's order is the order in
/// which the tasks wrote.
pub fn prelude(effects: &Path) -> String {
    format!(
        "F='{}'\nnote() {{ echo \"$AX_INSTANCE_ID $AX_ATTEMPT $$ $(date +%s%3N) $1\" >> \"$F\"; }}\n",
        effects.display()
    )
}

/// Writes `body` (with the prelude, a `start` note before and an `end` note after) as a script
/// in `dir`, and returns the command that runs it in the worker's own shell (`.`), so that `$$`
/// stays the pid the worker started.
pub fn script(dir: &Path, name: &str, effects: &Path, body: &str) -> String {
    let path = dir.join(format!("{name}.sh"));
    let text = format!("{}note start\n{body}\nnote end\n", prelude(effects));
    std::fs::write(&path, text).expect("write the task script");
    format!(". '{}'", path.display())
}

/// Shell that prints `line 1` … `line N` on stdout, each followed by a `tick` note and a pause.
pub fn numbered_lines(count: u32, pause: &str) -> String {
    format!(
        "i=1\nwhile [ $i -le {count} ]; do echo \"line $i\"; note tick; i=$((i + 1)); sleep {pause}; done"
    )
}

/// A workflow file: `header` (already YAML, e.g. `defaults: {…}`) and tasks of (name, command).
pub fn workflow(name: &str, header: &str, tasks: &[(String, String)]) -> String {
    let mut yaml = format!("name: {name}\n{header}\ntasks:\n");
    for (task, command) in tasks {
        yaml.push_str(&format!(
            "  - name: {task}\n    command: \"{}\"\n",
            command.replace('\\', "\\\\").replace('"', "\\\"")
        ));
    }
    yaml
}

/// One line of the side-effect file.
#[derive(Debug, Clone)]
pub struct Note {
    /// Position in the file, from 0.
    pub index: usize,
    pub instance: i64,
    pub attempt: u32,
    pub pid: u32,
    pub at_ms: i64,
    pub what: String,
}

pub fn read_notes(path: &Path) -> Vec<Note> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .enumerate()
        .map(|(index, line)| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(
                fields.len(),
                5,
                "malformed side-effect line {index}: {line:?}"
            );
            let parse = |i: usize| -> i64 {
                fields[i]
                    .parse()
                    .unwrap_or_else(|e| panic!("side-effect line {index} {line:?}: {e}"))
            };
            Note {
                index,
                instance: parse(0),
                attempt: parse(1) as u32,
                pid: parse(2) as u32,
                at_ms: parse(3),
                what: fields[4].to_string(),
            }
        })
        .collect()
}

/// The pids of the shells of the `start` notes that match.
pub fn started_pids(notes: &[Note], keep: impl Fn(&Note) -> bool) -> Vec<u32> {
    notes
        .iter()
        .filter(|n| n.what == "start" && keep(n))
        .map(|n| n.pid)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The shared checker.

/// The invariants that the attempt history and the side-effect notes alone decide (see
/// [`check_invariants`]), as one message per violation.
pub fn violations(instances: &[pb::Instance], notes: &[Note]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut by_attempt: BTreeMap<(i64, u32), Vec<&Note>> = BTreeMap::new();
    for note in notes {
        by_attempt
            .entry((note.instance, note.attempt))
            .or_default()
            .push(note);
    }
    let known: BTreeMap<i64, &pb::Instance> = instances.iter().map(|i| (i.id, i)).collect();

    for instance in instances {
        let state = instance.state();
        if !matches!(state, S::Success | S::Failed | S::Timeout | S::Cancelled) {
            failures.push(format!(
                "instance {} ({}) is not terminal: {state:?}",
                instance.id, instance.task
            ));
        }
        let numbers: Vec<u32> = instance.attempts.iter().map(|a| a.attempt).collect();
        let expected: Vec<u32> = (1..=instance.attempt).collect();
        if numbers != expected {
            failures.push(format!(
                "instance {} has attempts {numbers:?}, expected {expected:?}",
                instance.id
            ));
        }
        for attempt in &instance.attempts {
            let key = (instance.id, attempt.attempt);
            let Some(notes) = by_attempt.get(&key) else {
                if attempt.state() == S::Success {
                    failures.push(format!(
                        "attempt {key:?} succeeded but its process left no note"
                    ));
                }
                continue;
            };
            let starts = notes.iter().filter(|n| n.what == "start").count();
            if starts != 1 {
                failures.push(format!("attempt {key:?} started {starts} times: {notes:?}"));
            }
            let pids: BTreeSet<u32> = notes.iter().map(|n| n.pid).collect();
            if pids.len() != 1 {
                failures.push(format!("attempt {key:?} ran in several processes {pids:?}"));
            }
            if attempt.pid != 0 && !pids.contains(&attempt.pid) {
                failures.push(format!(
                    "attempt {key:?} is stored with pid {} but ran as {pids:?}",
                    attempt.pid
                ));
            }
            if attempt.state() == S::Success && !notes.iter().any(|n| n.what == "end") {
                failures.push(format!(
                    "attempt {key:?} succeeded without reaching its end: {notes:?}"
                ));
            }
        }
    }
    for (instance, attempt) in by_attempt.keys() {
        let current = known.get(instance).map(|i| i.attempt);
        if current.is_none_or(|current| *attempt > current) {
            failures.push(format!(
                "a process ran attempt {attempt} of instance {instance}, which the store does not know (current {current:?})"
            ));
        }
    }

    // Overlap: walk the file in order, per instance.
    let mut newest: BTreeMap<i64, &Note> = BTreeMap::new();
    for note in notes {
        match newest.get(&note.instance) {
            Some(latest) if note.attempt < latest.attempt => failures.push(format!(
                "attempt {} of instance {} was alive (line {}: {} at {} ms) after attempt {} started (line {} at {} ms)",
                note.attempt,
                note.instance,
                note.index,
                note.what,
                note.at_ms,
                latest.attempt,
                latest.index,
                latest.at_ms
            )),
            Some(latest) if note.attempt == latest.attempt => {}
            _ => {
                if note.what != "start" {
                    failures.push(format!(
                        "attempt {} of instance {} wrote before its start note: {note:?}",
                        note.attempt, note.instance
                    ));
                }
                // The previous attempt's last sign of life must not be later by the clock either.
                let previous = notes
                    .iter()
                    .filter(|n| n.instance == note.instance && n.attempt < note.attempt)
                    .map(|n| n.at_ms)
                    .max();
                if let Some(last) = previous
                    && last > note.at_ms
                {
                    failures.push(format!(
                        "attempt {} of instance {} started at {} ms, before the earlier attempt's last sign of life at {last} ms",
                        note.attempt, note.instance, note.at_ms
                    ));
                }
                newest.insert(note.instance, note);
            }
        }
    }

    failures
}

/// What the stored logs of each successful attempt must be.
#[derive(Debug, Clone, Copy)]
pub enum Lines {
    /// Not checked (the task prints nothing in particular).
    Unchecked,
    /// Exactly `line 1` … `line N` on stdout, numbered 1 … N.
    Exactly(u64),
}

/// Checks the invariants every fault test promises, for every instance of `run`, and returns
/// the instances (with their attempts) for the test's own checks:
/// - every instance reached a terminal state, with attempts numbered 1 … its current attempt;
/// - no attempt started twice: one `start` note per (instance, attempt), all notes of an attempt
///   from one pid, which is the pid the worker reported, and only attempts the store knows;
/// - no two attempts of one instance overlapped: in the file's order, once attempt k+1 started
///   no note of an earlier attempt follows (its last sign of life came before), and the clocks
///   agree;
/// - a successful attempt ran to its `end` note, and its stored log lines are complete, in order,
///   and each stored once.
pub async fn check_invariants(
    client: &TestClient,
    run_id: i64,
    effects: &Path,
    lines: Lines,
) -> Vec<pb::Instance> {
    check_invariants_of_runs(client, &[run_id], effects, lines).await
}

/// [`check_invariants`] for several runs whose tasks share one side-effect file (a note of an
/// instance of none of them is a violation), and returns the instances of them all.
pub async fn check_invariants_of_runs(
    client: &TestClient,
    run_ids: &[i64],
    effects: &Path,
    lines: Lines,
) -> Vec<pb::Instance> {
    let mut instances = Vec::new();
    for run_id in run_ids {
        instances.extend(
            client
                .instances(*run_id)
                .await
                .expect("the instances of the run"),
        );
    }
    let notes = read_notes(effects);
    let mut failures = violations(&instances, &notes);

    if let Lines::Exactly(count) = lines {
        for instance in instances.iter().filter(|i| i.state() == S::Success) {
            let stored = client
                .attempt_logs(instance.id, instance.attempt)
                .await
                .expect("the attempt's logs");
            let expected: Vec<(u64, String)> =
                (1..=count).map(|i| (i, format!("line {i}"))).collect();
            let got: Vec<(u64, String)> = stored.iter().map(|l| (l.seq, l.text.clone())).collect();
            if got != expected {
                failures.push(format!(
                    "instance {} attempt {}: stored lines {got:?}, expected line 1 … line {count}",
                    instance.id, instance.attempt
                ));
            }
            if stored
                .iter()
                .any(|l| l.stream != pb::LogStream::Stdout as i32)
            {
                failures.push(format!("instance {}: a line not on stdout", instance.id));
            }
            let reported = instance
                .attempts
                .iter()
                .find(|a| a.attempt == instance.attempt)
                .map(|a| a.log_lines);
            if reported != Some(count) {
                failures.push(format!(
                    "instance {}: the attempt reports {reported:?} lines, expected {count}",
                    instance.id
                ));
            }
        }
    }

    if !failures.is_empty() {
        // The first violations say what went wrong; hundreds of lines would bury them.
        let shown: Vec<&str> = failures.iter().take(20).map(String::as_str).collect();
        panic!(
            "{} invariant violations (first {}):\n{}\n--- instances\n{}",
            failures.len(),
            shown.len(),
            shown.join("\n"),
            summary(&instances)
        );
    }
    instances
}

// ---------------------------------------------------------------------------------------------
// What the fault tests check besides the invariants.

pub fn attempt(instance: &pb::Instance, number: u32) -> &pb::Attempt {
    instance
        .attempts
        .iter()
        .find(|a| a.attempt == number)
        .unwrap_or_else(|| {
            panic!(
                "instance {} has no attempt {number}: {instance:#?}",
                instance.id
            )
        })
}

/// Whether `pid` is a live process (a zombie waiting for a reaper counts as dead: it runs
/// nothing). The container's init may never reap orphans, so zombies are common here.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("X");
    !matches!(state, "Z" | "X" | "x")
}

/// Waits until none of `pids` is alive, under `guard`; returns the survivors.
pub async fn wait_pids_gone(pids: &[u32], guard: Duration) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + guard;
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| pid_alive(*p)).collect();
        if alive.is_empty() || tokio::time::Instant::now() > deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn kill_pids(pids: &[u32]) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// Reads the pids that tasks wrote to `grandchild-*` files in `dir`.
pub fn grandchild_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the scratch directory") {
        let entry = entry.expect("directory entry");
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("grandchild-")
        {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if let Ok(pid) = text.trim().parse() {
                pids.push(pid);
            }
        }
    }
    pids
}

/// A log without the terminal colours tracing may add.
pub fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls the notes until `done` holds.
pub async fn wait_notes(effects: &Path, what: &str, done: impl Fn(&[Note]) -> bool) -> Vec<Note> {
    let deadline = tokio::time::Instant::now() + RUN_GUARD;
    loop {
        let notes = read_notes(effects);
        if done(&notes) {
            return notes;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "side effects not {what} after {RUN_GUARD:?}: {notes:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn running_on(instances: &[pb::Instance], worker: &str) -> usize {
    instances
        .iter()
        .filter(|i| i.state() == S::Running && i.worker_id == worker)
        .count()
}

// ---------------------------------------------------------------------------------------------
// The scenario: what every fault test sets up before its fault.

/// A fault test's sandbox, described before it starts: real scheduler processes on a fresh store,
/// the heartbeats of the nodes and of every worker, and the workers that must be LIVE before the
/// test goes on. [`Scenario::start`] returns the running [`Scene`].
pub struct Scenario {
    backend: Backend,
    settings: SchedulerSettings,
    worker: WorkerSettings,
    /// Each with settings of its own, or the scenario's when `None`.
    workers: Vec<(String, Option<WorkerSettings>, Route)>,
    /// The Galera database the nodes run on, each on a member of its own; MySQL's when `None`.
    galera: Option<String>,
}

/// How a worker of a scenario reaches the scheduler.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Direct,
    /// Through the scene's [`TcpProxy`] to `n1`, which the test can cut.
    Proxy,
}

/// A started [`Scenario`]: the processes, a client of `n1`, the side-effect file every task of
/// [`script`] appends to, the scratch directory, the worker settings of the scenario (for the
/// workers the test starts later), and the proxy in front of `n1` when a worker goes through it.
pub struct Scene {
    pub cluster: ProcessCluster,
    pub client: TestClient,
    /// The side-effect file (the ledger) of [`prelude`].
    pub effects: PathBuf,
    pub dir: PathBuf,
    pub worker: WorkerSettings,
    pub proxy: Option<TcpProxy>,
}

impl Scenario {
    /// One node on `backend`, the sandbox's heartbeats, no worker.
    pub fn new(backend: Backend) -> Scenario {
        Scenario {
            backend,
            settings: SchedulerSettings::default(),
            worker: WorkerSettings::default(),
            workers: Vec::new(),
            galera: None,
        }
    }

    /// The nodes on `db` of the Galera cluster, node `i` on member `i` (the caller drops `db`).
    pub fn galera(mut self, db: &crate::galera::GaleraDb) -> Scenario {
        self.galera = Some(db.name.clone());
        self
    }

    /// `n1` … `nN` on the one store (MySQL).
    pub fn nodes(mut self, nodes: usize) -> Scenario {
        self.settings.nodes = nodes;
        self
    }

    /// A proxy between each node and MySQL ([`ProcessCluster::database_proxy`]).
    pub fn database_proxies(mut self, on: bool) -> Scenario {
        self.settings.database_proxies = on;
        self
    }

    pub fn redis(mut self, redis: RedisChoice) -> Scenario {
        self.settings.redis = redis;
        self
    }

    /// The worker heartbeat interval, of the nodes and of every worker.
    pub fn heartbeats(mut self, interval: &str) -> Scenario {
        self.settings.heartbeat_interval = Some(interval.into());
        self.worker.heartbeat_interval = Some(interval.into());
        self
    }

    /// The task heartbeat interval, of the nodes and of every worker.
    pub fn task_heartbeats(mut self, interval: &str) -> Scenario {
        self.settings.task_heartbeat_interval = Some(interval.into());
        self.worker.task_heartbeat_interval = Some(interval.into());
        self
    }

    /// Heartbeats a worker may miss before the nodes find it dead.
    pub fn dead_after(mut self, missed: u32) -> Scenario {
        self.settings.dead_after_missed_heartbeats = Some(missed);
        self
    }

    /// Runs the nodes under `faketime -f SHIFT` (e.g. `+30s`): their clocks are off by it.
    pub fn clock_shift(mut self, shift: &str) -> Scenario {
        self.settings.clock_shift = Some(shift.into());
        self
    }

    /// How long past its timeout the nodes wait for a worker to report an attempt's end.
    pub fn timeout_grace(mut self, grace: &str) -> Scenario {
        self.settings.timeout_grace = Some(grace.into());
        self
    }

    /// Every worker's other settings (capacity, kill grace, fencing); the heartbeats stay the
    /// scenario's.
    pub fn worker_settings(mut self, settings: WorkerSettings) -> Scenario {
        self.worker = WorkerSettings {
            heartbeat_interval: self.worker.heartbeat_interval,
            task_heartbeat_interval: self.worker.task_heartbeat_interval,
            ..settings
        };
        self
    }

    /// A worker with the scenario's settings, LIVE before [`Scenario::start`] returns.
    pub fn worker(mut self, id: &str) -> Scenario {
        self.workers.push((id.into(), None, Route::Direct));
        self
    }

    /// A worker with settings of its own, LIVE before [`Scenario::start`] returns.
    pub fn worker_with(mut self, id: &str, settings: WorkerSettings) -> Scenario {
        self.workers
            .push((id.into(), Some(settings), Route::Direct));
        self
    }

    /// A worker with the scenario's settings that reaches `n1` only through the scene's proxy.
    pub fn worker_through_proxy(mut self, id: &str) -> Scenario {
        self.workers.push((id.into(), None, Route::Proxy));
        self
    }

    /// Starts the nodes, then the workers, each LIVE before the next starts.
    pub async fn start(self) -> Scene {
        let Scenario {
            backend,
            settings,
            worker,
            workers,
            galera,
        } = self;
        let started = match galera {
            Some(name) => {
                ProcessCluster::start_on_galera(&crate::galera::GaleraDb { name }, settings).await
            }
            None => ProcessCluster::start_with(backend, settings).await,
        };
        let mut cluster = started.expect("the scheduler process starts");
        let client = cluster.client().await.expect("a client of the scheduler");
        let proxy = match workers.iter().any(|(_, _, route)| *route == Route::Proxy) {
            true => {
                let target = std::net::SocketAddr::from(([127, 0, 0, 1], cluster.port()));
                Some(TcpProxy::start(target).await.expect("proxy"))
            }
            false => None,
        };
        for (id, settings, route) in workers {
            let settings = settings.unwrap_or_else(|| worker.clone());
            let settings = match (&proxy, route) {
                (Some(proxy), Route::Proxy) => WorkerSettings {
                    endpoint: Some(proxy.url()),
                    ..settings
                },
                _ => settings,
            };
            cluster
                .start_live_worker(&id, &settings)
                .await
                .unwrap_or_else(|err| panic!("worker {id}: {err:#}"));
        }
        Scene {
            effects: cluster.dir().join("effects"),
            dir: cluster.dir().to_path_buf(),
            cluster,
            client,
            worker,
            proxy,
        }
    }
}

/// Applies a workflow file (`name: NAME` on its first line, as [`workflow`] writes it) and
/// triggers it; returns the run's id.
pub async fn apply_and_trigger(client: &TestClient, yaml: &str) -> i64 {
    let name = yaml
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("name: "))
        .expect("a workflow file that starts with its name");
    client.apply(yaml).await.expect("apply");
    client.trigger_run(name).await.expect("trigger").id
}
