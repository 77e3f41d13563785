//! The shell's clock: this machine's clock corrected to the store's. The core never reads
//! time itself; it is handed `now` from here.
//!
//! Every node of a cluster judges due times, lease ages and heartbeat ages against one clock,
//! the database's: the membership task measures this node's offset from it at every lease
//! renewal (`membership.rs`) and [`now_ms`] applies it, so a node whose own clock is off fires
//! nothing early or late and declares no worker dead early.

use std::sync::atomic::{AtomicI64, Ordering};

use ax_core::Millis;

/// The store's clock minus this machine's, in milliseconds.
static STORE_CLOCK_CORRECTION_MS: AtomicI64 = AtomicI64::new(0);

/// Now on the store's clock.
pub fn now_ms() -> Millis {
    local_ms().saturating_add(STORE_CLOCK_CORRECTION_MS.load(Ordering::Relaxed))
}

/// Now on this machine's own clock.
pub fn local_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as Millis)
        .unwrap_or(0)
}

/// This node's clock minus the store's, as last adopted.
pub fn offset() -> i64 {
    -STORE_CLOCK_CORRECTION_MS.load(Ordering::Relaxed)
}

/// Adopts a new measurement of this node's clock minus the store's.
pub fn set_offset(clock_offset_ms: i64) {
    STORE_CLOCK_CORRECTION_MS.store(-clock_offset_ms, Ordering::Relaxed);
}
