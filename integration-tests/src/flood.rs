//! Connection floods against a node, as an attacker who reaches its port would make them: TCP
//! connections that send nothing or a few bytes and then wait, and TLS sessions that finish
//! their handshake and say nothing. With them, what the node's connection limits are judged by:
//! whether (and when) the node closes each of them, and how much CPU the node spent meanwhile
//! (from `/proc/<pid>/stat`). Used by the security tests (`security::connections`) and by the
//! `ax-flood` command that measures the figures with a release build.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// How long one connect (and TLS handshake) of a flood may take before it counts as failed.
const CONNECT_GUARD: Duration = Duration::from_secs(10);

/// Connections opened against a node and held open by the attacker.
pub struct Flood {
    plain: Vec<TcpStream>,
    tls: Vec<TlsStream<TcpStream>>,
    /// Connects (or handshakes) that failed or did not finish within [`CONNECT_GUARD`].
    pub failed: usize,
}

impl Flood {
    pub fn new() -> Flood {
        Flood {
            plain: Vec::new(),
            tls: Vec::new(),
            failed: 0,
        }
    }

    /// How many connections the flood holds.
    pub fn len(&self) -> usize {
        self.plain.len() + self.tls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Opens `count` TCP connections to `addr`, each sending `first_bytes` (perhaps nothing) and
    /// then nothing more. A connect the kernel completes counts even if the node never accepts
    /// it: it waits in the listen queue, as an attacker's would.
    pub async fn open_plain(&mut self, addr: SocketAddr, count: usize, first_bytes: &[u8]) {
        let opened = futures::future::join_all((0..count).map(|_| async move {
            let mut stream = tokio::time::timeout(CONNECT_GUARD, TcpStream::connect(addr))
                .await
                .ok()?
                .ok()?;
            if !first_bytes.is_empty() {
                stream.write_all(first_bytes).await.ok()?;
            }
            Some(stream)
        }))
        .await;
        for stream in opened {
            match stream {
                Some(stream) => self.plain.push(stream),
                None => self.failed += 1,
            }
        }
    }

    /// Opens `count` TLS sessions to `addr` that finish their handshake (trusting `ca`, asking
    /// for `server_name`) and then send nothing.
    pub async fn open_tls_silent(
        &mut self,
        addr: SocketAddr,
        count: usize,
        ca: &Path,
        server_name: &str,
    ) -> anyhow::Result<()> {
        let connector = tls_connector(ca)?;
        let name = ServerName::try_from(server_name.to_string())
            .with_context(|| format!("{server_name:?} is not a server name"))?;
        let opened = futures::future::join_all((0..count).map(|_| {
            let connector = connector.clone();
            let name = name.clone();
            async move {
                let handshake = async {
                    let stream = TcpStream::connect(addr).await.ok()?;
                    connector.connect(name, stream).await.ok()
                };
                tokio::time::timeout(CONNECT_GUARD, handshake)
                    .await
                    .ok()
                    .flatten()
            }
        }))
        .await;
        for session in opened {
            match session {
                Some(session) => self.tls.push(session),
                None => self.failed += 1,
            }
        }
        Ok(())
    }

    /// Waits until the node has closed every connection of the flood, or `within` has passed;
    /// answers how many it closed. Whatever the node sends before it closes is read and thrown
    /// away. The flood is emptied.
    pub async fn closed_within(&mut self, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        let plain = std::mem::take(&mut self.plain);
        let tls = std::mem::take(&mut self.tls);
        let closed = futures::future::join_all(
            plain
                .into_iter()
                .map(|stream| closed_by_peer(stream, deadline))
                .map(futures::future::Either::Left)
                .chain(
                    tls.into_iter()
                        .map(|stream| closed_by_peer(stream, deadline))
                        .map(futures::future::Either::Right),
                ),
        )
        .await;
        closed.into_iter().filter(|closed| *closed).count()
    }
}

impl Default for Flood {
    fn default() -> Self {
        Flood::new()
    }
}

/// Whether the peer closes `stream` (end of stream, or a reset) before `deadline`.
async fn closed_by_peer(
    mut stream: impl AsyncRead + Unpin,
    deadline: tokio::time::Instant,
) -> bool {
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A TLS client that trusts the certificates in `ca` (PEM) and offers HTTP/2.
pub fn tls_connector(ca: &Path) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))?
    {
        roots
            .add(cert.with_context(|| format!("{}: not a PEM certificate", ca.display()))?)
            .with_context(|| format!("{}: not a usable CA certificate", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The CPU a process spends from now on, from its `/proc/<pid>/stat` (user and system time).
pub struct CpuMeter {
    pid: u32,
    ticks: u64,
    since: Instant,
}

impl CpuMeter {
    pub fn start(pid: u32) -> anyhow::Result<CpuMeter> {
        Ok(CpuMeter {
            pid,
            ticks: cpu_ticks(pid)?,
            since: Instant::now(),
        })
    }

    /// The share of one core the process used since [`CpuMeter::start`], in percent.
    pub fn percent(&self) -> anyhow::Result<f64> {
        let ticks = cpu_ticks(self.pid)?.saturating_sub(self.ticks);
        // SAFETY: sysconf has no memory-safety preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if per_second <= 0 {
            bail!("sysconf(_SC_CLK_TCK) failed");
        }
        let seconds = ticks as f64 / per_second as f64;
        Ok(100.0 * seconds / self.since.elapsed().as_secs_f64())
    }
}

/// utime + stime of `pid`, in clock ticks. The fields follow the command name, which is in
/// parentheses and may itself hold spaces and parentheses.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let after_name = stat
        .rfind(')')
        .map(|end| &stat[end + 1..])
        .with_context(|| format!("{path}: no command name"))?;
    // After the name: state (field 3) … utime (field 14) and stime (field 15).
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index - 3)
            .and_then(|text| text.parse().ok())
            .with_context(|| format!("{path}: field {index} is not a number"))
    };
    Ok(field(14)? + field(15)?)
}

/// How many file descriptors `pid` has open.
pub fn open_files(pid: u32) -> anyhow::Result<usize> {
    let path = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&path)
        .with_context(|| format!("reading {path}"))?
        .count())
}
