//! A TCP proxy on loopback that a fault test controls: it forwards every connection to one target
//! until the test cuts it, then closes every open connection and refuses new ones (accepts and
//! closes them at once) until the test heals it. A worker pointed at the proxy instead of its
//! scheduler sees a network partition on demand.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running proxy. Dropping it stops it and closes every connection through it.
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    target: SocketAddr,
    cut: AtomicBool,
    /// Cancelled by a cut: every connection forwarded since the last cut holds a child of it.
    generation: Mutex<CancellationToken>,
    forwarded: AtomicU64,
    refused: AtomicU64,
}

impl Shared {
    fn generation(&self) -> CancellationToken {
        self.generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            cut: AtomicBool::new(false),
            generation: Mutex::new(CancellationToken::new()),
            forwarded: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(TcpProxy {
            addr,
            shared,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, for a worker's `--scheduler`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes every open connection and refuses new ones until [`TcpProxy::heal`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        let mut generation = self
            .shared
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        generation.cancel();
        *generation = CancellationToken::new();
    }

    /// Forwards new connections again.
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }

    /// Connections forwarded to the target so far.
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Connections refused while cut.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.generation().cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            // Out of descriptors or similar: keep serving, the test's hang guard decides.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        if shared.cut.load(Ordering::SeqCst) {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            drop(inbound);
            continue;
        }
        let stop = shared.generation().child_token();
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(shared.target).await else {
                // The target is down: the client sees its connection closed, as it would see
                // the refusal of the target itself.
                return;
            };
            // A cut between the accept and here must still close this connection.
            if shared.cut.load(Ordering::SeqCst) {
                shared.refused.fetch_add(1, Ordering::SeqCst);
                return;
            }
            shared.forwarded.fetch_add(1, Ordering::SeqCst);
            forward(inbound, outbound, stop).await;
        });
    }
}

/// Copies both ways until either side closes or the connection's generation is cut; dropping
/// the sockets then closes both.
async fn forward(mut inbound: TcpStream, mut outbound: TcpStream, stop: CancellationToken) {
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        () = stop.cancelled() => {}
    }
}
