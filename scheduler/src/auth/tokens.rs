//! Making tokens: 256 random bits, shown once, stored as a SHA-256 hash. A token is random
//! enough that a fast hash is as good as a slow one: nothing to guess from the hash.

use ax_core::Millis;
use ax_core::access::{Role, TOKEN_PREFIX, check_token_name};
use ax_core::worker_scope::WorkerScope;
use ax_store::{NewToken, Store, StoreError};
use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// SHA-256 of a token, as lowercase hex: what the store keeps and looks tokens up by.
pub fn hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new token's text.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What a token is to be.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub name: String,
    pub role: Role,
    pub app: Option<String>,
    /// How long it lasts; `None`: until revoked.
    pub lifetime_ms: Option<i64>,
    pub created_by: String,
    /// A worker token's scope: required for role `worker` (what ids it may register, which
    /// apps' tasks it is sent, which labels it may claim), refused for the other roles.
    pub worker: Option<WorkerScope>,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{0}")]
    Invalid(String),
    #[error("a token named {0:?} exists already")]
    Taken(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Creates a token and returns its text (the only time it exists outside the caller's hands)
/// with what was stored.
pub async fn create(
    store: &Store,
    request: TokenRequest,
    now: Millis,
) -> Result<(String, NewToken), CreateError> {
    check_token_name(&request.name).map_err(CreateError::Invalid)?;
    match (request.role, &request.worker) {
        (Role::Worker, None) => {
            return Err(CreateError::Invalid(
                "a worker token names the worker ids it may register: give --worker-id PATTERN \
                 (an id, a prefix such as etl-*, or '*' for any id)"
                    .into(),
            ));
        }
        (Role::Worker, Some(_)) if request.app.is_some() => {
            return Err(CreateError::Invalid(
                "a worker token's apps are part of its worker scope (--app with --role worker)"
                    .into(),
            ));
        }
        (Role::Worker, Some(_)) => {}
        (role, Some(_)) => {
            return Err(CreateError::Invalid(format!(
                "worker ids, apps and labels belong to worker tokens, not to a {role} token"
            )));
        }
        (_, None) => {}
    }
    if let Some(app) = &request.app
        && app.trim().is_empty()
    {
        return Err(CreateError::Invalid("the app of a token is empty".into()));
    }
    let token = generate();
    let new = NewToken {
        name: request.name.clone(),
        role: request.role,
        app: request.app,
        hash: hash(&token),
        created_at: now,
        created_by: request.created_by,
        expires_at: request.lifetime_ms.map(|ms| now.saturating_add(ms)),
        worker: request.worker,
    };
    if !store.create_token(&new).await? {
        return Err(CreateError::Taken(request.name));
    }
    Ok((token, new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_have_the_shape_the_gate_checks_and_differ() {
        let a = generate();
        let b = generate();
        assert!(ax_core::access::is_token_shaped(&a), "{a}");
        assert_ne!(a, b);
        assert_eq!(hash(&a).len(), 64);
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
