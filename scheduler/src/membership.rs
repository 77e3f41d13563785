//! Membership: this node's lease in the store, claimed at start, renewed every fifth of its
//! length, given up at a clean shutdown.
//!
//! The node id is taken only when no live node holds it. A lease held by another incarnation
//! is watched for two renewal intervals: unchanged, its holder is dead (killed, say) and the
//! id is taken over; renewed, a live node has the id and this one refuses to start. On SQLite
//! any other live node stands in the way, because one SQLite file serves one node.
//!
//! The renewals also tell whether the node reaches its store ([`Standing`]). On MySQL, a node
//! that has not renewed for `cut_off_after` is cut off: it stops dispatching and closes its
//! workers' streams, refusing new ones, so they move to nodes that can record their heartbeats
//! well before any node could count them dead; the first renewal that succeeds again ends it.
//! One SQLite file serves one node, so there a slow store cuts nothing off: no other node
//! could take the workers.
//!
//! Each claim and renewal also measures this node's clock against the database's (the offset
//! the round trip's midpoint implies) and corrects [`crate::clock`] by it; an offset past
//! `--max-clock-offset` is logged as an error at every renewal and shown by `axctl cluster`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ax_store::{Backend, LeaseClaim, NodeLease, QueueShare, Store};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock;

/// What a node says about itself in its lease.
#[derive(Debug, Clone)]
pub struct Member {
    pub node_id: String,
    pub address: String,
    pub lease: Duration,
    pub max_clock_offset: Duration,
    /// How long without a renewal makes the node cut off from its store, once its renewals
    /// fail (refused, connection lost, the server not ready).
    pub cut_off_after: Duration,
    /// How long a renewal may stay unanswered before the node is cut off: longer on a cluster
    /// that holds every commit while it drops a silent member ([`cut_off_when_stalled`]).
    pub cut_off_when_stalled: Duration,
    /// A worker silent this long is dead (and holds no node's share of the queue).
    pub worker_dead_after: Duration,
    /// The node's `[pools]`, as [`pools_text`] writes them.
    pub pools: String,
}

/// Pools as `name=limit` pairs in name order, comma-separated.
pub fn pools_text(pools: &std::collections::BTreeMap<String, u32>) -> String {
    let pairs: Vec<String> = pools
        .iter()
        .map(|(name, limit)| format!("{name}={limit}"))
        .collect();
    pairs.join(",")
}

/// A warning for each live node whose pools differ from `ours`: a pool's limit is counted
/// cluster-wide, so nodes with different limits let different numbers run.
pub fn pool_differences(
    node_id: &str,
    ours: &str,
    others: &[NodeLease],
    db_now: i64,
) -> Vec<String> {
    let shown = |pools: &str| {
        if pools.is_empty() {
            "none".to_string()
        } else {
            pools.to_string()
        }
    };
    others
        .iter()
        .filter(|lease| {
            lease.node_id != node_id && lease.expires_at > db_now && lease.pools != ours
        })
        .map(|lease| {
            format!(
                "node {} has [pools] {} but this node {} has {}; give every node the same [pools]",
                lease.node_id,
                shown(&lease.pools),
                node_id,
                shown(ours)
            )
        })
        .collect()
}

impl Member {
    /// A fifth of the lease, and at most half the cut-off time, so one slow renewal alone does
    /// not cut the node off.
    fn renewal_interval(&self) -> Duration {
        (self.lease / 5)
            .min(self.cut_off_after / 2)
            .max(Duration::from_millis(100))
    }
}

/// A node is cut off from its store after this much of the dead-worker threshold without a
/// renewal (2.5 s of the default 20 s), and never sooner than 2 s, which a busy database's
/// stall may take: its workers then have most of the threshold to move before another node
/// could count them dead, and their fence (at ¾ of it, from the last heartbeat this node
/// recorded) is still far off.
pub fn cut_off_after(worker_dead_after: Duration) -> Duration {
    (worker_dead_after / 8).max(Duration::from_secs(2))
}

/// How long an unanswered renewal may wait before the node takes the silence for its own. A
/// cluster that holds every commit while it drops a member that stopped answering
/// (`commit_stall`: Galera's `evs.suspect_timeout`, 5 s by default) stalls every node's renewal
/// at once, and every node would be cut off and its workers moved for one database server's
/// death: the node waits that stall and 3 s more (forming the new view takes a second or so). A renewal that fails (the node's own server
/// gone or out of the cluster) still cuts it off after [`cut_off_after`].
pub fn cut_off_when_stalled(cut_off_after: Duration, commit_stall: Option<Duration>) -> Duration {
    match commit_stall {
        Some(stall) => cut_off_after.max(stall + Duration::from_secs(3)),
        None => cut_off_after,
    }
}

/// Whether a cut-off threshold leaves the workers of a cut-off node time to move: they fence
/// themselves at ¾ of the dead-worker threshold, so the node must let them go well before.
pub fn cut_off_leaves_time_to_move(cut_off_after: Duration, worker_dead_after: Duration) -> bool {
    cut_off_after <= worker_dead_after / 2
}

/// Whether this node reaches its store, and its share of the WAITING queue.
#[derive(Debug)]
pub struct Standing {
    reaches_store: watch::Sender<bool>,
    /// Live nodes (high half) and this node's index among them by id (low half); 0 until known.
    share: std::sync::atomic::AtomicU64,
    /// When the lease was last claimed or renewed (this machine's clock, ms).
    renewed_at: std::sync::atomic::AtomicI64,
}

impl Standing {
    fn new() -> Arc<Standing> {
        Arc::new(Standing {
            reaches_store: watch::channel(true).0,
            share: std::sync::atomic::AtomicU64::new(0),
            renewed_at: std::sync::atomic::AtomicI64::new(clock::local_ms()),
        })
    }

    /// This node's share of the queue while more than one node is live.
    pub fn share(&self) -> Option<QueueShare> {
        let packed = self.share.load(std::sync::atomic::Ordering::Relaxed);
        let (nodes, index) = ((packed >> 32) as u32, packed as u32);
        (nodes > 1).then_some(QueueShare { nodes, index })
    }

    fn set_share(&self, nodes: u32, index: u32) {
        let packed = (u64::from(nodes) << 32) | u64::from(index);
        self.share
            .store(packed, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long since the lease was last claimed or renewed.
    pub fn lease_age(&self) -> std::time::Duration {
        let renewed = self.renewed_at.load(std::sync::atomic::Ordering::Relaxed);
        std::time::Duration::from_millis((clock::local_ms() - renewed).max(0) as u64)
    }

    fn renewed(&self) {
        self.renewed_at
            .store(clock::local_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_cut_off(&self) -> bool {
        !*self.reaches_store.borrow()
    }

    /// Waits until the node is cut off (at once if it is).
    pub async fn cut_off(&self) {
        let mut standing = self.reaches_store.subscribe();
        let _ = standing.wait_for(|reaches| !reaches).await;
    }

    /// Sets the standing; true when it changed.
    fn set(&self, reaches: bool) -> bool {
        self.reaches_store.send_if_modified(|current| {
            let changed = *current != reaches;
            *current = reaches;
            changed
        })
    }
}

/// This node's lease, held.
pub struct Membership {
    store: Arc<Store>,
    member: Member,
    incarnation: String,
    standing: Arc<Standing>,
}

impl Membership {
    /// Whether this node reaches its store, as its renewals find.
    pub fn standing(&self) -> Arc<Standing> {
        self.standing.clone()
    }

    /// Claims the node's lease, or says why it cannot.
    pub async fn join(store: Arc<Store>, member: Member) -> anyhow::Result<Membership> {
        let incarnation = format!("{:016x}", rand::random::<u64>());
        let claim = NodeLease {
            node_id: member.node_id.clone(),
            incarnation: incarnation.clone(),
            address: member.address.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: 0,
            renewed_at: 0,
            expires_at: 0,
            clock_offset_ms: 0,
            pools: member.pools.clone(),
        };
        let lease_ms = member.lease.as_millis() as u64;
        let claim_once = |claim: &NodeLease, presumed_dead: Vec<NodeLease>| {
            let store = store.clone();
            let claim = claim.clone();
            async move {
                let sent = clock::local_ms();
                let outcome = store
                    .claim_node_lease(&claim, lease_ms, &presumed_dead)
                    .await
                    .context("claiming this node's lease in the store")?;
                anyhow::Ok((sent, clock::local_ms(), outcome))
            }
        };
        let (mut sent, mut received, mut outcome) = claim_once(&claim, Vec::new()).await?;
        if let LeaseClaim::Refused { holders, .. } = outcome {
            let wait = 2 * member.renewal_interval();
            tracing::info!(
                node = %member.node_id,
                holders = holders.len(),
                wait_ms = wait.as_millis() as u64,
                "a lease stands in the way; watching whether its holder renews it"
            );
            tokio::time::sleep(wait).await;
            (sent, received, outcome) = claim_once(&claim, holders).await?;
        }
        match outcome {
            LeaseClaim::Claimed { db_now } => {
                let clock_offset_ms = observe_offset(sent, received, db_now, &member);
                tracing::info!(
                    node = %member.node_id,
                    lease_ms,
                    clock_offset_ms,
                    "node lease claimed"
                );
                warn_of_other_pools(&store, &member).await;
                Ok(Membership {
                    store,
                    member,
                    incarnation,
                    standing: Standing::new(),
                })
            }
            LeaseClaim::Refused { db_now, holders } => {
                bail!(refusal(store.backend(), &member.node_id, db_now, &holders))
            }
        }
    }

    /// Renews the lease until `cancel`, then gives it up.
    pub async fn run(self, cancel: CancellationToken) {
        let lease_ms = self.member.lease.as_millis() as u64;
        let interval = self.member.renewal_interval();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut offset = 0;
        let mut renewed_at = Instant::now();
        // Once another node took this node's id, this one stays cut off: two nodes never serve
        // workers under one id.
        let mut id_taken = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = ticker.tick() => {}
            }
            let sent = clock::local_ms();
            let renewed = self.renew(lease_ms, offset, renewed_at).await;
            let received = clock::local_ms();
            // A cluster member that answers but is out of sync or outside the primary component
            // serves no decisions: the renewal does not count, and the node is cut off in time.
            let renewed = match renewed {
                Ok(Ok(Some(db_now))) => match self.member_unready().await {
                    Some(why) => Ok(Err(why)),
                    None => Ok(Ok(Some(db_now))),
                },
                other => other.map(|answer| answer.map_err(anyhow::Error::from)),
            };
            let failed = matches!(renewed, Ok(Err(_)));
            match renewed {
                Ok(Ok(Some(db_now))) if !id_taken => {
                    offset = observe_offset(sent, received, db_now, &self.member);
                    renewed_at = Instant::now();
                    self.standing.renewed();
                    self.learn_share().await;
                    if self.standing.set(true) {
                        tracing::info!(
                            node = %self.member.node_id,
                            "the store answers again; this node dispatches and takes workers again"
                        );
                    }
                }
                Ok(Ok(_)) => {
                    id_taken = true;
                    self.standing.set(false);
                    tracing::error!(
                        node = %self.member.node_id,
                        "this node's lease was taken by another node with the same id (it \
                         expired while the store was out of reach); this node serves no workers \
                         any more: give the nodes distinct --node-id and restart it"
                    );
                }
                Ok(Err(err)) => tracing::warn!(
                    node = %self.member.node_id,
                    error = %err,
                    "renewing this node's lease failed; retrying at the next interval"
                ),
                Err(_) => tracing::warn!(
                    node = %self.member.node_id,
                    waited_ms = self.member.cut_off_when_stalled.as_millis() as u64,
                    "renewing this node's lease got no answer in time; retrying"
                ),
            }
            let threshold = if failed {
                self.member.cut_off_after
            } else {
                self.member.cut_off_when_stalled
            };
            self.cut_off_if_silent(renewed_at, threshold);
        }
        self.leave().await;
    }

    /// Why this node's database server, a cluster member, cannot serve now; `None` when it can
    /// or is a single server.
    async fn member_unready(&self) -> Option<anyhow::Error> {
        if self.store.engine() == ax_store::Engine::Single {
            return None;
        }
        match self.store.unready().await {
            Ok(None) => None,
            Ok(Some(why)) => Some(anyhow::anyhow!(why)),
            Err(err) => {
                Some(anyhow::Error::from(err).context("reading the cluster member's state"))
            }
        }
    }

    /// One renewal of the lease. The node is cut off on time while it is in flight (once the
    /// last renewal is `cut_off_after` old), but the renewal itself is given up only after a
    /// whole `cut_off_after`: a database that answers late still answers. Renewals dropped at
    /// the next interval would never land while the database took longer than that to answer
    /// (each next one finding the lease connection busy with the dropped answer, or lost with
    /// it), and a loaded database would cut the node off while it answered every renewal.
    async fn renew(
        &self,
        lease_ms: u64,
        offset: i64,
        renewed_at: Instant,
    ) -> Result<ax_store::Result<Option<i64>>, tokio::time::error::Elapsed> {
        let renewal = tokio::time::timeout(
            self.member.cut_off_when_stalled,
            self.store
                .renew_node_lease(&self.member.node_id, &self.incarnation, lease_ms, offset),
        );
        tokio::pin!(renewal);
        tokio::select! {
            renewed = &mut renewal => renewed,
            () = tokio::time::sleep_until(renewed_at + self.member.cut_off_when_stalled) => {
                self.cut_off_if_silent(renewed_at, self.member.cut_off_when_stalled);
                renewal.await
            }
        }
    }

    /// Cuts the node off (on MySQL) once its lease has gone unrenewed for `threshold`.
    fn cut_off_if_silent(&self, renewed_at: Instant, threshold: Duration) {
        let silent = renewed_at.elapsed();
        if self.store.backend() == Backend::MySql && silent >= threshold && self.standing.set(false)
        {
            tracing::error!(
                node = %self.member.node_id,
                silent_ms = silent.as_millis() as u64,
                "this node cannot reach its store: it stops dispatching and closes its \
                 workers' streams so they move to other nodes, until the store answers"
            );
        }
    }

    /// Reads the live nodes that hold live workers and takes this node's place among them by id
    /// as its share of the queue (none when it holds no worker: it dispatches nothing then). A
    /// share a node does not serve, a dead node's say, is taken by the others' second look
    /// (`dispatcher`).
    async fn learn_share(&self) {
        if self.store.backend() != Backend::MySql {
            return;
        }
        let read = async {
            let (db_now, leases) = self.store.list_node_leases().await?;
            let workers = self.store.list_workers().await?;
            anyhow::Ok((db_now, leases, workers))
        };
        // Bounded like the renewal: a database that stops answering between the two would
        // otherwise hold the renewal loop here, and the node would never find itself cut off.
        let read = tokio::time::timeout(self.member.renewal_interval(), read);
        match read.await {
            Ok(Ok((db_now, leases, workers))) => {
                let dead_after = self.member.worker_dead_after.as_millis() as i64;
                let serving: Vec<&str> = leases
                    .iter()
                    .filter(|lease| lease.expires_at > db_now)
                    .filter(|lease| {
                        workers.iter().any(|worker| {
                            worker.node_id == lease.node_id
                                && worker.connected
                                && worker.last_heartbeat >= clock::now_ms() - dead_after
                        })
                    })
                    .map(|lease| lease.node_id.as_str())
                    .collect();
                match serving.iter().position(|id| *id == self.member.node_id) {
                    Some(index) => self.standing.set_share(serving.len() as u32, index as u32),
                    None => self.standing.set_share(0, 0),
                }
            }
            Ok(Err(err)) => tracing::debug!(error = %err, "cannot read the live nodes"),
            Err(_) => tracing::debug!("reading the live nodes got no answer in time"),
        }
    }

    /// Gives the lease up, so the node id is free at once.
    pub async fn leave(&self) {
        if let Err(err) = self
            .store
            .release_node_lease(&self.member.node_id, &self.incarnation)
            .await
        {
            tracing::warn!(error = %err, "giving up this node's lease failed; it expires by itself");
        }
    }
}

/// Says so loudly when another live node has other `[pools]`.
async fn warn_of_other_pools(store: &Arc<Store>, member: &Member) {
    match store.list_node_leases().await {
        Ok((db_now, leases)) => {
            for warning in pool_differences(&member.node_id, &member.pools, &leases, db_now) {
                tracing::warn!(node = %member.node_id, "{warning}");
            }
        }
        Err(err) => tracing::warn!(error = %err, "cannot compare [pools] with the other nodes"),
    }
}

/// This node's clock minus the database's, from one round trip; corrects the node's clock by it
/// and says so loudly when it passes the bound.
fn observe_offset(sent: i64, received: i64, db_now: i64, member: &Member) -> i64 {
    let midpoint = sent + (received - sent) / 2;
    let measured = midpoint - db_now;
    // A measurement is only as exact as half its round trip: within that of the offset in use,
    // the clock is left alone, so `now` does not jitter by a few milliseconds every renewal.
    let uncertainty = (received - sent) / 2 + 5;
    let offset = if (measured - clock::offset()).abs() > uncertainty {
        clock::set_offset(measured);
        measured
    } else {
        clock::offset()
    };
    let bound = member.max_clock_offset.as_millis() as i64;
    if offset.abs() > bound {
        tracing::error!(
            node = %member.node_id,
            clock_offset_ms = offset,
            max_clock_offset_ms = bound,
            "this machine's clock differs from the database's by more than --max-clock-offset; \
             the node goes by the database's clock, but fix the machine's time (NTP)"
        );
    }
    offset
}

fn refusal(backend: Backend, node_id: &str, db_now: i64, holders: &[NodeLease]) -> String {
    let describe = |lease: &NodeLease| {
        format!(
            "node {} at {} (lease renewed {} ms ago)",
            lease.node_id,
            lease.address,
            db_now - lease.renewed_at
        )
    };
    let others: Vec<String> = holders.iter().map(describe).collect();
    if backend == Backend::MySql
        && let Some(same) = holders.iter().find(|lease| lease.node_id == node_id)
    {
        return format!(
            "node id {node_id} is held by a live scheduler: {}; start this node with another \
             --node-id",
            describe(same)
        );
    }
    match backend {
        // Whatever the ids, the way out is another store: say so.
        Backend::Sqlite => format!(
            "this SQLite store already serves a live scheduler: {}; one SQLite file serves one \
             node, and a cluster of schedulers needs MySQL (--store mysql://USER@HOST/DB)",
            others.join(", ")
        ),
        Backend::MySql => format!("live leases stand in the way: {}", others.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_cluster_that_stalls_commits_while_it_drops_a_member_does_not_cut_nodes_off_in_it() {
        let dead = Duration::from_secs(20);
        // An eighth of the dead-worker threshold, at least 2 s.
        assert_eq!(cut_off_after(dead), Duration::from_millis(2_500));
        assert_eq!(
            cut_off_after(Duration::from_secs(8)),
            Duration::from_secs(2)
        );
        // A single server: a stalled renewal counts as a failed one.
        assert_eq!(
            cut_off_when_stalled(cut_off_after(dead), None),
            cut_off_after(dead)
        );
        // Galera's default 5 s suspect timeout, and 3 s more.
        let galera = cut_off_when_stalled(cut_off_after(dead), Some(Duration::from_secs(5)));
        assert_eq!(galera, Duration::from_secs(8));
        assert!(cut_off_leaves_time_to_move(galera, dead));
        // A suspect timeout too long for the threshold is told.
        let slow = cut_off_when_stalled(cut_off_after(dead), Some(Duration::from_secs(15)));
        assert!(!cut_off_leaves_time_to_move(slow, dead));
    }

    fn lease(node_id: &str, pools: &str, expires_at: i64) -> NodeLease {
        NodeLease {
            node_id: node_id.into(),
            incarnation: "i".into(),
            address: String::new(),
            version: String::new(),
            started_at: 0,
            renewed_at: 0,
            expires_at,
            clock_offset_ms: 0,
            pools: pools.into(),
        }
    }

    #[test]
    fn only_live_nodes_with_other_pools_are_warned_of() {
        let pools = BTreeMap::from([("ml".to_string(), 2), ("etl".to_string(), 4)]);
        let ours = pools_text(&pools);
        assert_eq!(ours, "etl=4,ml=2");
        let others = [
            lease("n1", "etl=4,ml=2", 100),
            lease("n2", "etl=8", 100),
            lease("n3", "", 100),
            lease("gone", "x=1", 10),
        ];
        assert_eq!(
            pool_differences("n1", &ours, &others, 50),
            [
                "node n2 has [pools] etl=8 but this node n1 has etl=4,ml=2; give every node the \
                 same [pools]",
                "node n3 has [pools] none but this node n1 has etl=4,ml=2; give every node the \
                 same [pools]",
            ]
        );
    }
}
