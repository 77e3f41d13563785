//! What the suite's tests may need beyond Rust and SQLite, declared where each test is
//! registered (`.requires(&MYSQL)`): a machine without it reports the test as ignored and says
//! how to provide it; under `CI=true` its absence fails the test. A requirement only one test
//! module has lives in that module.

pub use ax_test_harness::{MYSQL, REDIS, Requirement};

/// A Python with the SDK and `.ci/requirements.txt` installed.
pub static PYTHON: Requirement = Requirement::env(
    "AX_TEST_PYTHON",
    "point it at a Python with sdk/python and .ci/requirements.txt installed \
     (.ci/run makes .ci/venv) to run the Python SDK and Kubernetes checks",
);

/// A Node (20 or later) and the TypeScript SDK built with it (`npm ci && npm run build` in
/// `sdk/typescript`).
pub static NODE: Requirement = Requirement::env(
    "AX_TEST_NODE",
    "point it at a node (20 or later) after `npm ci && npm run build` in sdk/typescript \
     (.ci/run does both) to run the TypeScript SDK's tests",
);

/// chromium, node, and the browser scripts' node modules ([`crate::browser::tools`]).
pub static BROWSER: Requirement = Requirement::custom(
    || crate::browser::tools().map(|_| ()),
    "the browser checks need chromium, node and `npm ci` in integration-tests/browser",
);

/// `redis-server`, for a test that stops and starts a Redis of its own
/// ([`crate::redis_server::RedisServer`]).
pub static REDIS_SERVER: Requirement = Requirement::program(
    "redis-server",
    &["--version"],
    "install Redis (redis-server) to run the tests that stop a Redis of their own",
);
