//! One file per command, each with an `Args` struct and a thin `run`.

pub mod apply;
pub mod audit;
pub mod backfill;
pub mod cancel;
pub mod cluster;
pub mod dag;
pub mod dev;
pub mod get;
pub mod logs;
pub mod pause;
pub mod purge;
pub mod rerun;
pub mod resume;
pub mod retry;
pub mod secret;
pub mod token;
pub mod trigger;
pub mod whoami;
pub mod why;
pub mod workers;
