//! What the fault tests share: tasks that append to a ledger outside ax (the side-effect file),
//! the checker of the invariants every fault test promises, read from that ledger joined with
//! the store's attempt history (through a [`TestClient`]), and helpers for the processes a
//! fault leaves behind. Waits give up after generous hang guards; nothing here measures time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use ax_proto::v1 as pb;
use pb::InstanceState as S;

use crate::Backend;
use crate::client::{RUN_GUARD, TestClient, summary};
use crate::process::{ProcessCluster, SchedulerSettings};

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

/// A process cluster and a client of its scheduler.
pub async fn cluster_with(
    backend: Backend,
    settings: SchedulerSettings,
) -> (ProcessCluster, TestClient) {
    let cluster = ProcessCluster::start_with(backend, settings)
        .await
        .expect("the scheduler process starts");
    let client = cluster.client().await.expect("a client of the scheduler");
    (cluster, client)
}
