"""Fixtures of the SDK's tests against a real scheduler.

The scheduler is the one at AX_TEST_SCHEDULER (`http://127.0.0.1:PORT`); the Rust test
`integration-tests/tests/python_sdk.rs` starts one on a fresh store and runs this suite with it.
Without AX_TEST_SCHEDULER the scheduler tests skip, saying why, except under CI=true, where they
fail. AX_TEST_OUT, when set, is a directory where the suite writes what it did (facts.json: run
and instance ids, pids, the lines it expects) for the Rust test to check through the
scheduler's API on its own. AX_TEST_TOKEN, when set, is the bearer token the suite's client
presents, and AX_TEST_WORKER_TOKEN the one its worker presents (for a scheduler started with
`--auth tokens`: a worker stream takes only a worker token, e.g. `axctl token create --role
worker --worker-id py-sdk-worker`).
"""

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from ax_sdk import Client, Worker

import fn_tasks

WORKER_ID = "py-sdk-worker"

# A hang guard for waits, never a measurement.
GUARD = 60.0


def _scheduler_address():
    address = os.environ.get("AX_TEST_SCHEDULER")
    if address:
        return address
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but AX_TEST_SCHEDULER is not set: the SDK's scheduler tests cannot be skipped")
    pytest.skip("AX_TEST_SCHEDULER is not set (integration-tests/tests/python_sdk.rs runs this suite with a scheduler)")


@pytest.fixture(scope="session")
def scheduler():
    return _scheduler_address()


@pytest.fixture(scope="session")
def out_dir():
    configured = os.environ.get("AX_TEST_OUT")
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="ax-sdk-tests-") as scratch:
            yield Path(scratch)


@pytest.fixture(scope="session")
def facts(out_dir):
    recorded = {"worker_id": WORKER_ID}
    yield recorded
    (out_dir / "facts.json").write_text(json.dumps(recorded, indent=2, sort_keys=True))


def _token():
    return os.environ.get("AX_TEST_TOKEN") or None


def _worker_token():
    return os.environ.get("AX_TEST_WORKER_TOKEN") or None


@pytest.fixture(scope="session")
def client(scheduler):
    with Client(scheduler, token=_token(), actor="python-sdk-tests") as client:
        yield client


@pytest.fixture(scope="session")
def worker(scheduler, client):
    """One Python worker for the session, labelled sdk=python, with the test functions."""
    worker = Worker(
        scheduler,
        WORKER_ID,
        labels={"sdk": "python"},
        capacity=8,
        tasks=fn_tasks.tasks,
        kill_grace=1.0,
        token=_worker_token(),
    )
    worker.start()
    wait_for(lambda: any(w.id == WORKER_ID and w.state == 1 for w in client.list_workers()), "the worker LIVE")
    yield worker
    worker.stop(drain=True, timeout=GUARD)


def wait_for(predicate, what, guard=GUARD):
    deadline = time.monotonic() + guard
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {guard} s for {what}")
        time.sleep(0.05)


def pid_alive(pid):
    """Whether the process runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X", "x")
