"""The client and the worker against a real scheduler on a fresh store (see conftest.py)."""

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from ax_sdk import AsyncClient, AxError, InstanceState, RunState, WorkflowParam
from ax_sdk.pb import control, types

from conftest import GUARD, WORKER_ID, pid_alive, wait_for

REPO = Path(__file__).resolve().parents[3]


def lines_of(client, instance_id, follow=False):
    """The stored lines as (stream, text)."""
    return [(line.stream, line.text) for line in client.logs(instance_id, follow=follow)]


def by_task(client, run_id):
    return {i.task: i for i in client.instances(run_id)}


def read_pid(path):
    text = wait_for(lambda: path.exists() and path.read_text().strip(), f"the pid in {path}")
    return int(text)


def test_the_etl_example_runs_on_the_python_worker(client, worker, facts, out_dir):
    source = (REPO / "examples" / "etl.yaml").read_text()
    # The example writes under AX_DATA; the test's own directory keeps runs of parallel tests
    # (whose run ids repeat) apart.
    data = out_dir / "etl-data"
    source = source.replace("AX_DATA: /tmp/ax-etl", f"AX_DATA: {data}")
    applied = client.apply(source=source, source_name="examples/etl.yaml")
    assert applied.workflow.name == "daily-sales-etl"
    run = client.trigger("daily-sales-etl").run
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state == types.RUN_STATE_SUCCESS, ended
    instances = by_task(client, run.id)
    assert sorted(instances) == ["aggregate", "clean", "extract_orders", "extract_refunds", "report"]
    for instance in instances.values():
        assert instance.state == types.INSTANCE_STATE_SUCCESS, instance
        assert instance.worker_id == WORKER_ID, instance
    assert client.log_text(instances["report"].id) == [f"daily revenue report for run {run.id}: 1560"]
    # One line on each stream: their relative order is the pipes', not the worker's.
    assert sorted(lines_of(client, instances["extract_refunds"].id)) == [
        (1, "extracting refunds"),
        (2, "1 refund is older than 30 days and was skipped"),
    ]
    facts["etl"] = {"run_id": run.id, "report_instance": instances["report"].id}


PARAMS_WORKFLOW = """
name: py-params
tasks:
  - name: show
    command: |
      echo "region=$AX_PARAM_region"
      echo "run=$AX_RUN_ID"
      printf 'tab\\there\\n'
      echo "unicode: 数据 ✓"
      echo "to stderr" >&2
      echo "last line"
"""


def test_apply_trigger_with_params_and_key_wait_and_logs(client, worker, facts):
    first = client.apply(source=PARAMS_WORKFLOW)
    assert first.outcome == control.APPLY_OUTCOME_CREATED
    assert client.apply(source=PARAMS_WORKFLOW).outcome == control.APPLY_OUTCOME_UNCHANGED
    created = client.trigger("py-params", {"region": "cn"}, idempotency_key="py-sdk-key-1")
    again = client.trigger("py-params", {"region": "cn"}, idempotency_key="py-sdk-key-1")
    assert created.created and not again.created
    assert again.run.id == created.run.id
    assert dict(created.run.params) == {"region": "cn"}
    run = client.wait(created.run.id, timeout=GUARD)
    assert run.state == types.RUN_STATE_SUCCESS, run
    (instance,) = client.instances(run.id)
    assert instance.worker_id == WORKER_ID
    stored = lines_of(client, instance.id)
    stdout = [text for stream, text in stored if stream == 1]
    stderr = [text for stream, text in stored if stream == 2]
    expected = ["region=cn", f"run={run.id}", "tab\there", "unicode: 数据 ✓", "last line"]
    assert stdout == expected
    assert stderr == ["to stderr"]
    assert lines_of(client, instance.id, follow=True) == stored
    assert instance.attempts[-1].log_lines == len(stored)
    facts["params"] = {
        "run_id": run.id,
        "instance_id": instance.id,
        "stdout": expected,
        "stderr": ["to stderr"],
    }


def test_an_unknown_workflow_is_refused_with_its_name(client, worker):
    with pytest.raises(AxError) as refused:
        client.trigger("no-such-workflow")
    assert "no-such-workflow" in str(refused.value)


def test_a_failing_task_reports_its_exit_code(client, worker, facts):
    client.apply(
        source="""
name: py-failing
tasks:
  - name: fails
    command: echo "about to fail"; exit 3
"""
    )
    run = client.trigger("py-failing").run
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state == types.RUN_STATE_FAILED, ended
    (instance,) = client.instances(run.id)
    assert instance.state == types.INSTANCE_STATE_FAILED
    assert instance.exit_code == 3
    assert instance.worker_id == WORKER_ID
    assert client.log_text(instance.id) == ["about to fail"]
    facts["failing"] = {"run_id": run.id, "instance_id": instance.id, "exit_code": 3}


def test_a_cancel_kills_the_process_group(client, worker, facts, out_dir):
    pids = out_dir / "cancel"
    pids.mkdir(exist_ok=True)
    client.apply(
        source=f"""
name: py-cancel
tasks:
  - name: sleeps
    env: {{PIDS: "{pids}"}}
    command: |
      sleep 300 &
      echo $! > "$PIDS/child"
      echo $$ > "$PIDS/leader"
      echo started
      wait
"""
    )
    run = client.trigger("py-cancel").run
    leader = read_pid(pids / "leader")
    child = read_pid(pids / "child")
    assert pid_alive(leader) and pid_alive(child)
    (instance,) = client.instances(run.id)
    wait_for(lambda: client.get_instance(instance.id).state == types.INSTANCE_STATE_RUNNING, "the task RUNNING")
    client.cancel_instance(instance.id, reason="python sdk test")
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state == types.RUN_STATE_CANCELLED, ended
    wait_for(lambda: not pid_alive(leader) and not pid_alive(child), "the task's processes to be gone")
    cancelled = client.get_instance(instance.id)
    assert cancelled.state == types.INSTANCE_STATE_CANCELLED
    facts["cancel"] = {"run_id": run.id, "instance_id": instance.id, "pids": [leader, child]}


def test_the_worker_enforces_the_timeout(client, worker, facts, out_dir):
    pids = out_dir / "timeout"
    pids.mkdir(exist_ok=True)
    # The task and its child ignore SIGTERM: only the SIGKILL after the kill grace ends them.
    client.apply(
        source=f"""
name: py-timeout
tasks:
  - name: overruns
    timeout: 2s
    env: {{PIDS: "{pids}"}}
    command: |
      trap '' TERM
      sleep 300 &
      echo $! > "$PIDS/child"
      echo $$ > "$PIDS/leader"
      echo waiting
      wait
"""
    )
    run = client.trigger("py-timeout").run
    leader = read_pid(pids / "leader")
    child = read_pid(pids / "child")
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state == types.RUN_STATE_FAILED, ended
    (instance,) = client.instances(run.id)
    assert instance.state == types.INSTANCE_STATE_TIMEOUT
    attempt = instance.attempts[-1]
    assert attempt.worker_id == WORKER_ID
    assert attempt.signal == signal.SIGKILL, attempt
    wait_for(lambda: not pid_alive(leader) and not pid_alive(child), "the timed-out processes to be gone")
    facts["timeout"] = {"run_id": run.id, "instance_id": instance.id, "pids": [leader, child]}


FUNCTIONS_WORKFLOW = """
name: py-functions
defaults:
  labels: {sdk: python}
tasks:
  - name: greet
    argv: [ax-python, greet, world]
    env: {GREETING_ENV: "from-the-task-env"}
  - name: returns_code
    command: ax-python exit_with 4
  - name: raises
    command: ax-python boom
  - name: quits
    command: ax-python quits
  - name: unknown
    command: ax-python not_registered
"""


def test_python_functions_run_as_tasks(client, worker, facts):
    client.apply(source=FUNCTIONS_WORKFLOW)
    run = client.trigger("py-functions", {"who": "tester"}).run
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state == types.RUN_STATE_FAILED, ended
    instances = by_task(client, run.id)
    for instance in instances.values():
        assert instance.worker_id == WORKER_ID, instance

    greet = instances["greet"]
    assert greet.state == types.INSTANCE_STATE_SUCCESS, greet
    greet_lines = [
        "hello world from tester",
        f"run {run.id} task greet attempt 1 of py-functions",
        f"instance {greet.id} env from-the-task-env",
    ]
    assert client.log_text(greet.id) == greet_lines

    returns_code = instances["returns_code"]
    assert returns_code.state == types.INSTANCE_STATE_FAILED
    assert returns_code.exit_code == 4
    assert client.log_text(returns_code.id) == ["exiting with 4"]

    raises = instances["raises"]
    assert raises.state == types.INSTANCE_STATE_FAILED
    assert raises.exit_code == 1
    raised = lines_of(client, raises.id)
    # stdout and stderr are two pipes: each keeps its order, not their interleaving.
    assert [text for stream, text in raised if stream == 1] == ["about to raise"]
    stderr = [text for stream, text in raised if stream == 2]
    assert stderr[0] == "Traceback (most recent call last):"
    assert stderr[-1] == "ValueError: boom: tester is not welcome"

    quits = instances["quits"]
    assert quits.exit_code == 7
    assert client.log_text(quits.id) == ["quitting"]

    unknown = instances["unknown"]
    assert unknown.state == types.INSTANCE_STATE_FAILED
    assert "not_registered" in unknown.attempts[-1].message, unknown

    facts["functions"] = {
        "run_id": run.id,
        "greet_instance": greet.id,
        "greet_lines": greet_lines,
        "exit_code_instance": returns_code.id,
    }


def test_a_cancel_kills_a_python_function(client, worker, facts, out_dir):
    pid_file = out_dir / "function.pid"
    client.apply(
        source=f"""
name: py-function-cancel
tasks:
  - name: sleeps
    argv: [ax-python, sleeper, "{pid_file}"]
    labels: {{sdk: python}}
"""
    )
    run = client.trigger("py-function-cancel").run
    pid = read_pid(pid_file)
    (instance,) = client.instances(run.id)
    wait_for(lambda: client.get_instance(instance.id).state == types.INSTANCE_STATE_RUNNING, "the function RUNNING")
    wait_for(lambda: client.log_text(instance.id) == ["sleeping"], "the function's line")
    client.cancel_run(run.id, reason="python sdk test")
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state == types.RUN_STATE_CANCELLED, ended
    wait_for(lambda: not pid_alive(pid), "the function's process to be gone")
    assert client.get_instance(instance.id).state == types.INSTANCE_STATE_CANCELLED
    facts["function_cancel"] = {"instance_id": instance.id, "pids": [pid]}


OUTPUTS_WORKFLOW = """
name: py-outputs
defaults:
  labels: {sdk: python}
tasks:
  - name: count
    command: ax-python count_rows
  - name: use
    upstream: count
    command: ax-python use_rows
  - name: typed
    upstream: count
    command: ax-python use_typed
  - name: last
    upstream: typed
    command: ax-python by_name
"""


def test_a_return_value_becomes_outputs_the_next_function_reads(client, worker):
    client.apply(source=OUTPUTS_WORKFLOW)
    run = client.trigger("py-outputs").run
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state == types.RUN_STATE_SUCCESS, [
        (i.task, i.attempts[-1].message if i.attempts else "", client.log_text(i.id))
        for i in client.instances(run.id)
    ]
    instances = by_task(client, run.id)
    count = instances["count"]
    assert dict(count.attempts[-1].outputs) == {
        "return": '{"rows": 3, "names": ["a", "b"], "note": "two\\nlines"}',
        "rows": "3",
        "names": '["a", "b"]',
        "note": "two\nlines",
    }
    use = instances["use"]
    assert client.log_text(use.id) == ["rows=3 names=['a', 'b']", "two", "lines"]
    assert dict(use.attempts[-1].outputs) == {"return": '{"doubled": 6}', "doubled": "6"}
    typed = instances["typed"]
    assert client.log_text(typed.id) == ["typed rows+1=4 names=['a', 'b']"]
    assert dict(typed.attempts[-1].outputs) == {"return": '[3, "a", "b"]'}
    last = instances["last"]
    assert client.log_text(last.id) == ["from typed: [3, 'a', 'b'] (list), missing=default, task last"]


def test_wait_returns_once_a_cancelled_function_has_cleaned_up(client, worker, out_dir):
    marker = out_dir / "cleaned-up"
    client.apply(
        source=f"""
name: py-slow-stop
tasks:
  - name: slow
    argv: [ax-python, slow_to_stop, "{marker}"]
    labels: {{sdk: python}}
"""
    )
    run = client.trigger("py-slow-stop").run
    (instance,) = client.instances(run.id)
    wait_for(lambda: client.log_text(instance.id) == ["working"], "the function's line")
    client.cancel_run(run.id, reason="wait test")
    ended = client.wait(run.id, timeout=GUARD)
    # The run was CANCELLED at once; wait returned only once the process had ended, after its
    # clean-up (one Cancelled, 0.3 s of work), with the signal stored.
    assert ended.state == RunState.CANCELLED, ended
    assert marker.read_text() == "cleaned up"
    (attempt,) = client.get_instance(instance.id).attempts
    assert attempt.state == InstanceState.CANCELLED
    assert attempt.signal == signal.SIGTERM, attempt
    assert not attempt.process_may_run
    assert client.log_text(instance.id) == [
        "working",
        "cancelled: cleaning up",
        "ax-python: stopped by SIGTERM (a cancel or a timeout)",
    ]


def test_params_reach_functions_typed_and_returns_are_outputs(client, worker):
    client.apply(
        source="""
name: py-typed
defaults:
  labels: {sdk: python}
tasks:
  - name: params
    command: ax-python typed_params
  - name: fetch
    command: ax-python async_fetch
"""
    )
    params = {"n": 3, "flag": True, "window": {"days": 7}, "names": ["a", "b"], "note": "plain text"}
    triggered = client.trigger("py-typed", params)
    # Strings go as they are, anything else as JSON.
    assert triggered.run.params == {
        "n": "3",
        "flag": "true",
        "window": '{"days": 7}',
        "names": '["a", "b"]',
        "note": "plain text",
    }
    run = client.wait(triggered.run_id, timeout=GUARD)
    instances = by_task(client, run.id)
    assert run.state is RunState.SUCCESS, [(i.task, client.log_text(i.id)) for i in instances.values()]
    assert client.log_text(instances["params"].id) == [
        "n+1=4 flag=True window={'days': 7} names=['a', 'b'] note=plain text"
    ]
    assert instances["params"].outputs == {"return": '{"n_squared": 9, "flag": false}', "n_squared": "9", "flag": "false"}
    assert client.log_text(instances["fetch"].id) == ["fetched 3"]
    assert instances["fetch"].outputs == {"return": "[0, 1, 2]"}


def test_a_param_that_does_not_convert_fails_the_attempt_naming_it(client, worker):
    client.apply(source="name: py-typed-bad\ntasks:\n  - name: f\n    command: ax-python async_fetch\n    labels: {sdk: python}\n")
    run = client.wait(client.trigger("py-typed-bad", {"n": "three"}).run_id, timeout=GUARD)
    assert run.state is RunState.FAILED
    (instance,) = client.instances(run.id)
    assert client.log_text(instance.id) == [
        "ax-python: async_fetch: parameter n: param n is 'three', not int: expected an integer, got \"three\""
    ]


def test_the_async_client_triggers_waits_and_reads_logs(scheduler, worker):
    async def scenario():
        async with AsyncClient(scheduler, token=os.environ.get("AX_TEST_TOKEN") or None) as client:
            await client.apply(source="name: py-async\ntasks:\n  - name: t\n    command: echo one; echo two\n")
            triggered = await client.trigger("py-async", idempotency_key="py-async-1")
            again = await client.trigger("py-async", idempotency_key="py-async-1")
            assert (triggered.created, again.created, again.run_id) == (True, False, triggered.run_id)
            changes = [run.state async for run in client.watch(triggered.run_id)]
            run = await client.wait(triggered.run_id, timeout=GUARD)
            (instance,) = await client.instances(run.id)
            lines = [line.text async for line in client.logs(instance.id)]
            return changes, run, lines

    changes, run, lines = asyncio.run(scenario())
    assert run.state is RunState.SUCCESS
    assert changes[-1] is RunState.SUCCESS, changes
    assert lines == ["one", "two"]


def test_the_orders_example_runs_as_its_readme_says(scheduler, client, out_dir):
    """The example's worker module served by `python -m ax_sdk`, its workflow built in Python,
    and its client, blocking and asyncio, each run as a user runs them."""
    example = REPO / "sdk" / "python" / "examples" / "orders"
    env = dict(os.environ, AX_SERVER=scheduler, AX_SCHEDULER=scheduler)
    for name, value in (("AX_TOKEN", "AX_TEST_TOKEN"),):
        if os.environ.get(value):
            env[name] = os.environ[value]
    worker_env = dict(env)
    if os.environ.get("AX_TEST_WORKER_TOKEN"):
        worker_env["AX_TOKEN"] = os.environ["AX_TEST_WORKER_TOKEN"]
    log = open(out_dir / "orders-worker.log", "w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "ax_sdk", "--module", "tasks.py", "--label", "worker=orders", "--id", "py-orders"],
        cwd=example,
        env=worker_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: any(w.id == "py-orders" and w.state == 1 for w in client.list_workers()), "the example's worker")
        printed = subprocess.run(
            [sys.executable, "workflow.py"], cwd=example, env=env, capture_output=True, text=True, timeout=GUARD
        )
        assert printed.returncode == 0, printed.stderr
        assert 'argv:\n      - "ax-python"\n      - "total"\n    upstream:\n      - "extract"\n      - "enrich"' in printed.stdout
        outputs = {}
        for mode in ([], ["--async"]):
            done = subprocess.run(
                [sys.executable, "client.py", "2026-01-31", *mode],
                cwd=example,
                env=env,
                capture_output=True,
                text=True,
                timeout=GUARD,
            )
            assert done.returncode == 0, (done.stdout, done.stderr, (out_dir / "orders-worker.log").read_text())
            outputs[tuple(mode)] = done.stdout
        # 4 orders: 100 EUR, 110 USD, 120 CNY, 130 EUR = 346.8 EUR; in USD and in CNY.
        assert re.fullmatch(
            r'run \d+ SUCCESS: \{"day": "2026-01-31", "orders": 4, "total": 376\.96, "currency": "USD"\}\n', outputs[()]
        ), outputs[()]
        assert re.fullmatch(
            r'run \d+ SUCCESS: \{"day": "2026-01-31", "orders": 4, "total": 2667\.69, "currency": "CNY"\}\n',
            outputs[("--async",)],
        ), outputs[("--async",)]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=GUARD)
        log.close()


DECLARED_WORKFLOW = """
name: py-declared
params:
  region: {default: eu, description: Where the data lives}
  env: {required: true, choices: [staging, prod]}
  blank: {default: ""}
  note:
tasks:
  - name: show
    command: echo "region=$AX_PARAM_region env=$AX_PARAM_env"
"""


def test_a_workflows_declared_params_come_back_typed(scheduler, client, worker):
    client.apply(source=DECLARED_WORKFLOW)
    workflow = client.get_workflow("py-declared")
    assert [p.name for p in workflow.params] == ["region", "env", "blank", "note"]
    expected = [
        WorkflowParam("region", "Where the data lives", "eu", False, (), workflow.params[0]),
        WorkflowParam("env", "", None, True, ("staging", "prod"), workflow.params[1]),
        WorkflowParam("blank", "", "", False, (), workflow.params[2]),
        WorkflowParam("note", "", None, False, (), workflow.params[3]),
    ]
    assert WorkflowParam.of(workflow) == expected
    assert client.workflow_params("py-declared") == expected
    # A workflow that declares none has none; a trigger is held to the declarations.
    client.apply(source="name: py-undeclared\ntasks:\n  - name: t\n    command: 'true'\n")
    assert client.workflow_params("py-undeclared") == []
    with pytest.raises(AxError) as refused:
        client.trigger("py-declared", {"env": "qa"})
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert 'param "env": "qa" is not one of its choices (staging, prod)' in refused.value.details

    async def declared():
        async with AsyncClient(scheduler, token=os.environ.get("AX_TEST_TOKEN") or None) as aio:
            return (await aio.get_workflow("py-declared")).params, await aio.workflow_params("py-declared")

    params, typed = asyncio.run(declared())
    assert list(params) == list(workflow.params)
    assert typed == expected


MARKS_WORKFLOW = """
name: py-marks
tasks:
  - name: extract
    command: echo extracting; exit 3
  - name: load
    upstream: extract
    command: echo loaded
"""


def test_a_mark_overrides_an_outcome_and_the_run_follows(scheduler, client, worker):
    client.apply(source=MARKS_WORKFLOW)
    run = client.wait(client.trigger("py-marks").run_id, timeout=GUARD)
    assert run.state is RunState.FAILED
    instances = by_task(client, run.id)
    assert instances["load"].state is InstanceState.UPSTREAM_FAILED
    extract = instances["extract"]

    # Refused, changing nothing: no reason; a state not SUCCESS or FAILED (before any call); the
    # state it has already.
    with pytest.raises(AxError) as refused:
        client.mark(extract.id, InstanceState.SUCCESS, reason="  ")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "a mark needs a reason" in refused.value.details
    for bad in (InstanceState.RUNNING, "running", "skipped", 99, True):
        with pytest.raises(ValueError, match=r"an instance can be marked SUCCESS or FAILED only, not"):
            client.mark(extract.id, bad, reason="x")  # type: ignore[arg-type]
    with pytest.raises(AxError) as refused:
        client.mark(extract.id, "failed", reason="it failed")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"instance {extract.id} cannot be marked FAILED" in refused.value.details
    with pytest.raises(AxError) as refused:
        client.mark(987654, "success", reason="no such")
    assert refused.value.code == grpc.StatusCode.NOT_FOUND
    assert client.get_run(run.id).state is RunState.FAILED

    marked = client.mark(extract.id, "Success", reason="the rows were loaded by hand")
    assert (marked.id, marked.state, marked.attempt) == (extract.id, InstanceState.SUCCESS, 1)
    # The attempt keeps how it ended, and says who marked it and why.
    assert marked.attempts[-1].exit_code == 3
    assert marked.attempts[-1].message == (
        "exited with code 3; marked SUCCESS by python-sdk-tests: the rows were loaded by hand"
    )
    # The run reopened: load runs now, and the run ends SUCCESS.
    run = client.wait(run.id, timeout=GUARD)
    assert run.state is RunState.SUCCESS, run
    instances = by_task(client, run.id)
    assert instances["load"].state is InstanceState.SUCCESS
    assert client.log_text(instances["load"].id) == ["loaded"]


def test_a_failed_mark_kills_a_running_attempt(client, worker, out_dir):
    pids = out_dir / "mark"
    pids.mkdir(exist_ok=True)
    client.apply(
        source=f"""
name: py-mark-running
tasks:
  - name: sleeps
    retries: 2
    env: {{PIDS: "{pids}"}}
    command: |
      sleep 300 &
      echo $! > "$PIDS/child"
      echo $$ > "$PIDS/leader"
      wait
  - name: after
    upstream: sleeps
    command: echo never
"""
    )
    run = client.trigger("py-mark-running").run
    leader = read_pid(pids / "leader")
    child = read_pid(pids / "child")
    (instance,) = [i for i in client.instances(run.id) if i.task == "sleeps"]
    wait_for(lambda: client.get_instance(instance.id).state is InstanceState.RUNNING, "the task RUNNING")
    marked = client.mark(instance.id, InstanceState.FAILED, reason="stuck on a lock")
    assert marked.state is InstanceState.FAILED
    ended = client.wait(run.id, timeout=GUARD)
    assert ended.state is RunState.FAILED, ended
    wait_for(lambda: not pid_alive(leader) and not pid_alive(child), "the marked task's processes to be gone")
    instances = by_task(client, run.id)
    # No retry after a mark, and what needs the task does not run.
    assert (instances["sleeps"].state, instances["sleeps"].attempt) == (InstanceState.FAILED, 1)
    assert instances["after"].state is InstanceState.UPSTREAM_FAILED


RERUN_WORKFLOW = """
name: py-rerun
tasks:
  - name: a
    command: echo a
  - name: b
    upstream: a
    command: echo b
  - name: c
    upstream: b
    command: echo c
  - name: d
    command: echo d
"""


def test_a_rerun_of_chosen_tasks_runs_them_and_what_is_below_them(scheduler, client, worker):
    client.apply(source=RERUN_WORKFLOW)
    run = client.wait(client.trigger("py-rerun").run_id, timeout=GUARD)
    assert run.state is RunState.SUCCESS

    def attempts():
        return {task: i.attempt for task, i in by_task(client, run.id).items()}

    # Refused, changing nothing: several things to rerun at once, an unknown task, an empty name.
    with pytest.raises(AxError) as refused:
        client.rerun(run.id, failed=True, tasks=["b"])
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "say one thing to rerun" in refused.value.details
    with pytest.raises(AxError) as refused:
        client.rerun(run.id, tasks=["b", "nope"])
    assert refused.value.code == grpc.StatusCode.NOT_FOUND
    assert f'run {run.id} has no task "nope"; its tasks are: a, b, c, d' in refused.value.details
    with pytest.raises(AxError, match="a task name is empty"):
        client.rerun(run.id, tasks=[""])
    with pytest.raises(TypeError, match="tasks are task names"):
        client.rerun(run.id, tasks=[3])  # type: ignore[list-item]
    assert attempts() == {"a": 1, "b": 1, "c": 1, "d": 1}

    rerun = client.rerun(run.id, tasks=["b"])
    assert rerun.id == run.id
    run = client.wait(run.id, timeout=GUARD)
    assert run.state is RunState.SUCCESS
    assert attempts() == {"a": 1, "b": 2, "c": 2, "d": 1}
    # One name alone is a task, not its letters; the async client reruns as the blocking one.
    client.wait(client.rerun(run.id, tasks="d").id, timeout=GUARD)
    assert attempts() == {"a": 1, "b": 2, "c": 2, "d": 2}

    async def rerun_async():
        async with AsyncClient(scheduler, token=os.environ.get("AX_TEST_TOKEN") or None) as aio:
            await aio.rerun(run.id, tasks=("a", "c"))
            return await aio.wait(run.id, timeout=GUARD)

    assert asyncio.run(rerun_async()).state is RunState.SUCCESS
    assert attempts() == {"a": 2, "b": 3, "c": 3, "d": 2}


def test_the_async_client_marks(scheduler, client, worker):
    client.apply(source=MARKS_WORKFLOW.replace("py-marks", "py-marks-async"))
    run = client.wait(client.trigger("py-marks-async").run_id, timeout=GUARD)
    extract = by_task(client, run.id)["extract"]

    async def scenario():
        async with AsyncClient(scheduler, token=os.environ.get("AX_TEST_TOKEN") or None) as aio:
            with pytest.raises(AxError, match="a mark needs a reason"):
                await aio.mark(extract.id, InstanceState.SUCCESS, reason="")
            marked = await aio.mark(extract.id, InstanceState.SUCCESS, reason="done by hand")
            return marked, await aio.wait(run.id, timeout=GUARD)

    marked, ended = asyncio.run(scenario())
    assert marked.state is InstanceState.SUCCESS
    assert ended.state is RunState.SUCCESS
