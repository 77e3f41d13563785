//! A test harness (on `libtest-mimic`) for suites whose tests need services or tools that a
//! machine may lack: a MySQL server, Redis, a Python venv, a browser, `faketime`.
//!
//! Each [`Test`] declares what it needs where it is registered ([`Test::requires`]), so the
//! body never has to look and return early. A test whose [`Requirement`] is missing here is
//! reported as **ignored**, with what is missing on its line, and the run ends with one line per
//! missing requirement saying how many tests it kept from running and how to provide it. Under
//! `CI=true` a missing requirement fails the test instead: CI must run everything.
//! `--ignored` and `--include-ignored` pick and run those tests, which then fail saying what
//! they lack. Filters, `--list`, `--exact`, `--skip`, `--test-threads` and `--nocapture` are
//! libtest's.
//!
//! An async test runs on a tokio runtime of its own, as under `#[tokio::test]`
//! ([`Runtime`]). The [`trial!`] macro names a test after its function and module, so a
//! function `kill_worker` in `mod faults` of the test binary is `faults::kill_worker`.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// Something a test needs that a machine may not have, and how to provide it.
#[derive(Debug)]
pub struct Requirement {
    check: Check,
    /// How to provide it, said when it is missing: "set it to … to run the MySQL variants".
    how: &'static str,
}

#[derive(Debug)]
enum Check {
    /// An environment variable set to a non-empty value.
    Env(&'static str),
    /// A program that runs with these arguments and exits with status 0.
    Program(&'static str, &'static [&'static str]),
    /// Anything else: `Err` says what is missing.
    Custom(fn() -> Result<(), String>),
}

impl Requirement {
    /// The environment variable `var`, set and not empty.
    pub const fn env(var: &'static str, how: &'static str) -> Requirement {
        Requirement {
            check: Check::Env(var),
            how,
        }
    }

    /// `program args…` runs and exits with status 0 (e.g. `faketime --version`).
    pub const fn program(
        program: &'static str,
        args: &'static [&'static str],
        how: &'static str,
    ) -> Requirement {
        Requirement {
            check: Check::Program(program, args),
            how,
        }
    }

    /// Whatever `check` decides; its `Err` says what is missing.
    pub const fn custom(check: fn() -> Result<(), String>, how: &'static str) -> Requirement {
        Requirement {
            check: Check::Custom(check),
            how,
        }
    }

    /// What is missing here, or `None` when the requirement is met.
    pub fn missing(&self) -> Option<String> {
        match &self.check {
            Check::Env(var) => match std::env::var_os(var) {
                Some(value) if !value.is_empty() => None,
                _ => Some(format!("{var} is not set")),
            },
            Check::Program(program, args) => {
                let ran = Command::new(program)
                    .args(*args)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                match ran {
                    Ok(status) if status.success() => None,
                    Ok(status) => Some(format!("`{program}` fails here ({status})")),
                    Err(_) => Some(format!("`{program}` is not installed")),
                }
            }
            Check::Custom(check) => check().err(),
        }
    }

    /// How to provide it.
    pub fn how(&self) -> &'static str {
        self.how
    }
}

/// A MySQL or MariaDB server; each test creates and drops a database of its own on it.
pub static MYSQL: Requirement = Requirement::env(
    "AX_TEST_MYSQL_URL",
    "set it to a MySQL or MariaDB server (mysql://root@127.0.0.1:3306) to run the MySQL variants",
);

/// A Redis server; each test keeps its keys under a namespace of its own.
pub static REDIS: Requirement = Requirement::env(
    "AX_TEST_REDIS_URL",
    "set it to a Redis server (redis://127.0.0.1:6379) to run the tests of the Redis guards",
);

/// The runtime an async test runs on, one per test, as `#[tokio::test]` builds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// `#[tokio::test]`.
    CurrentThread,
    /// `#[tokio::test(flavor = "multi_thread")]`, with `worker_threads` when given.
    MultiThread(Option<usize>),
}

impl Runtime {
    fn block_on<F: Future<Output = ()>>(self, future: F) {
        let mut builder = match self {
            Runtime::CurrentThread => tokio::runtime::Builder::new_current_thread(),
            Runtime::MultiThread(threads) => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                if let Some(threads) = threads {
                    builder.worker_threads(threads);
                }
                builder
            }
        };
        builder
            .enable_all()
            .build()
            .expect("a tokio runtime for the test")
            .block_on(future);
    }
}

/// One test: its name, what it needs, and its body (a panic fails it).
pub struct Test {
    name: String,
    requires: Vec<&'static Requirement>,
    body: Box<dyn FnOnce() + Send>,
}

impl Test {
    /// A test whose body runs on the test's thread.
    pub fn new(name: impl Into<String>, body: impl FnOnce() + Send + 'static) -> Test {
        Test {
            name: name.into(),
            requires: Vec::new(),
            body: Box::new(body),
        }
    }

    /// A test whose body is a future, run on a `runtime` of its own.
    pub fn on_tokio<F, Fut>(name: impl Into<String>, runtime: Runtime, body: F) -> Test
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        Test::new(name, move || runtime.block_on(body()))
    }

    /// The test runs only where `requirement` is met (see the crate's doc for what happens
    /// elsewhere).
    pub fn requires(mut self, requirement: &'static Requirement) -> Test {
        self.requires.push(requirement);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// `module::function` from `module_path!()` inside the test binary (`main::faults`) and the
/// function's name: the binary's own name is left out.
pub fn test_name(module_path: &str, function: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{function}"),
        None => function.to_string(),
    }
}

/// A [`Test`] of the function `f`, named after it and its module ([`test_name`]):
/// `trial!(f)` runs `fn f()`; `trial!(async f)` runs `async fn f()` on a current-thread
/// runtime; `trial!(async(multi_thread) f)` and `trial!(async(multi_thread = 4) f)` on a
/// multi-thread one. Add requirements with [`Test::requires`].
#[macro_export]
macro_rules! trial {
    (async $f:ident) => {
        $crate::Test::on_tokio(
            $crate::test_name(module_path!(), stringify!($f)),
            $crate::Runtime::CurrentThread,
            $f,
        )
    };
    (async(multi_thread) $f:ident) => {
        $crate::Test::on_tokio(
            $crate::test_name(module_path!(), stringify!($f)),
            $crate::Runtime::MultiThread(None),
            $f,
        )
    };
    (async(multi_thread = $threads:literal) $f:ident) => {
        $crate::Test::on_tokio(
            $crate::test_name(module_path!(), stringify!($f)),
            $crate::Runtime::MultiThread(Some($threads)),
            $f,
        )
    };
    ($f:ident) => {
        $crate::Test::new($crate::test_name(module_path!(), stringify!($f)), $f)
    };
}

/// What is missing for one test, and how to provide it.
struct Lack {
    missing: String,
    how: &'static str,
}

/// Whether this is CI, where nothing may be ignored for a missing requirement.
fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Runs `tests` (in the order of their names, as libtest does) as the command line asks and
/// says, at the end, what kept tests from running.
pub fn run(mut tests: Vec<Test>) -> ExitCode {
    tests.sort_by(|a, b| a.name.cmp(&b.name));
    let args = Arguments::from_args();
    let forced = args.ignored || args.include_ignored;
    let ci = under_ci();
    // Each requirement is checked once (a program check starts a process).
    let mut checked: BTreeMap<*const Requirement, Option<String>> = BTreeMap::new();
    let ignored: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let trials = tests
        .into_iter()
        .map(|test| {
            let lack = test.requires.iter().find_map(|requirement| {
                let missing = checked
                    .entry(std::ptr::from_ref(*requirement))
                    .or_insert_with(|| requirement.missing())
                    .clone()?;
                Some(Lack {
                    missing,
                    how: requirement.how(),
                })
            });
            trial(test, verdict(lack, ci, forced), &ignored)
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let ignored = ignored.lock().unwrap_or_else(|p| p.into_inner());
    for (reason, count) in ignored.iter() {
        println!("ignored {count}: {reason}");
    }
    if !ignored.is_empty() {
        println!();
    }
    conclusion.exit_code()
}

/// What the harness does with a test, from what it lacks here and how the run was asked for.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Nothing is missing: the body runs.
    Run,
    /// It fails with `message` without running: under CI, or when `--ignored` or
    /// `--include-ignored` picked it (`picked`: it is listed among the ignored tests).
    Fail { message: String, picked: bool },
    /// It is ignored, saying what is `missing`, and counted in the end line of `group`.
    Ignore { missing: String, group: String },
}

fn verdict(lack: Option<Lack>, ci: bool, forced: bool) -> Verdict {
    let Some(Lack { missing, how }) = lack else {
        return Verdict::Run;
    };
    if ci {
        Verdict::Fail {
            message: format!("CI=true but {missing}: {how}; under CI nothing is ignored"),
            picked: false,
        }
    } else if forced {
        Verdict::Fail {
            message: format!("{missing}: {how}"),
            picked: true,
        }
    } else {
        Verdict::Ignore {
            group: format!("{missing}; {how}"),
            missing,
        }
    }
}

fn trial(test: Test, verdict: Verdict, ignored: &Arc<Mutex<BTreeMap<String, usize>>>) -> Trial {
    let Test { name, body, .. } = test;
    match verdict {
        Verdict::Run => Trial::test(name, move || {
            body();
            Ok(())
        }),
        Verdict::Fail { message, picked } => {
            Trial::test(name, move || Err(Failed::from(message))).with_ignored_flag(picked)
        }
        Verdict::Ignore { missing, group } => {
            let ignored = Arc::clone(ignored);
            Trial::ignorable_test(name, move || {
                *ignored
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(group)
                    .or_default() += 1;
                Ok(Completion::ignored_with(missing))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static NEVER: Requirement = Requirement::custom(|| Err("nothing here".into()), "cannot");
    static UNSET: Requirement = Requirement::env("AX_TEST_HARNESS_SURELY_UNSET", "set it");
    static NO_PROGRAM: Requirement =
        Requirement::program("ax-test-harness-no-such-program", &[], "install it");
    static TRUE: Requirement = Requirement::program("true", &[], "install coreutils");

    #[test]
    fn requirements_say_what_is_missing() {
        assert_eq!(NEVER.missing().as_deref(), Some("nothing here"));
        assert_eq!(
            UNSET.missing().as_deref(),
            Some("AX_TEST_HARNESS_SURELY_UNSET is not set")
        );
        assert_eq!(
            NO_PROGRAM.missing().as_deref(),
            Some("`ax-test-harness-no-such-program` is not installed")
        );
        assert_eq!(TRUE.missing(), None);
    }

    #[test]
    fn a_missing_requirement_ignores_outside_ci_and_fails_under_it_or_when_picked() {
        let lack = || {
            Some(Lack {
                missing: "AX_TEST_MYSQL_URL is not set".into(),
                how: "set it",
            })
        };
        assert_eq!(verdict(None, true, true), Verdict::Run);
        assert_eq!(verdict(None, false, false), Verdict::Run);
        assert_eq!(
            verdict(lack(), false, false),
            Verdict::Ignore {
                missing: "AX_TEST_MYSQL_URL is not set".into(),
                group: "AX_TEST_MYSQL_URL is not set; set it".into(),
            }
        );
        assert_eq!(
            verdict(lack(), true, false),
            Verdict::Fail {
                message: "CI=true but AX_TEST_MYSQL_URL is not set: set it; under CI nothing is \
                          ignored"
                    .into(),
                picked: false,
            }
        );
        assert_eq!(
            verdict(lack(), false, true),
            Verdict::Fail {
                message: "AX_TEST_MYSQL_URL is not set: set it".into(),
                picked: true,
            }
        );
    }

    #[test]
    fn a_test_is_named_after_its_module_inside_the_binary() {
        assert_eq!(test_name("main::faults", "kill"), "faults::kill");
        assert_eq!(
            test_name("main::security::workers", "kill"),
            "security::workers::kill"
        );
        assert_eq!(test_name("main", "kill"), "kill");
    }

    #[test]
    fn an_async_body_runs_on_the_runtime_it_asked_for() {
        Runtime::MultiThread(Some(2)).block_on(async {
            let flavor = tokio::runtime::Handle::current().runtime_flavor();
            assert_eq!(flavor, tokio::runtime::RuntimeFlavor::MultiThread);
        });
        Runtime::CurrentThread.block_on(async {
            let flavor = tokio::runtime::Handle::current().runtime_flavor();
            assert_eq!(flavor, tokio::runtime::RuntimeFlavor::CurrentThread);
        });
    }
}
