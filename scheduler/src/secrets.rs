//! Secrets: values that workflows refer to by name (`env: { DB_PASSWORD: { secret: NAME } }`),
//! stored sealed with a key only the scheduler nodes hold, opened at dispatch to go into the
//! task's environment, and masked in the log lines the store keeps.
//!
//! The key is 32 bytes (base64 in a file or the environment; every node needs the same one).
//! A value is sealed with ChaCha20-Poly1305 under a fresh random nonce, with the secret's name
//! as associated data, so a sealed value copied to another name does not open. The API takes a
//! value in and never gives one out; audit rows record that a secret changed, never its value.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax_store::{LogChunk, Store, StoreError};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// How long the opened values are reused: a changed secret reaches dispatches and the log
/// masking of every node within this.
const CACHE_FOR: Duration = Duration::from_secs(5);
/// Values shorter than this are not masked in logs: masking `1` or `on` would garble every line
/// and hide nothing worth hiding. It is also the shortest piece of a value masked at a log
/// chunk's edges, where a worker's line cut may have split it (`ax_core::mask`).
pub const MIN_MASKED_LEN: usize = 4;
/// The largest secret value.
pub const MAX_VALUE_BYTES: usize = 32 << 10;
const MASK: &str = "***";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "this node has no secret key: start every scheduler with --secret-key-file (or \
         AX_SECRET_KEY), 32 random bytes in base64, e.g. from `openssl rand -base64 32`"
    )]
    NoKey,
    #[error("secret key: {0}")]
    BadKey(String),
    #[error("secret {0:?} does not open with this node's key (sealed with another key?)")]
    Unopenable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The node's secret key: from a file or the environment's text (base64 of 32 bytes).
#[derive(Clone)]
pub struct SecretKey(LessSafeKey);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(…)")
    }
}

impl SecretKey {
    pub fn from_base64(text: &str) -> Result<SecretKey, SecretError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|err| SecretError::BadKey(format!("not base64: {}", not_base64(&err))))?;
        if bytes.len() != 32 {
            return Err(SecretError::BadKey(format!(
                "{} bytes; it must be 32 (e.g. `openssl rand -base64 32`)",
                bytes.len()
            )));
        }
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
            .map_err(|_| SecretError::BadKey("not a ChaCha20-Poly1305 key".into()))?;
        Ok(SecretKey(LessSafeKey::new(key)))
    }

    pub fn from_file(path: &Path) -> Result<SecretKey, SecretError> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| SecretError::BadKey(format!("reading {}: {err}", path.display())))?;
        Self::from_base64(&text)
            .map_err(|err| SecretError::BadKey(format!("{}: {err}", path.display())))
    }

    /// `value` sealed for the secret called `name`, as base64 of nonce, ciphertext and tag.
    pub fn seal(&self, name: &str, value: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        // The system's random source failing is not something a node can go on without.
        SystemRandom::new()
            .fill(&mut nonce)
            .unwrap_or_else(|_| panic!("the system's random source failed"));
        let mut sealed = value.as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut sealed,
            )
            .unwrap_or_else(|_| panic!("sealing cannot fail for a value of this size"));
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        STANDARD.encode(out)
    }

    pub fn open(&self, name: &str, sealed: &str) -> Result<String, SecretError> {
        let unopenable = || SecretError::Unopenable(name.to_string());
        let bytes = STANDARD.decode(sealed).map_err(|_| unopenable())?;
        if bytes.len() < NONCE_LEN {
            return Err(unopenable());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| unopenable())?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .0
            .open_in_place(nonce, Aad::from(name.as_bytes()), &mut sealed)
            .map_err(|_| unopenable())?;
        String::from_utf8(plain.to_vec()).map_err(|_| unopenable())
    }
}

/// What is wrong with a key's base64, without the byte that is wrong (base64's own message
/// quotes it, and the text may be a secret of another kind given by mistake).
fn not_base64(err: &base64::DecodeError) -> String {
    use base64::DecodeError;
    match err {
        DecodeError::InvalidByte(offset, _) => {
            format!("the character at offset {offset} is not in base64's alphabet")
        }
        DecodeError::InvalidLength(len) => {
            format!("{len} base64 characters do not make whole bytes")
        }
        DecodeError::InvalidLastSymbol(offset, _) => {
            format!("the last character (offset {offset}) has bits past the last byte")
        }
        DecodeError::InvalidPadding => "its `=` padding is wrong".into(),
    }
}

/// The opened values, as a node last read them.
struct Opened {
    at: Instant,
    values: Arc<HashMap<String, String>>,
    /// What log lines are masked for, longest first (a value inside another is masked after
    /// it).
    masked: Arc<Vec<String>>,
}

/// A node's secrets: sealing new ones, opening them for dispatches, masking logs.
pub struct Secrets {
    key: Option<SecretKey>,
    store: Arc<dyn Store>,
    opened: Mutex<Option<Opened>>,
}

impl Secrets {
    pub fn new(key: Option<SecretKey>, store: Arc<dyn Store>) -> Secrets {
        Secrets {
            key,
            store,
            opened: Mutex::new(None),
        }
    }

    pub fn key(&self) -> Result<&SecretKey, SecretError> {
        self.key.as_ref().ok_or(SecretError::NoKey)
    }

    /// Forgets the opened values: the next use reads them again (after a change here).
    pub fn forget(&self) {
        *self.lock() = None;
    }

    /// Every secret's value, read and opened at most every [`CACHE_FOR`]. Without a key, or
    /// with a value this key does not open, the values that open are answered and the rest
    /// are missing (a dispatch that needs one waits and says why).
    async fn current(
        &self,
    ) -> Result<(Arc<HashMap<String, String>>, Arc<Vec<String>>), StoreError> {
        if let Some(opened) = self.lock().as_ref()
            && opened.at.elapsed() < CACHE_FOR
        {
            return Ok((opened.values.clone(), opened.masked.clone()));
        }
        let records = self.store.list_secrets().await?;
        let mut values = HashMap::new();
        if let Some(key) = &self.key {
            for record in records {
                match key.open(&record.name, &record.sealed) {
                    Ok(value) => {
                        values.insert(record.name, value);
                    }
                    Err(err) => tracing::warn!(error = %err, "a secret does not open"),
                }
            }
        }
        let mut masked: Vec<String> = values
            .values()
            .flat_map(|value| value.lines())
            .map(str::trim)
            .filter(|line| line.len() >= MIN_MASKED_LEN)
            .map(str::to_string)
            .collect();
        masked.sort_by_key(|value| std::cmp::Reverse(value.len()));
        masked.dedup();
        let values = Arc::new(values);
        let masked = Arc::new(masked);
        *self.lock() = Some(Opened {
            at: Instant::now(),
            values: values.clone(),
            masked: masked.clone(),
        });
        Ok((values, masked))
    }

    /// The environment a task's secret variables get (variable → value), or why not.
    pub async fn environment(
        &self,
        wanted: &BTreeMap<String, String>,
    ) -> Result<Result<Vec<(String, String)>, String>, StoreError> {
        let (values, _) = self.current().await?;
        let mut env = Vec::with_capacity(wanted.len());
        for (variable, secret) in wanted {
            match values.get(secret) {
                Some(value) => env.push((variable.clone(), value.clone())),
                None if self.key.is_none() => {
                    return Ok(Err(format!(
                        "secret {secret:?} ({variable}): this node has no secret key"
                    )));
                }
                None => {
                    return Ok(Err(format!(
                        "secret {secret:?} ({variable}) does not exist or does not open with \
                         this node's key"
                    )));
                }
            }
        }
        Ok(Ok(env))
    }

    /// Masks every secret's value in the chunk's lines. Costs nothing while no secret exists.
    pub async fn mask(&self, chunk: &mut LogChunk) {
        let masked = match self.current().await {
            Ok((_, masked)) => masked,
            Err(err) => {
                // The chunk is stored as it is rather than held: the store that could not list
                // the secrets will most likely refuse the chunk too, and it is retried then.
                tracing::warn!(error = %err, "cannot read secrets to mask log lines");
                return;
            }
        };
        if masked.is_empty() {
            return;
        }
        chunk.mask(&masked, MASK, MIN_MASKED_LEN);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Opened>> {
        self.opened.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SecretKey {
        SecretKey::from_base64(&STANDARD.encode([byte; 32])).unwrap()
    }

    #[test]
    fn a_value_opens_with_its_key_and_name_only() {
        let sealed = key(1).seal("warehouse-db", "s3cr3t!");
        assert!(!sealed.contains("s3cr3t"));
        assert_ne!(
            sealed,
            key(1).seal("warehouse-db", "s3cr3t!"),
            "a fresh nonce each time"
        );
        assert_eq!(key(1).open("warehouse-db", &sealed).unwrap(), "s3cr3t!");
        assert!(matches!(
            key(2).open("warehouse-db", &sealed),
            Err(SecretError::Unopenable(_))
        ));
        assert!(matches!(
            key(1).open("other-name", &sealed),
            Err(SecretError::Unopenable(_))
        ));
        assert!(key(1).open("warehouse-db", "not base64!").is_err());
    }

    #[test]
    fn a_key_must_be_32_bytes_of_base64() {
        let err = SecretKey::from_base64("c2hvcnQ=").unwrap_err().to_string();
        assert!(err.contains("5 bytes; it must be 32"), "{err}");
        let err = SecretKey::from_base64("***").unwrap_err().to_string();
        assert_eq!(
            err,
            "secret key: not base64: the character at offset 0 is not in base64's alphabet"
        );
        // base64's own message would name the byte (`Invalid symbol 42`).
        assert!(!err.contains("42"), "{err}");
    }
}
