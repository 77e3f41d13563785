//! A TCP proxy on loopback that a fault test controls. It forwards every connection to one
//! target until the test breaks the path, in one of two ways:
//! - a **cut** closes every open connection and refuses new ones (accepts and closes them at
//!   once): the far side is gone and both ends learn it at once;
//! - a **blackhole** keeps every connection open but moves no byte either way, and holds new
//!   connections without reaching the target: packets vanish, and an end learns of it only by
//!   its own timeouts. Bytes already read are held, not dropped, as a network holds them in its
//!   buffers, and flow again after the heal.
//!
//! A proxy can also be made **slow**: every chunk waits a while before it is passed on, either
//! way, as behind a congested network or in front of a database that answers late; an end then
//! learns that its peer is late, not that it is gone.
//!
//! A heal forwards again. A worker pointed at the proxy instead of its scheduler, or a scheduler
//! whose store url points at it instead of MySQL, sees a network partition on demand.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Bytes moved per read.
const CHUNK: usize = 16 * 1024;

/// What the proxy does with the traffic between its two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Open,
    Cut,
    Blackhole,
    /// Every chunk waits this long before it is written on.
    Slow(Duration),
}

/// A running proxy. Dropping it stops it and closes every connection through it.
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    target: SocketAddr,
    link: watch::Sender<Link>,
    /// Cancelled by a cut and by the proxy's drop: every connection accepted since the last cut
    /// holds a child of it.
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

    fn link(&self) -> Link {
        *self.link.borrow()
    }
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            link: watch::Sender::new(Link::Open),
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
        self.shared.link.send_replace(Link::Cut);
        let mut generation = self
            .shared
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        generation.cancel();
        *generation = CancellationToken::new();
    }

    /// Moves no byte on any connection, and holds new ones, until [`TcpProxy::heal`].
    pub fn blackhole(&self) {
        self.shared.link.send_replace(Link::Blackhole);
    }

    /// Passes every chunk on `delay` late, either way, until [`TcpProxy::heal`].
    pub fn slow(&self, delay: Duration) {
        self.shared.link.send_replace(Link::Slow(delay));
    }

    /// Forwards again: held bytes and held connections go on, new connections are forwarded.
    pub fn heal(&self) {
        self.shared.link.send_replace(Link::Open);
    }

    pub fn link(&self) -> Link {
        self.shared.link()
    }

    pub fn is_cut(&self) -> bool {
        self.link() == Link::Cut
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
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if shared.link() == Link::Cut {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            drop(inbound);
            continue;
        }
        let stop = shared.generation().child_token();
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            tokio::select! {
                () = connect_and_forward(inbound, &shared) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

/// Forwards one accepted connection, once the link is not a blackhole (a connection accepted
/// during one is held until the heal, or closed by a cut).
async fn connect_and_forward(inbound: TcpStream, shared: &Shared) {
    let mut link = shared.link.subscribe();
    if link.wait_for(|p| *p != Link::Blackhole).await.is_err() {
        return;
    }
    let Ok(outbound) = TcpStream::connect(shared.target).await else {
        // The target is down: the client sees its connection closed, as it would see the
        // refusal of the target itself.
        return;
    };
    // A cut between the accept and here must still close this connection.
    if shared.link() == Link::Cut {
        shared.refused.fetch_add(1, Ordering::SeqCst);
        return;
    }
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    // Each direction ends at its reader's end of stream, passing it on; dropping the halves
    // closes both sockets.
    tokio::join!(
        pump(in_read, out_write, shared.link.subscribe()),
        pump(out_read, in_write, shared.link.subscribe()),
    );
}

/// Copies one direction. In a blackhole nothing is read (the sender's buffers fill, as behind
/// a silent network) and a chunk already read waits before it is written; a slow link holds
/// each chunk for its delay.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut link: watch::Receiver<Link>) {
    let mut buffer = vec![0u8; CHUNK];
    loop {
        if link.wait_for(|p| *p != Link::Blackhole).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(read) => read,
        };
        let delay = match link.wait_for(|p| *p != Link::Blackhole).await {
            Ok(passed) => match *passed {
                Link::Slow(delay) => Some(delay),
                _ => None,
            },
            Err(_) => return,
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a byte that should come back may take. A hang guard.
    const GUARD: Duration = Duration::from_secs(10);
    /// How long a byte that must not come back is waited for.
    const SILENCE: Duration = Duration::from_millis(300);

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn echoed(stream: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
        let mut buffer = [0u8; 16];
        match tokio::time::timeout(wait, stream.read(&mut buffer)).await {
            Ok(Ok(read)) => Some(buffer[..read].to_vec()),
            Ok(Err(err)) => panic!("read: {err}"),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn a_blackhole_holds_bytes_and_connections_until_the_heal_and_a_cut_closes() {
        let proxy = TcpProxy::start(echo_server().await).await.expect("proxy");
        let mut open = TcpStream::connect(proxy.addr()).await.expect("connect");
        open.write_all(b"a").await.expect("write");
        assert_eq!(echoed(&mut open, GUARD).await.as_deref(), Some(&b"a"[..]));

        proxy.blackhole();
        assert_eq!(proxy.link(), Link::Blackhole);
        open.write_all(b"b").await.expect("write");
        let mut held = TcpStream::connect(proxy.addr()).await.expect("connect");
        held.write_all(b"c").await.expect("write");
        assert_eq!(echoed(&mut open, SILENCE).await, None, "a byte crossed");
        assert_eq!(echoed(&mut held, SILENCE).await, None, "a byte crossed");

        proxy.heal();
        assert_eq!(echoed(&mut open, GUARD).await.as_deref(), Some(&b"b"[..]));
        assert_eq!(echoed(&mut held, GUARD).await.as_deref(), Some(&b"c"[..]));

        proxy.cut();
        assert!(proxy.is_cut());
        assert_eq!(
            echoed(&mut open, GUARD).await.as_deref(),
            Some(&b""[..]),
            "a cut closes the connection"
        );
    }

    #[tokio::test]
    async fn a_slow_link_passes_bytes_on_late_either_way() {
        let proxy = TcpProxy::start(echo_server().await).await.expect("proxy");
        let mut stream = TcpStream::connect(proxy.addr()).await.expect("connect");
        proxy.slow(SILENCE);
        let sent = tokio::time::Instant::now();
        stream.write_all(b"a").await.expect("write");
        assert_eq!(echoed(&mut stream, GUARD).await.as_deref(), Some(&b"a"[..]));
        assert!(
            sent.elapsed() >= 2 * SILENCE,
            "a round trip took {:?}, under the delay each way",
            sent.elapsed()
        );
    }
}
