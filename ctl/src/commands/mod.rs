//! One file per command, each with an `Args` struct and a thin `run`.

pub mod apply;
pub mod audit;
pub mod backfill;
pub mod cancel;
pub mod cluster;
pub mod dag;
pub mod delete;
pub mod dev;
pub mod diff;
pub mod folder;
pub mod get;
pub mod import;
pub mod logs;
pub mod mark;
pub mod pause;
pub mod purge;
pub mod rerun;
pub mod resume;
pub mod retry;
pub mod secret;
pub mod token;
pub mod trigger;
pub mod wait;
pub mod whoami;
pub mod why;
pub mod workers;
