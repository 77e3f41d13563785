//! API tokens, stored by their hash, and secrets, stored sealed.

use ax_core::Millis;

/// An API token as stored: never the token itself, which only its creator saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub name: String,
    pub role: ax_core::access::Role,
    /// `Some(app)`: the token sees and acts on that app's workflows only.
    pub app: Option<String>,
    pub created_at: Millis,
    /// The token name (or `store` for a token made on the store directly) that created it.
    pub created_by: String,
    pub expires_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
    /// A worker token's scope (worker ids, apps, labels); `None` for the other roles. A worker
    /// token stored before scopes existed reads as `WorkerScope::any()`.
    pub worker: Option<ax_core::worker_scope::WorkerScope>,
}

impl TokenRecord {
    /// Whether a request may use the token at `now`.
    pub fn is_valid_at(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now < at)
    }
}

/// A token to store: its hash, never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    pub name: String,
    pub role: ax_core::access::Role,
    pub app: Option<String>,
    /// SHA-256 of the token, as lowercase hex.
    pub hash: String,
    pub created_at: Millis,
    pub created_by: String,
    pub expires_at: Option<Millis>,
    /// A worker token's scope; `None` for the other roles.
    pub worker: Option<ax_core::worker_scope::WorkerScope>,
}

/// A secret as stored: its value sealed with the nodes' key (base64), never in the clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRecord {
    /// The app whose workflows may name it; '' for a global secret, which every app's may.
    /// Each app has its own namespace of names: (app, name) is the key.
    pub app: String,
    pub name: String,
    pub sealed: String,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub updated_by: String,
}
