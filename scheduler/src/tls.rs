//! TLS on the node's port (rustls): the certificate and key from PEM files, read again when
//! they change (a renewed certificate needs no restart), and optionally a CA whose
//! certificates workers present (mutual TLS: a worker's certificate names its id).
//!
//! Handshakes happen in each connection's own task (`connections.rs`), within the connection's
//! first-request deadline, so a client that connects and says nothing holds up no one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_util::sync::CancellationToken;

/// How often the files are looked at for a change.
const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// Where the node's TLS material is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With it, a worker must present a certificate this CA signed, naming the worker's id (a
    /// DNS name in its subject alternative names). Other clients need none.
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The node's TLS configuration, replaced whole when the files change.
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<(Arc<ServerConfig>, Stamps)>,
}

/// The files' modification times and sizes, to tell a change.
type Stamps = Vec<Option<(SystemTime, u64)>>;

impl ServerTls {
    pub fn load(files: TlsFiles) -> Result<Arc<ServerTls>, TlsError> {
        let stamps = stamps(&files);
        let config = build(&files)?;
        Ok(Arc::new(ServerTls {
            files,
            current: RwLock::new((Arc::new(config), stamps)),
        }))
    }

    /// The DNS names the node's own certificate names (wildcards left out): names clients
    /// reach this node by, which a DNS-rebinding page cannot hold a certificate for.
    pub fn own_dns_names(&self) -> Vec<String> {
        let Ok(chain) = certificates(&self.files.cert) else {
            return Vec::new();
        };
        let Some(leaf) = chain.first() else {
            return Vec::new();
        };
        match webpki::EndEntityCert::try_from(leaf) {
            Ok(cert) => cert
                .valid_dns_names()
                .filter(|name| !name.starts_with('*'))
                .map(str::to_string)
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    pub fn requires_worker_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The configuration a new connection's handshake uses.
    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// Reads the files again if they changed. A change that does not load (a key written
    /// before its certificate, say) keeps the configuration in use and is tried again at the
    /// next look.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.files);
        if self.current.read().unwrap_or_else(|e| e.into_inner()).1 == now {
            return Ok(false);
        }
        let config = build(&self.files)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (Arc::new(config), now);
        Ok(true)
    }

    /// Looks for changed files every few seconds until `cancel`.
    pub async fn watch(self: Arc<Self>, cancel: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(RELOAD_EVERY) => {}
            }
            match self.reload_if_changed() {
                Ok(true) => {
                    failing = false;
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                }
                Ok(false) => {}
                Err(err) if !failing => {
                    failing = true;
                    tracing::error!(error = %err, "the changed TLS files do not load; still serving the previous certificate");
                }
                Err(_) => {}
            }
        }
    }
}

fn stamps(files: &TlsFiles) -> Stamps {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|path| {
        std::fs::metadata(path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    })
    .collect()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, why: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// The PEM certificates in `path`; at least one.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid(path, format!("not PEM certificates: {err}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "no certificate (BEGIN CERTIFICATE) in it"));
    }
    Ok(certs)
}

fn build(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let chain = certificates(&files.cert)?;
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|err| invalid(&files.key, format!("no private key in it: {err}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca)? {
                roots
                    .add(cert)
                    .map_err(|err| invalid(ca, format!("not a usable CA certificate: {err}")))?;
            }
            // Clients other than workers (axctl, browsers, services) present no certificate;
            // a worker's stream is refused without one (`require_worker_certificate`).
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .allow_unauthenticated()
                    .build()
                    .map_err(|err| invalid(ca, err.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|err| invalid(&files.key, format!("does not match the certificate: {err}")))?;
    // gRPC needs HTTP/2; browsers may ask for HTTP/1.1.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Checks that a worker's stream came with a certificate naming `worker_id` (the handshake
/// already checked that the CA signed it): one of its DNS names is the id, byte for byte. DNS
/// matching is not used: it forgives case and a trailing dot, and a worker id is not a host
/// name (`W1` and `w1.` are other workers than `w1`); a wildcard name names no worker.
pub fn require_worker_certificate(
    peer_certs: Option<&[CertificateDer<'static>]>,
    worker_id: &str,
) -> Result<(), String> {
    let leaf = peer_certs.and_then(|certs| certs.first()).ok_or_else(|| {
        "this node requires workers to present a client certificate (mutual TLS); \
             give ax-worker --tls-cert and --tls-key"
            .to_string()
    })?;
    let cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|err| format!("the worker's certificate cannot be read: {err}"))?;
    let names: Vec<&str> = cert
        .valid_dns_names()
        .filter(|name| !name.starts_with('*'))
        .collect();
    if names.contains(&worker_id) {
        return Ok(());
    }
    Err(format!(
        "the worker's certificate does not name worker {worker_id:?}: its DNS names are {} \
         (a worker id must be one of them exactly)",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    ))
}
