//! Secrets: values that workflows refer to by name (`env: { DB_PASSWORD: { secret: NAME } }`),
//! stored sealed with a key only the scheduler nodes hold, opened at dispatch to go into the
//! task's environment, and masked in the log lines the store keeps.
//!
//! A secret belongs to an app, or is global (app ''): each app has its own namespace of names.
//! A task of a workflow of app X gets X's secret of the name it gives, else the global one; a
//! workflow without an app gets global ones only. No other app's secret is ever looked at, so a
//! reference can never resolve to it, whatever was deleted or re-applied since the check at
//! apply.
//!
//! The key is 32 bytes (base64 in a file or the environment; every node needs the same one).
//! A value is sealed with ChaCha20-Poly1305 under a fresh random nonce, with the secret's name
//! (`app/name` for an app's) as associated data, so a sealed value copied to another name or
//! app does not open. The API takes a value in and never gives one out; audit rows record that
//! a secret changed, never its value.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax_core::ids::InstanceId;
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

    /// `value` sealed for the secret called `name` of `app` ('' for a global one), as base64
    /// of nonce, ciphertext and tag.
    pub fn seal(&self, app: &str, name: &str, value: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        // The system's random source failing is not something a node can go on without.
        SystemRandom::new()
            .fill(&mut nonce)
            .unwrap_or_else(|_| panic!("the system's random source failed"));
        let mut sealed = value.as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated_data(app, name).as_bytes()),
                &mut sealed,
            )
            .unwrap_or_else(|_| panic!("sealing cannot fail for a value of this size"));
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        STANDARD.encode(out)
    }

    pub fn open(&self, app: &str, name: &str, sealed: &str) -> Result<String, SecretError> {
        let unopenable = || SecretError::Unopenable(associated_data(app, name));
        let bytes = STANDARD.decode(sealed).map_err(|_| unopenable())?;
        if bytes.len() < NONCE_LEN {
            return Err(unopenable());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| unopenable())?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .0
            .open_in_place(
                nonce,
                Aad::from(associated_data(app, name).as_bytes()),
                &mut sealed,
            )
            .map_err(|_| unopenable())?;
        String::from_utf8(plain.to_vec()).map_err(|_| unopenable())
    }
}

/// What a sealed value is bound to: the name of a global secret (as before apps existed, so
/// those still open), `app/name` for an app's (a name never holds `/`).
fn associated_data(app: &str, name: &str) -> String {
    if app.is_empty() {
        name.to_string()
    } else {
        format!("{app}/{name}")
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
    values: Arc<Values>,
}

/// Every secret that opened, and what log lines are masked for.
#[derive(Default)]
struct Values {
    /// App ('' for global) → name → value.
    by_app: HashMap<String, HashMap<String, String>>,
    /// The global secrets' values (each line of them), longest first: masked in every line.
    global_masked: Vec<String>,
    /// Each app's own values (each line of them) that no global one has, longest first: masked
    /// in the lines of that app's tasks only, so a task cannot test whether a string it prints
    /// is another app's secret by seeing it masked.
    app_masked: HashMap<String, Vec<String>>,
}

impl Values {
    fn from_opened(by_app: HashMap<String, HashMap<String, String>>) -> Values {
        let global_masked = masked_lines(by_app.get("").into_iter().flat_map(|v| v.values()));
        let app_masked = by_app
            .iter()
            .filter(|(app, _)| !app.is_empty())
            .map(|(app, values)| {
                let mut own = masked_lines(values.values());
                own.retain(|line| !global_masked.contains(line));
                (app.clone(), own)
            })
            .filter(|(_, own)| !own.is_empty())
            .collect();
        Values {
            by_app,
            global_masked,
            app_masked,
        }
    }

    /// The value a task of a workflow of `app` gets for `name`: the app's own, else the global
    /// one. Never another app's.
    fn resolve(&self, app: &str, name: &str) -> Option<&String> {
        ax_core::app_scope::secret_lookup(app)
            .find_map(|app| self.by_app.get(app).and_then(|values| values.get(name)))
    }

    /// What the lines of a task of `app` are masked for (every app's values when the app is
    /// unknown), longest first.
    fn masked_for(&self, app: Option<&str>) -> Vec<String> {
        let own: Vec<&String> = match app {
            Some(app) => self.app_masked.get(app).into_iter().flatten().collect(),
            None => self.app_masked.values().flatten().collect(),
        };
        let masked: Vec<String> = self.global_masked.iter().chain(own).cloned().collect();
        longest_first(masked)
    }
}

/// Longest first (a value inside another is masked after it), then in byte order, without
/// repeats.
fn longest_first(mut masked: Vec<String>) -> Vec<String> {
    masked.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    masked.dedup();
    masked
}

/// The lines of `values` worth masking (4 characters or more, trimmed), longest first.
fn masked_lines<'a>(values: impl Iterator<Item = &'a String>) -> Vec<String> {
    let masked: Vec<String> = values
        .flat_map(|value| value.lines())
        .map(str::trim)
        .filter(|line| line.len() >= MIN_MASKED_LEN)
        .map(str::to_string)
        .collect();
    longest_first(masked)
}

/// A node's secrets: sealing new ones, opening them for dispatches, masking logs.
pub struct Secrets {
    key: Option<SecretKey>,
    store: Arc<Store>,
    opened: Mutex<Option<Opened>>,
}

impl Secrets {
    pub fn new(key: Option<SecretKey>, store: Arc<Store>) -> Secrets {
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
    async fn current(&self) -> Result<Arc<Values>, StoreError> {
        if let Some(opened) = self.lock().as_ref()
            && opened.at.elapsed() < CACHE_FOR
        {
            return Ok(opened.values.clone());
        }
        let records = self.store.list_secrets().await?;
        let mut by_app: HashMap<String, HashMap<String, String>> = HashMap::new();
        if let Some(key) = &self.key {
            for record in records {
                match key.open(&record.app, &record.name, &record.sealed) {
                    Ok(value) => {
                        by_app
                            .entry(record.app)
                            .or_default()
                            .insert(record.name, value);
                    }
                    Err(err) => tracing::warn!(error = %err, "a secret does not open"),
                }
            }
        }
        let values = Arc::new(Values::from_opened(by_app));
        *self.lock() = Some(Opened {
            at: Instant::now(),
            values: values.clone(),
        });
        Ok(values)
    }

    /// The environment a task of a workflow of `app` gets for its secret variables (variable
    /// → value), or why not. Each name is the app's own secret, else the global one; never
    /// another app's.
    pub async fn environment(
        &self,
        app: &str,
        wanted: &BTreeMap<String, String>,
    ) -> Result<Result<Vec<(String, String)>, String>, StoreError> {
        let values = self.current().await?;
        let mut env = Vec::with_capacity(wanted.len());
        for (variable, secret) in wanted {
            match values.resolve(app, secret) {
                Some(value) => env.push((variable.clone(), value.clone())),
                None if self.key.is_none() => {
                    return Ok(Err(format!(
                        "secret {secret:?} ({variable}): this node has no secret key"
                    )));
                }
                None => {
                    let whose = if app.is_empty() {
                        "no global secret has that name".to_string()
                    } else {
                        format!("neither app {app} nor the global secrets have one of that name")
                    };
                    return Ok(Err(format!(
                        "secret {secret:?} ({variable}): {whose}, or it does not open with this \
                         node's key"
                    )));
                }
            }
        }
        Ok(Ok(env))
    }

    /// Masks in the chunk's lines the values its task could have been given: the global
    /// secrets' and those of its workflow's app, which `app_of` answers (asked only when a
    /// line holds an app's own value; every app's values are masked when it cannot tell).
    /// Costs nothing while no secret exists.
    pub async fn mask(
        &self,
        chunk: &mut LogChunk,
        app_of: impl AsyncFnOnce(InstanceId) -> Option<String>,
    ) {
        let values = match self.current().await {
            Ok(values) => values,
            Err(err) => {
                // The chunk is stored as it is rather than held: the store that could not list
                // the secrets will most likely refuse the chunk too, and it is retried then.
                tracing::warn!(error = %err, "cannot read secrets to mask log lines");
                return;
            }
        };
        // An app's value (or a piece of one at a cut) in the chunk needs the task's app;
        // otherwise only the global values are masked, without a store read.
        let all_apps: Vec<String> = values.app_masked.values().flatten().cloned().collect();
        if all_apps.is_empty() || !chunk.would_mask(&all_apps, MIN_MASKED_LEN) {
            if !values.global_masked.is_empty() {
                chunk.mask(&values.global_masked, MASK, MIN_MASKED_LEN);
            }
            return;
        }
        let app = app_of(chunk.instance_id).await;
        chunk.mask(&values.masked_for(app.as_deref()), MASK, MIN_MASKED_LEN);
    }

    /// Masks in outputs the value of every secret (of any app: outputs are few, and masking a
    /// value another app's task cannot have been given costs nothing but a `****`), before they
    /// are stored. Costs nothing while no secret exists.
    pub async fn mask_outputs(&self, outputs: &mut ax_core::outputs::Outputs) {
        let values = match self.current().await {
            Ok(values) => values,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read secrets to mask outputs");
                return;
            }
        };
        let every = values.masked_for(None);
        if every.is_empty() {
            return;
        }
        let rules = ax_core::mask::MaskRules {
            starts_attempt: true,
            min_piece: MIN_MASKED_LEN,
        };
        for value in outputs.values_mut() {
            let streams = vec![(); value.split('\n').count()];
            if let Some(masked) = ax_core::mask::mask_lines(&streams, value, &every, MASK, rules) {
                *value = masked;
            }
        }
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
    fn a_value_opens_with_its_key_name_and_app_only() {
        let sealed = key(1).seal("", "warehouse-db", "s3cr3t!");
        assert!(!sealed.contains("s3cr3t"));
        assert_ne!(
            sealed,
            key(1).seal("", "warehouse-db", "s3cr3t!"),
            "a fresh nonce each time"
        );
        assert_eq!(key(1).open("", "warehouse-db", &sealed).unwrap(), "s3cr3t!");
        assert!(matches!(
            key(2).open("", "warehouse-db", &sealed),
            Err(SecretError::Unopenable(_))
        ));
        assert!(matches!(
            key(1).open("", "other-name", &sealed),
            Err(SecretError::Unopenable(_))
        ));
        assert!(key(1).open("", "warehouse-db", "not base64!").is_err());
        // An app's value does not open as another app's, nor as a global one, nor the reverse.
        let finance = key(1).seal("finance", "warehouse-db", "s3cr3t!");
        assert_eq!(
            key(1).open("finance", "warehouse-db", &finance).unwrap(),
            "s3cr3t!"
        );
        for (app, value) in [("sales", &finance), ("", &finance), ("finance", &sealed)] {
            assert!(
                key(1).open(app, "warehouse-db", value).is_err(),
                "opened as app {app:?}"
            );
        }
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

    fn values(secrets: &[(&str, &str, &str)]) -> Values {
        let mut by_app: HashMap<String, HashMap<String, String>> = HashMap::new();
        for (app, name, value) in secrets {
            by_app
                .entry(app.to_string())
                .or_default()
                .insert(name.to_string(), value.to_string());
        }
        Values::from_opened(by_app)
    }

    #[test]
    fn a_reference_resolves_to_its_apps_secret_then_the_global_one_never_another_apps() {
        let v = values(&[
            ("", "db", "global-db"),
            ("sales", "db", "sales-db"),
            ("finance", "ledger", "finance-ledger"),
        ]);
        assert_eq!(v.resolve("sales", "db").unwrap(), "sales-db");
        assert_eq!(v.resolve("finance", "db").unwrap(), "global-db");
        assert_eq!(v.resolve("", "db").unwrap(), "global-db");
        assert_eq!(v.resolve("sales", "ledger"), None);
        assert_eq!(v.resolve("", "ledger"), None);
        assert_eq!(v.resolve("finance", "ledger").unwrap(), "finance-ledger");
    }

    #[test]
    fn an_apps_values_are_masked_in_its_own_tasks_lines_only() {
        let v = values(&[
            ("", "db", "global-value"),
            ("sales", "db", "sales-value"),
            ("finance", "ledger", "finance-value\nsecond-line"),
            ("finance", "shared", "global-value"),
        ]);
        assert_eq!(v.global_masked, ["global-value"]);
        assert_eq!(
            v.masked_for(Some("finance")),
            ["finance-value", "global-value", "second-line"]
        );
        assert_eq!(v.masked_for(Some("sales")), ["global-value", "sales-value"]);
        assert_eq!(v.masked_for(Some("")), ["global-value"]);
        assert_eq!(
            v.masked_for(None),
            [
                "finance-value",
                "global-value",
                "sales-value",
                "second-line"
            ]
        );
    }
}
