//! What the node tells a connected worker, in the domain's terms: a dispatch, a cancel, the
//! acknowledgements of its reports, lines and heartbeats, a refusal, a request to move, the end
//! of its stream. Each worker's stream has an [`Outbox`] (`registry.rs` keeps it); the stream
//! (`grpc/worker.rs`) puts what comes out of it in the protocol's frames.

use std::collections::HashMap;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use tokio::sync::mpsc;

/// One attempt to run, as its worker gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub instance: InstanceId,
    pub attempt: Attempt,
    pub run: RunId,
    pub workflow: String,
    pub task: String,
    /// Run with a shell, unless `argv` is given.
    pub command: String,
    pub argv: Vec<String>,
    /// The task's environment, its params and context, its secrets, its trace parent.
    pub env: HashMap<String, String>,
    /// Empty: the worker's own.
    pub working_dir: String,
    /// `None`: no timeout.
    pub timeout_ms: Option<std::num::NonZeroU64>,
    pub logical_time: Millis,
    /// (index, total) of a shard of a sharded broadcast.
    pub shard: Option<(u32, u32)>,
    /// The task opted out of self-fencing.
    pub keep_when_cut_off: bool,
    /// The task's process outlives a restart of its worker.
    pub survive_worker_restart: bool,
}

/// Why the node refused a worker's report or lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The attempt was not dispatched to this worker.
    Stranger,
    /// The instance does not exist.
    Unknown,
    /// The attempt is not current, or not in the state the report expects.
    Stale,
}

/// A message to a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum ToWorker {
    Dispatch(Dispatch),
    /// Kill the attempt's process.
    Cancel {
        instance: InstanceId,
        attempt: Attempt,
        reason: String,
    },
    /// The attempt's end is stored: stop resending it.
    FinishedAck {
        instance: InstanceId,
        attempt: Attempt,
    },
    /// The attempt's lines up to `seq` are stored.
    LogAck {
        instance: InstanceId,
        attempt: Attempt,
        seq: u64,
    },
    /// The heartbeat sent at `sent_at_ms` is stored.
    HeartbeatAck {
        sent_at_ms: Millis,
    },
    /// A report or lines about the attempt were refused; `kill`: its process, if any, must go.
    Refused {
        instance: InstanceId,
        attempt: Attempt,
        reason: String,
        kill: bool,
        why: Refusal,
    },
    /// Connect to another node (the one at `to_address`, when given).
    MoveElsewhere {
        reason: String,
        to_address: String,
    },
    /// This node cannot reach its store: the stream ends, and the worker goes elsewhere.
    CutOff {
        node_id: String,
    },
}

/// The messages queued towards one worker's stream; clones queue to the same stream.
#[derive(Debug, Clone)]
pub struct Outbox {
    sender: mpsc::Sender<ToWorker>,
}

/// A worker stream's outbox holding `capacity` messages, and what its stream sends from.
pub fn outbox(capacity: usize) -> (Outbox, mpsc::Receiver<ToWorker>) {
    let (sender, receiver) = mpsc::channel(capacity);
    (Outbox { sender }, receiver)
}

impl Outbox {
    /// Queues `message` without waiting; false when the stream is gone or its queue full.
    pub fn tell(&self, message: ToWorker) -> bool {
        self.sender.try_send(message).is_ok()
    }

    /// Queues `message`, waiting in a task of its own for room when the queue is full: for a
    /// message that has no other way to the worker while the stream stays up (a cancel; the
    /// task heartbeat that would repeat it comes only every 30 s). False when the stream is gone
    /// (a new stream's registration settles what it missed).
    pub fn tell_even_when_full(&self, message: ToWorker) -> bool {
        match self.sender.try_send(message) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(message)) => {
                let sender = self.sender.clone();
                tokio::spawn(async move { sender.send(message).await });
                true
            }
        }
    }

    /// Whether the stream has ended.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// What a worker's stream sends: the outbox's messages until `served` fires (or its sender is
/// dropped) as the stream's reading side ends. From then on the queue takes nothing new and the
/// stream ends once what was queued is sent, whoever still holds a sender (a heartbeat's
/// acknowledgement waiting on a store write, say): a worker is never left talking into a stream
/// that nobody reads, and reconnects to send its reports again.
pub fn until_served(
    receiver: mpsc::Receiver<ToWorker>,
    served: tokio::sync::oneshot::Receiver<()>,
) -> impl futures::Stream<Item = ToWorker> {
    futures::stream::unfold(
        (receiver, Some(served)),
        |(mut receiver, mut served)| async move {
            loop {
                let Some(signal) = served.as_mut() else {
                    let message = receiver.recv().await?;
                    return Some((message, (receiver, None)));
                };
                tokio::select! {
                    biased;
                    message = receiver.recv() => {
                        let message = message?;
                        return Some((message, (receiver, served)));
                    }
                    _ = signal => {
                        receiver.close();
                        served = None;
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod stream_tests {
    use futures::StreamExt;

    use super::*;

    fn cut_off() -> ToWorker {
        ToWorker::CutOff {
            node_id: "n1".into(),
        }
    }

    #[tokio::test]
    async fn a_stream_ends_once_served_after_sending_what_was_queued() {
        let (outbox, receiver) = outbox(8);
        let (served, signal) = tokio::sync::oneshot::channel();
        let stream = until_served(receiver, signal);
        // Another holder of the outbox (a pending acknowledgement) outlives the serving.
        let held = outbox.clone();
        assert!(outbox.tell(cut_off()));
        drop(served);
        let sent: Vec<ToWorker> =
            tokio::time::timeout(std::time::Duration::from_secs(5), stream.collect())
                .await
                .expect("the stream ends though a sender is held");
        assert_eq!(sent.len(), 1, "what was queued before the end is sent");
        assert!(!held.tell(cut_off()), "nothing is queued after the end");
    }

    #[tokio::test]
    async fn a_message_told_to_a_full_queue_waits_for_room() {
        let (outbox, receiver) = outbox(1);
        let (_served, signal) = tokio::sync::oneshot::channel::<()>();
        let mut stream = Box::pin(until_served(receiver, signal));
        assert!(outbox.tell(cut_off()));
        assert!(!outbox.tell(cut_off()), "the queue is full");
        assert!(outbox.tell_even_when_full(cut_off()));
        for _ in 0..2 {
            tokio::time::timeout(std::time::Duration::from_secs(5), stream.next())
                .await
                .expect("a message within the guard")
                .expect("the stream goes on");
        }
    }

    #[tokio::test]
    async fn a_stream_goes_on_while_served() {
        let (outbox, receiver) = outbox(8);
        let (_served, signal) = tokio::sync::oneshot::channel::<()>();
        let mut stream = Box::pin(until_served(receiver, signal));
        assert!(outbox.tell(cut_off()));
        assert!(stream.next().await.is_some());
        drop(outbox);
        assert!(
            stream.next().await.is_none(),
            "no sender left: the stream ends"
        );
    }
}
