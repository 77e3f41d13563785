//! Worker choice: which live worker gets an attempt.

/// How to pick among the workers that can take an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Fewest running attempts first (the default).
    #[default]
    LeastRunning,
    RoundRobin,
    Random,
}
