//! Writes requests in groups. Every request is handed to one task; the requests that arrive
//! while a group is being written form the next group, which is one transaction: one commit, one
//! fsync on a durable store, instead of one per request. A lone request still goes out at once;
//! a burst shares the cost, and each caller still waits until its own request is stored. If a
//! group fails, each of its requests is tried alone, for its own answer, so one the store refuses
//! does not fail the others. New runs (`run_creator.rs`) and audit rows (`audit_writer.rs`) are
//! written this way.

use std::future::Future;
use std::sync::Arc;

use ax_store::StoreError;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Requests per transaction at most.
const MAX_GROUP: usize = 128;

/// How one kind of request is written.
pub trait GroupWrite: Send + Sync + 'static {
    type Item: Clone + Send + Sync + 'static;
    type Done: Send + 'static;

    /// Writes `items` in one transaction, all or none; answers in their order.
    fn write_group(
        &self,
        items: &[Self::Item],
    ) -> impl Future<Output = Result<Vec<Self::Done>, StoreError>> + Send;

    /// Writes one item alone.
    fn write_one(
        &self,
        item: &Self::Item,
    ) -> impl Future<Output = Result<Self::Done, StoreError>> + Send;
}

struct Request<W: GroupWrite> {
    item: W::Item,
    reply: oneshot::Sender<Result<W::Done, StoreError>>,
}

/// The handle through which requests are written in groups.
pub struct GroupCommit<W: GroupWrite> {
    writer: Arc<W>,
    requests: mpsc::Sender<Request<W>>,
}

impl<W: GroupWrite> Clone for GroupCommit<W> {
    fn clone(&self) -> Self {
        GroupCommit {
            writer: Arc::clone(&self.writer),
            requests: self.requests.clone(),
        }
    }
}

impl<W: GroupWrite> GroupCommit<W> {
    /// Starts the task that writes the groups, on `tasks`; it ends when the last handle is
    /// dropped, or once `stop` is cancelled and the requests queued by then are written (later
    /// ones are written alone).
    pub fn start(writer: W, tasks: &TaskTracker, stop: CancellationToken) -> GroupCommit<W> {
        let writer = Arc::new(writer);
        let (requests, inbox) = mpsc::channel(4 * MAX_GROUP);
        tasks.spawn(write_groups(Arc::clone(&writer), inbox, stop));
        GroupCommit { writer, requests }
    }

    /// The writer of the groups.
    pub fn writer(&self) -> &W {
        &self.writer
    }

    /// Writes `item` in a group with the requests made at the same time.
    pub async fn submit(&self, item: W::Item) -> Result<W::Done, StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            item: item.clone(),
            reply,
        };
        if self.requests.send(request).await.is_ok()
            && let Ok(done) = answer.await
        {
            return done;
        }
        // The group task is gone (the node is stopping): write the request alone.
        self.writer.write_one(&item).await
    }
}

async fn write_groups<W: GroupWrite>(
    writer: Arc<W>,
    mut inbox: mpsc::Receiver<Request<W>>,
    stop: CancellationToken,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    loop {
        let received = tokio::select! {
            biased;
            received = inbox.recv_many(&mut group, MAX_GROUP) => received,
            () = stop.cancelled() => {
                inbox.close();
                inbox.recv_many(&mut group, MAX_GROUP).await
            }
        };
        if received == 0 {
            return;
        }
        let items: Vec<W::Item> = group.iter().map(|request| request.item.clone()).collect();
        match writer.write_group(&items).await {
            Ok(done) => {
                for (request, done) in group.drain(..).zip(done) {
                    let _ = request.reply.send(Ok(done));
                }
            }
            Err(error) if group.len() == 1 => {
                if let Some(request) = group.pop() {
                    let _ = request.reply.send(Err(error));
                }
            }
            Err(error) => {
                tracing::debug!(%error, requests = group.len(), "writing a group failed; writing its requests one by one");
                for request in group.drain(..) {
                    let done = writer.write_one(&request.item).await;
                    let _ = request.reply.send(done);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Doubles numbers; a group holding a negative one fails as a whole, and a negative one
    /// alone is refused.
    #[derive(Default)]
    struct Doubler {
        groups: Mutex<Vec<usize>>,
    }

    impl GroupWrite for Doubler {
        type Item = i64;
        type Done = i64;

        async fn write_group(&self, items: &[i64]) -> Result<Vec<i64>, StoreError> {
            self.groups.lock().unwrap().push(items.len());
            if items.iter().any(|&n| n < 0) {
                return Err(StoreError::NotFound("a negative number".into()));
            }
            Ok(items.iter().map(|n| 2 * n).collect())
        }

        async fn write_one(&self, item: &i64) -> Result<i64, StoreError> {
            if *item < 0 {
                return Err(StoreError::NotFound(format!("number {item}")));
            }
            Ok(2 * item)
        }
    }

    #[tokio::test]
    async fn a_burst_is_grouped_and_a_refused_request_fails_alone() {
        let commit = GroupCommit::start(
            Doubler::default(),
            &TaskTracker::new(),
            CancellationToken::new(),
        );
        let calls: Vec<_> = (-2..200i64)
            .map(|n| {
                let commit = commit.clone();
                tokio::spawn(async move { (n, commit.submit(n).await) })
            })
            .collect();
        for call in calls {
            match call.await.expect("task") {
                (n, Ok(doubled)) => assert_eq!(doubled, 2 * n),
                (n, Err(error)) => {
                    assert!(n < 0, "{n} failed: {error}");
                    assert!(
                        error.to_string().contains(&format!("number {n}")),
                        "{error}"
                    );
                }
            }
        }
        let groups = commit.writer.groups.lock().unwrap().clone();
        assert_eq!(
            groups.iter().sum::<usize>(),
            202,
            "every request went through a group"
        );
        assert!(
            groups.len() < 202,
            "a burst of 202 was written in groups: {groups:?}"
        );
    }
}
