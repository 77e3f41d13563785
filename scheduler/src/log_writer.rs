//! The batched asynchronous log writer, off the dispatch path.
//!
//! Worker streams hand log chunks to a bounded queue; this task writes them with multi-row
//! inserts, then acknowledges them to their workers (who may then forget them) and wakes log
//! followers. A full queue back-pressures the worker streams, and through gRPC flow control the
//! tasks' pipes, instead of growing memory. A batch is one statement: one insert per line, at
//! 5,000 lines/s, saturates a database disk. Secrets' values are masked in the lines here,
//! before they are stored (`secrets.rs`). A chunk its stream did not know as its own (see
//! `grpc/worker.rs`) is checked in the same transaction: one about an attempt not dispatched to
//! its worker is not stored, not acknowledged, and answered with `ReportRefused`; the refusal
//! is counted and audited (`worker_refusals`).

use std::sync::Arc;
use std::time::Duration;

use ax_core::ids::{Attempt, InstanceId};
use ax_store::{LogChunk, Store};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::registry::Registry;
use crate::secrets::Secrets;
use crate::specs::SpecCache;
use crate::to_worker::{self, ToWorker};
use crate::worker_refusals::{FRAME_REFUSED, Refusal, WorkerRefusals};

/// Lines per write, and text bytes per write: whichever comes first.
const MAX_BATCH_LINES: usize = 20_000;
const MAX_BATCH_BYTES: usize = 8 << 20;

pub enum LogCommand {
    Append {
        worker: String,
        chunk: LogChunk,
        /// The stream knows the attempt as its worker's (dispatched or re-attached there); the
        /// others are checked against the store before they are stored.
        own: bool,
        /// This chunk's share of the queue's byte budget, returned once it is stored.
        budget: OwnedSemaphorePermit,
        /// When the chunk was queued, for the writer's lag.
        queued: Instant,
    },
    /// Answered once everything queued before it is stored.
    Flush(oneshot::Sender<()>),
}

/// Text queued for the store at most, whatever the lines' length: the scheduler's memory for
/// logs stays bounded while a chatty task is pushed back.
const QUEUE_BUDGET_BYTES: usize = 16 << 20;

/// Queues log chunks for the writer; clones share its queue.
#[derive(Clone)]
pub struct Logs {
    sender: mpsc::Sender<LogCommand>,
    budget: Arc<Semaphore>,
}

/// The log writer: its queue, and the node's parts a write reaches.
pub struct LogWriter {
    inbox: mpsc::Receiver<LogCommand>,
    logs: Logs,
    flush_interval: Duration,
    writing: Writing,
}

/// The node's parts a write reaches.
pub struct Writing {
    pub store: Arc<Store>,
    pub specs: Arc<SpecCache>,
    pub secrets: Arc<Secrets>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub refusals: Arc<WorkerRefusals>,
    pub progress: Progress,
}

impl LogWriter {
    /// Writes a batch once it has waited `flush_interval`, or is full.
    pub fn new(flush_interval: Duration, writing: Writing) -> LogWriter {
        let (sender, inbox) = mpsc::channel(4096);
        let budget = Arc::new(Semaphore::new(QUEUE_BUDGET_BYTES));
        LogWriter {
            inbox,
            logs: Logs { sender, budget },
            flush_interval,
            writing,
        }
    }

    pub fn handle(&self) -> Logs {
        self.logs.clone()
    }
}

impl Logs {
    /// Queues a chunk from `worker`'s stream (`own`: the stream knows its attempt as the
    /// worker's); waits when the queue is full, by count or by bytes (back-pressure).
    pub async fn append(&self, worker: String, chunk: LogChunk, own: bool) -> bool {
        let bytes = chunk.body().len();
        let permits = bytes.clamp(1, QUEUE_BUDGET_BYTES) as u32;
        let Ok(budget) = self.budget.clone().acquire_many_owned(permits).await else {
            return false;
        };
        let command = LogCommand::Append {
            worker,
            chunk,
            own,
            budget,
            queued: Instant::now(),
        };
        self.sender.send(command).await.is_ok()
    }

    /// Bytes of log text queued and not yet stored.
    pub fn queued_bytes(&self) -> usize {
        QUEUE_BUDGET_BYTES.saturating_sub(self.budget.available_permits())
    }

    /// Waits until every chunk queued so far is stored.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.sender.send(LogCommand::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

impl LogWriter {
    pub async fn run(self, cancel: CancellationToken) {
        let LogWriter {
            mut inbox,
            logs,
            flush_interval,
            writing,
        } = self;
        // Its own handle would keep its queue open: only the others' count.
        drop(logs);
        let mut pending = Pending::default();
        let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
        let mut lines = 0usize;
        let mut bytes = 0usize;
        let mut deadline: Option<Instant> = None;
        let mut closing = false;
        loop {
            let command = if closing {
                inbox.recv().await
            } else {
                tokio::select! {
                    command = inbox.recv() => command,
                    _ = sleep_until(deadline) => {
                        writing.write(&mut pending, &mut waiters).await;
                        (lines, bytes) = (0, 0);
                        deadline = None;
                        continue;
                    }
                    _ = cancel.cancelled() => {
                        // Stop taking new chunks, write what is queued, then return.
                        inbox.close();
                        closing = true;
                        continue;
                    }
                }
            };
            match command {
                Some(LogCommand::Append {
                    worker,
                    mut chunk,
                    own,
                    budget,
                    queued,
                }) => {
                    // Stored lines never show a value of a secret the task could have been given,
                    // whatever it printed.
                    writing
                        .secrets
                        .mask(&mut chunk, async |instance| {
                            writing.app_of_instance(instance).await
                        })
                        .await;
                    lines += chunk.line_count();
                    bytes += chunk.body().len();
                    pending.checks.push((!own).then(|| worker.clone()));
                    pending.acks.push(Ack {
                        worker,
                        instance: chunk.instance_id,
                        attempt: chunk.attempt,
                        seq: chunk.last_seq(),
                        _budget: budget,
                    });
                    pending.chunks.push(chunk);
                    pending.oldest.get_or_insert(queued);
                    deadline.get_or_insert_with(|| Instant::now() + flush_interval);
                    if lines >= MAX_BATCH_LINES || bytes >= MAX_BATCH_BYTES {
                        writing.write(&mut pending, &mut waiters).await;
                        (lines, bytes) = (0, 0);
                        deadline = None;
                    }
                }
                Some(LogCommand::Flush(done)) => {
                    waiters.push(done);
                    writing.write(&mut pending, &mut waiters).await;
                    (lines, bytes) = (0, 0);
                    deadline = None;
                }
                None => {
                    writing.write(&mut pending, &mut waiters).await;
                    return;
                }
            }
        }
    }
}

impl Writing {
    /// The app of the workflow version an instance runs, or `None` when it cannot be read (its
    /// lines are then masked for every app's secrets).
    async fn app_of_instance(&self, instance: ax_core::ids::InstanceId) -> Option<String> {
        let record = match self.store.get_instance(instance).await {
            Ok(Some(record)) => record,
            Ok(None) => return None,
            Err(err) => {
                tracing::warn!(%instance, error = %err, "cannot read an instance's app to mask its lines");
                return None;
            }
        };
        match self
            .specs
            .get(record.workflow_id, record.workflow_version)
            .await
        {
            Ok(versioned) => Some(versioned.spec.app.clone()),
            Err(err) => {
                tracing::warn!(%instance, error = %err, "cannot read an instance's app to mask its lines");
                None
            }
        }
    }

    async fn write(&self, pending: &mut Pending, waiters: &mut Vec<oneshot::Sender<()>>) {
        if !pending.chunks.is_empty() {
            let chunks = std::mem::take(&mut pending.chunks);
            let checks = std::mem::take(&mut pending.checks);
            let senders: Vec<Option<&str>> = checks.iter().map(Option::as_deref).collect();
            let started = Instant::now();
            let mut delay = Duration::from_millis(50);
            // Lines a worker sent are acknowledged only once stored, so retrying until the store
            // takes them loses nothing; meanwhile the bounded queue pushes back on the workers.
            let kept = loop {
                let written = if senders.iter().all(Option::is_none) {
                    self.store
                        .append_logs(&chunks)
                        .await
                        .map(|()| vec![true; chunks.len()])
                } else {
                    self.store.append_worker_logs(&chunks, &senders).await
                };
                match written {
                    Ok(kept) => break kept,
                    Err(err) => {
                        tracing::error!(error = %err, chunks = chunks.len(), "writing logs failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            };
            let stored_lines: usize = chunks
                .iter()
                .zip(&kept)
                .filter(|(_, kept)| **kept)
                .map(|(chunk, _)| chunk.line_count())
                .sum();
            tracing::debug!(
                chunks = chunks.len(),
                lines = stored_lines,
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "log lines stored"
            );
            self.metrics.log_lines.inc_by(stored_lines as u64);
            if let Some(oldest) = pending.oldest.take() {
                self.metrics.log_lag.set(oldest.elapsed().as_secs_f64());
            }
            drop(chunks);
            // Dropping each entry returns its share of the byte budget.
            for (ack, kept) in pending.acks.drain(..).zip(kept) {
                if !kept {
                    self.refuse(&ack);
                    continue;
                }
                let Some(outbox) = self.registry.outbox(&ack.worker) else {
                    continue;
                };
                // A full outbound queue only delays the ack; the next one covers this one.
                outbox.tell(ToWorker::LogAck {
                    instance: ack.instance,
                    attempt: ack.attempt,
                    seq: ack.seq,
                });
            }
            self.progress.bump();
        }
        for waiter in waiters.drain(..) {
            let _ = waiter.send(());
        }
    }

    /// A chunk about an attempt not dispatched to its worker: not stored; counted and audited, and
    /// the worker told (and told to kill whatever runs under that attempt: it is not its own).
    fn refuse(&self, ack: &Ack) {
        let why = format!(
            "log lines for attempt {} of instance {}, which was not dispatched to worker {}: not stored",
            ack.attempt, ack.instance, ack.worker
        );
        let stream = self.registry.stream_info(&ack.worker).unwrap_or_default();
        self.refusals.record(
            &self.metrics,
            Refusal {
                worker: ack.worker.clone(),
                action: FRAME_REFUSED,
                kind: "logs",
                detail: why.clone(),
                remote: stream.remote,
                token: stream.token,
            },
        );
        if let Some(outbox) = self.registry.outbox(&ack.worker) {
            outbox.tell(ToWorker::Refused {
                instance: ack.instance,
                attempt: ack.attempt,
                reason: why,
                kill: true,
                why: to_worker::Refusal::Stranger,
            });
        }
    }
}

/// The chunks waiting for the next write, and for each the acknowledgement its worker gets once
/// it is stored.
#[derive(Default)]
struct Pending {
    chunks: Vec<LogChunk>,
    /// Per chunk, the worker to check it against (`None`: its stream knew it as its own).
    checks: Vec<Option<String>>,
    acks: Vec<Ack>,
    /// When the first of these chunks was queued: the write's lag.
    oldest: Option<Instant>,
}

struct Ack {
    worker: String,
    instance: InstanceId,
    attempt: Attempt,
    seq: u64,
    /// The chunk's share of the queue's byte budget, returned when this is dropped.
    _budget: OwnedSemaphorePermit,
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
