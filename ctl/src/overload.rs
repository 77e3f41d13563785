//! Calls the scheduler may refuse for load (`axctl trigger`, `axctl backfill`): a refusal with
//! its hint (`ax_proto::overloaded`) is tried again after a jittered, growing wait that is never
//! shorter than the hint (`ax_core::admission::client_retry_delay_ms`), for at most `--retry-for`
//! in all, saying on stderr what it waits for. A refusal creates nothing, so trying again cannot
//! double a run. Any other answer, a RESOURCE_EXHAUSTED without the hint among them (too many
//! failed authentications), is returned at once.

use std::future::Future;
use std::time::{Duration, Instant};

use rand::Rng;
use tonic::Status;

use crate::error::{CtlError, Exit};

/// How long a command keeps trying, unless `--retry-for` says otherwise.
pub const DEFAULT_RETRY_FOR: &str = "1m";

/// `--retry-for`: a duration (`0` does not try again).
pub fn parse_retry_for(text: &str) -> Result<Duration, String> {
    ax_core::duration::parse(text).map_err(|err| err.to_string())
}

/// Calls `call` until it answers with anything but a refusal for load, or until the next wait
/// would end past `retry_for` from the first call; `what` names the call in the messages.
pub async fn with_retries<T, F, Fut>(
    what: &str,
    retry_for: Duration,
    mut call: F,
) -> Result<T, RetryError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let start = Instant::now();
    let mut refusals = 0u32;
    loop {
        let status = match call().await {
            Ok(answer) => return Ok(answer),
            Err(status) => status,
        };
        let Some(overloaded) = ax_proto::overloaded::of(&status) else {
            return Err(RetryError::Status(status));
        };
        refusals += 1;
        let delay = Duration::from_millis(ax_core::admission::client_retry_delay_ms(
            refusals,
            overloaded.retry_after_ms,
            rand::rng().random::<f64>(),
        ));
        let waited = start.elapsed();
        if waited + delay > retry_for {
            return Err(RetryError::GaveUp {
                message: one_line(status.message()),
                refusals,
                waited,
            });
        }
        eprintln!(
            "{what}: refused for load ({}); trying again in {} (refusal {refusals}, giving up \
             after {})",
            crate::output::escape(&one_line(status.message())),
            ax_core::humane_duration(millis(delay)),
            ax_core::humane_duration(millis(retry_for)),
        );
        tokio::time::sleep(delay).await;
    }
}

/// Why a call with retries failed.
#[derive(Debug)]
pub enum RetryError {
    /// An answer that is not a refusal for load.
    Status(Status),
    /// Refused for load until the next wait would pass `--retry-for`.
    GaveUp {
        message: String,
        refusals: u32,
        waited: Duration,
    },
}

impl RetryError {
    /// The error the user sees: a status as any other call's, or the refusal with exit 8.
    pub fn into_error(self, ctx: &crate::client::Ctx) -> anyhow::Error {
        match self {
            RetryError::Status(status) => ctx.status(status),
            RetryError::GaveUp {
                message,
                refusals,
                waited,
            } => {
                let times = match refusals {
                    1 => "once".to_string(),
                    n => format!(
                        "{n} times over {}",
                        ax_core::humane_duration(millis(waited))
                    ),
                };
                CtlError::new(
                    Exit::Overloaded,
                    format!("{message} (refused {times}; --retry-for waits longer)"),
                )
                .into()
            }
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use ax_proto::v1::Overloaded;

    use super::*;

    fn refusal(retry_after_ms: u64) -> Status {
        ax_proto::overloaded::status(
            "full",
            &Overloaded {
                bound: "app".into(),
                app: "etl".into(),
                waiting: 5,
                limit: 5,
                retry_after_ms,
            },
        )
    }

    #[tokio::test]
    async fn a_refusal_is_tried_again_after_its_hint_until_answered() {
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let answer = with_retries("trigger x", Duration::from_secs(60), || async {
            match calls.fetch_add(1, Ordering::Relaxed) {
                0 | 1 => Err(refusal(600)),
                _ => Ok(7),
            }
        })
        .await
        .expect("answered");
        assert_eq!(answer, 7);
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        // Two waits, each at least the hint.
        assert!(
            start.elapsed() >= Duration::from_millis(1_200),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn it_gives_up_before_a_wait_would_pass_retry_for_and_other_answers_return_at_once() {
        let calls = AtomicU32::new(0);
        let err = with_retries("trigger x", Duration::from_secs(1), || async {
            calls.fetch_add(1, Ordering::Relaxed);
            Err::<(), _>(refusal(400))
        })
        .await
        .expect_err("gives up");
        match err {
            RetryError::GaveUp {
                refusals, waited, ..
            } => {
                assert_eq!(refusals, calls.load(Ordering::Relaxed));
                assert!((2..=3).contains(&refusals), "{refusals}");
                assert!(waited <= Duration::from_secs(1), "{waited:?}");
            }
            other => panic!("{other:?}"),
        }
        for status in [
            Status::not_found("x"),
            Status::resource_exhausted("too many failed authentications"),
        ] {
            let calls = AtomicU32::new(0);
            let err = with_retries("trigger x", Duration::from_secs(60), || {
                calls.fetch_add(1, Ordering::Relaxed);
                let status = status.clone();
                async move { Err::<(), _>(status) }
            })
            .await
            .expect_err("returned");
            assert!(matches!(err, RetryError::Status(_)));
            assert_eq!(calls.load(Ordering::Relaxed), 1);
        }
        let none = with_retries("trigger x", Duration::ZERO, || async {
            Err::<(), _>(refusal(1_000))
        })
        .await
        .expect_err("no retries");
        assert!(matches!(none, RetryError::GaveUp { refusals: 1, .. }));
    }
}
