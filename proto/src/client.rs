//! What every client of a scheduler node needs to reach it: the endpoint with TLS when the
//! address is `https://` or a CA is given, an optional client certificate (a worker's, for
//! mutual TLS), and the bearer token on every call.

use std::path::{Path, PathBuf};

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// How a client proves itself and checks the node.
#[derive(Debug, Clone, Default)]
pub struct ClientAuth {
    /// Sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// The CA that signed the nodes' certificates; without it, `https://` trusts the system's
    /// roots.
    pub tls_ca: Option<PathBuf>,
    /// A client certificate and its key (PEM), for nodes that require one (workers).
    pub tls_identity: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid address {address:?}: {why}")]
    Address { address: String, why: String },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("the token has characters a header cannot carry")]
    Token,
    #[error("TLS settings: {0}")]
    Tls(String),
}

impl ClientAuth {
    /// Whether a connection to `address` is to use TLS.
    pub fn uses_tls(&self, address: &str) -> bool {
        address.starts_with("https://") || self.tls_ca.is_some()
    }

    /// The endpoint of `address`, with TLS where [`ClientAuth::uses_tls`] says. `server_name`
    /// names the host the certificate must name when `address` is a resolved IP.
    pub fn endpoint(
        &self,
        address: &str,
        server_name: Option<&str>,
    ) -> Result<Endpoint, ClientError> {
        let address = if self.tls_ca.is_some() && address.starts_with("http://") {
            format!("https://{}", &address["http://".len()..])
        } else {
            address.to_string()
        };
        let endpoint =
            Endpoint::from_shared(address.clone()).map_err(|err| ClientError::Address {
                address: address.clone(),
                why: err.to_string(),
            })?;
        if !self.uses_tls(&address) {
            return Ok(endpoint);
        }
        let mut tls = ClientTlsConfig::new();
        tls = match &self.tls_ca {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read_pem(ca, "CERTIFICATE")?)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &self.tls_identity {
            tls = tls.identity(Identity::from_pem(
                read_pem(cert, "CERTIFICATE")?,
                read_pem(key, "PRIVATE KEY")?,
            ));
        }
        if let Some(name) = server_name {
            tls = tls.domain_name(name);
        }
        endpoint
            .tls_config(tls)
            .map_err(|err| ClientError::Tls(err.to_string()))
    }

    /// The interceptor that adds the token to every call.
    pub fn bearer(&self) -> Result<Bearer, ClientError> {
        let value = match &self.token {
            Some(token) => Some(
                MetadataValue::try_from(format!("Bearer {}", token.trim()))
                    .map_err(|_| ClientError::Token)?,
            ),
            None => None,
        };
        Ok(Bearer(value))
    }
}

/// Reads a PEM file, checking it holds what it is for, so a swapped flag is named.
fn read_pem(path: &Path, kind: &str) -> Result<Vec<u8>, ClientError> {
    let pem = std::fs::read(path).map_err(|source| ClientError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if !String::from_utf8_lossy(&pem).contains(kind) {
        return Err(ClientError::File {
            path: path.to_path_buf(),
            why: format!("no PEM {kind} in it"),
        });
    }
    Ok(pem)
}

/// Reads a token from a file (a Kubernetes secret, a systemd credential): its first line.
pub fn read_token_file(path: &Path) -> Result<String, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClientError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(ClientError::File {
            path: path.to_path_buf(),
            why: "empty: expected a token on its first line".into(),
        });
    }
    Ok(token)
}

/// Adds `authorization: Bearer <token>` to each call (nothing without a token).
#[derive(Debug, Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Bearer {
    /// Adds the token to one request.
    pub fn apply<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        self.apply(&mut request);
        Ok(request)
    }
}
