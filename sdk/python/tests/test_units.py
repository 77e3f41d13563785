"""Parts of the SDK that need no scheduler: settings, the function convention, line cutting,
and the worker's answers to a repeated Dispatch."""

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from ax_sdk import AxError, Client, ConfigError, Credentials, Tasks, Worker
from ax_sdk import duration, functions, upstream
from ax_sdk.arguments import ArgumentError, bind
from ax_sdk._pb import control_pb2_grpc, worker_pb2_grpc
from ax_sdk.pb import control
from ax_sdk.connection import parse_endpoint, parse_endpoints
from ax_sdk.pb import worker as wpb
from ax_sdk.worker import _boundary, _duration, _Session

# The forms of the duration grammar and what each reads as, shared with the Rust parser's tests.
DURATIONS = Path(__file__).resolve().parents[3] / "scheduler" / "core" / "tests" / "durations.json"


def test_addresses_parse_and_bad_ones_are_named():
    assert parse_endpoint("http://sched-1:7070").target == "sched-1:7070"
    assert parse_endpoint("https://sched-1").tls and parse_endpoint("https://sched-1").port == 7070
    assert parse_endpoint("127.0.0.1:9000").target == "127.0.0.1:9000"
    assert [e.port for e in parse_endpoints("a:1, b:2")] == [1, 2]
    with pytest.raises(ConfigError, match="ftp://"):
        parse_endpoint("ftp://x:1")
    with pytest.raises(ConfigError, match="port"):
        parse_endpoint("http://x:99999")
    with pytest.raises(ConfigError, match="no scheduler address"):
        parse_endpoints(" , ")


def test_tokens_are_checked_and_sent_as_bearer(tmp_path):
    assert Credentials.load(token="abc").metadata() == (("authorization", "Bearer abc"),)
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert Credentials.load(token_file=str(path)).token == "from-file"
    with pytest.raises(ConfigError, match="whitespace"):
        Credentials.load(token="a b")
    with pytest.raises(ConfigError, match="not both"):
        Credentials.load(token="a", token_file=str(path))
    with pytest.raises(ConfigError, match="TLS CA file"):
        Credentials.load(tls_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="both tls_cert and tls_key"):
        Credentials.load(tls_cert=str(path))


def test_durations_read_as_the_rust_parser_reads_them():
    rows = json.loads(DURATIONS.read_text())
    assert len(rows) > 50
    for text, want, source in rows:
        if isinstance(want, int):
            assert duration.parse_ns(text) == want, (text, source)
            assert duration.parse(text) == want / 1e9, (text, source)
        elif want == "invalid":
            with pytest.raises(duration.DurationError) as error:
                duration.parse_ns(text)
            assert str(error.value) == (
                f'invalid duration "{text}": expected a form like 500ms, 1.5s, 10m, 2h, 1h30m, 90d or a number of '
                "seconds"
            ), source
        else:
            assert want == "too large", text
            with pytest.raises(duration.DurationError, match=f'^duration "{text}" is too large$'):
                duration.parse_ns(text)


def test_the_worker_flags_take_durations():
    assert _duration("1.5s") == 1.5
    assert _duration("1h30m") == 5400.0
    with pytest.raises(argparse.ArgumentTypeError, match='invalid duration "5 parsecs"'):
        _duration("5 parsecs")


def test_the_function_convention():
    assert functions.function_call("ax-python greet 'big world'", []) == ("greet", ["big world"])
    assert functions.function_call("", ["ax-python", "greet", "x"]) == ("greet", ["x"])
    assert functions.function_call("echo ax-python", []) is None
    assert functions.function_call("ax-pythonic x", []) is None
    assert functions.function_call("", ["/bin/echo", "ax-python"]) is None
    with pytest.raises(ValueError, match="needs a function name"):
        functions.function_call("ax-python", [])
    with pytest.raises(ValueError, match="cannot split"):
        functions.function_call("ax-python 'open", [])


def module_level():
    pass


def test_only_importable_functions_register():
    tasks = Tasks()
    tasks.task("ok")(module_level)
    assert tasks.names() == ["ok"]

    def local():
        pass

    with pytest.raises(ValueError, match="top level"):
        tasks.add(local, "local")
    with pytest.raises(ValueError, match="whitespace"):
        tasks.add(module_level, "two words")


def test_long_lines_are_cut_between_characters():
    text = "数据".encode() * 3  # 3-byte characters
    cut = _boundary(text, 4)
    assert cut == 3 and text[:cut].decode() == "数"
    assert _boundary(b"abcdef", 4) == 4
    assert _boundary(b"\x80\x80\x80\x80\x80", 2) == 2  # not UTF-8: cut at the limit


def frames(session):
    out = []
    while True:
        try:
            message = session.outgoing.get_nowait()
        except queue.Empty:
            return out
        if message is not None:
            out.append(message)


def test_a_repeated_dispatch_is_rejected_as_a_duplicate(tmp_path):
    worker = Worker("http://127.0.0.1:1", "unit", capacity=1, kill_grace=0.1)
    session = _Session(worker.endpoints[0])
    session.registered = True
    worker._session = session
    go = tmp_path / "go"
    # The attempt runs until the test has sent its other dispatches.
    command = f"echo hi; while [ ! -e '{go}' ]; do sleep 0.01; done"
    dispatch = wpb.Dispatch(instance_id=5, attempt=1, command=command)
    worker._dispatch(dispatch)
    worker._dispatch(dispatch)
    full = wpb.Dispatch(instance_id=6, attempt=1, command="true")
    worker._dispatch(full)
    go.touch()
    deadline = time.monotonic() + 30
    while worker._attempts[(5, 1)].finished is None:
        assert time.monotonic() < deadline, "the attempt did not end"
        time.sleep(0.01)
    sent = frames(session)
    kinds = [m.WhichOneof("body") for m in sent]
    assert kinds[:2] == ["accepted", "started"], kinds
    rejected = [m.rejected for m in sent if m.WhichOneof("body") == "rejected"]
    assert [(r.instance_id, r.duplicate) for r in rejected] == [(5, True), (6, False)]
    assert "full" in rejected[1].reason
    logs = [m.logs for m in sent if m.WhichOneof("body") == "logs"]
    # No flusher runs here: the end sends the lines, and keeps them until a LogAck.
    assert [(b.first_seq, b.body, b.streams) for b in logs] == [(1, "hi", b"\x01")]
    assert [last for last, _ in worker._attempts[(5, 1)].batches] == [1]
    worker._handle(session, wpb.SchedulerMessage(log_ack=wpb.LogAck(instance_id=5, attempt=1, seq=1)))
    assert worker._attempts[(5, 1)].batches == []
    (finished,) = [m.finished for m in sent if m.WhichOneof("body") == "finished"]
    assert finished.outcome == 1 and finished.exit_code == 0 and finished.log_lines == 1
    # Acknowledged, the attempt is forgotten but still known as a duplicate.
    worker._handle(session, wpb.SchedulerMessage(finished_ack=wpb.FinishedAck(instance_id=5, attempt=1)))
    assert (5, 1) not in worker._attempts
    worker._dispatch(dispatch)
    assert [m.rejected.duplicate for m in frames(session)] == [True]


def test_a_reconnect_resends_the_unacknowledged_batches_as_they_were_cut(tmp_path):
    """The scheduler knows a batch by its first_seq: a re-cut batch would be taken for one it
    has, and its new lines lost."""
    worker = Worker("http://127.0.0.1:1", "unit", kill_grace=0.1)
    first = _Session(worker.endpoints[0])
    first.registered = True
    worker._session = first
    one, two = tmp_path / "one", tmp_path / "two"
    command = (
        f"echo a; echo b; echo c; while [ ! -e '{one}' ]; do sleep 0.01; done; echo d; echo e; "
        f"while [ ! -e '{two}' ]; do sleep 0.01; done; echo f; echo g"
    )
    worker._dispatch(wpb.Dispatch(instance_id=7, attempt=2, command=command))
    attempt = worker._attempts[(7, 2)]
    deadline = time.monotonic() + 30

    def flush_when(count):
        while True:
            with worker._lock:
                if len(attempt.pending) == count:
                    worker._flush(attempt)
                    return
            assert time.monotonic() < deadline, f"no {count} lines"
            time.sleep(0.01)

    flush_when(3)
    one.touch()
    flush_when(2)
    sent = [m.logs for m in frames(first) if m.WhichOneof("body") == "logs"]
    assert [(b.first_seq, b.body) for b in sent] == [(1, "a\nb\nc"), (4, "d\ne")]
    # Lines 1-3 are stored; the stream breaks before the ack of 4-5, and 6-7 come after it.
    worker._handle(first, wpb.SchedulerMessage(log_ack=wpb.LogAck(instance_id=7, attempt=2, seq=3)))
    worker._detach(first)
    two.touch()
    while attempt.finished is None:
        assert time.monotonic() < deadline, "the attempt did not end"
        time.sleep(0.01)
    second = _Session(worker.endpoints[0])
    register = worker._register_frame()
    assert [(r.instance_id, r.attempt) for r in register.finished] == [(7, 2)]
    assert list(register.running) == []
    worker._attach(second, wpb.Registered())
    resent = frames(second)
    assert [m.WhichOneof("body") for m in resent] == ["started", "logs", "logs", "finished"]
    assert resent[1].logs == sent[1]
    assert (resent[2].logs.first_seq, resent[2].logs.body) == (6, "f\ng")
    assert resent[3].finished.log_lines == 7


class _Echo(control_pb2_grpc.ControlServiceServicer):
    """Answers GetRun with the authorization metadata it received, as the run's triggered_by."""

    def GetRun(self, request, context):
        seen = dict(context.invocation_metadata()).get("authorization", "")
        return control.Run(id=request.id, triggered_by=seen)


class _Hello(worker_pb2_grpc.WorkerServiceServicer):
    """Records the Register and the metadata of a worker's stream, then ends it."""

    def __init__(self):
        self.seen = queue.Queue()

    def Connect(self, request_iterator, context):
        first = next(request_iterator)
        self.seen.put((dict(context.invocation_metadata()).get("authorization", ""), first))
        return iter(())


def test_the_token_goes_with_every_call_of_the_client_and_the_worker():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_pb2_grpc.add_ControlServiceServicer_to_server(_Echo(), server)
    hello = _Hello()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(hello, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client(f"http://127.0.0.1:{port}", token="s3cret") as client:
            assert client.get_run(42).triggered_by == "Bearer s3cret"
        with Client(f"127.0.0.1:{port}") as client:
            assert client.get_run(42).triggered_by == ""
        worker = Worker(f"http://127.0.0.1:{port}", "unit-token", token="w0rker", capacity=3)
        worker.start()
        try:
            authorization, register = hello.seen.get(timeout=30)
        finally:
            worker.stop(drain=False, timeout=5)
        assert authorization == "Bearer w0rker"
        assert register.WhichOneof("body") == "register"
        assert (register.register.worker_id, register.register.capacity) == ("unit-token", 3)
        # One random incarnation per worker process, the same on every Register.
        assert len(register.register.incarnation) == 32
        assert register.register.incarnation == worker.incarnation
    finally:
        server.stop(None)


def test_a_task_gets_the_dispatch_env_but_not_the_workers_token(monkeypatch):
    monkeypatch.setenv("AX_TOKEN", "worker-secret")
    monkeypatch.setenv("WORKER_SETTING", "inherited")
    worker = Worker("http://127.0.0.1:1", "unit-env")
    session = _Session(worker.endpoints[0])
    session.registered = True
    worker._session = session
    command = 'echo "${AX_TOKEN-unset} $WORKER_SETTING $FROM_DISPATCH"'
    worker._dispatch(wpb.Dispatch(instance_id=9, attempt=1, command=command, env={"FROM_DISPATCH": "given"}))
    attempt = worker._attempts[(9, 1)]
    deadline = time.monotonic() + 30
    while attempt.finished is None:
        assert time.monotonic() < deadline, "the attempt did not end"
        time.sleep(0.01)
    (batch,) = [m.logs for m in frames(session) if m.WhichOneof("body") == "logs"]
    assert batch.body == "unset inherited given"


def _self_signed(directory):
    """A certificate for 127.0.0.1 and localhost, and its key (openssl's command line)."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but openssl is not installed: the TLS test cannot be skipped")
        pytest.skip("openssl is not installed")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class _Overloaded(control_pb2_grpc.ControlServiceServicer):
    """Refuses the first `refuse` TriggerWorkflow calls for load, as the scheduler does (the
    trailers `retry-after` and `ax-overloaded-bin`), then creates run 7; other refusals as asked."""

    def __init__(self, refuse, hint_ms=200, code=grpc.StatusCode.RESOURCE_EXHAUSTED, hinted=True):
        self.refuse = refuse
        self.hint_ms = hint_ms
        self.code = code
        self.hinted = hinted
        self.calls = []

    def TriggerWorkflow(self, request, context):
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.refuse:
            if self.hinted:
                overloaded = control.Overloaded(
                    bound="app", app="etl", waiting=5, limit=5, retry_after_ms=self.hint_ms
                )
                context.set_trailing_metadata(
                    (
                        ("retry-after", "1"),
                        ("ax-overloaded-bin", overloaded.SerializeToString()),
                    )
                )
            context.abort(self.code, f"workflow {request.name!r} not triggered: the bound is met")
        return control.TriggerWorkflowResponse(run=control.Run(id=7, workflow=request.name), created=True)


def _serving(servicer):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_pb2_grpc.add_ControlServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"http://127.0.0.1:{port}"


def test_the_retry_delay_is_the_schedulers_policy():
    from ax_sdk.client import retry_delay

    # The same table as ax_core::admission's test of client_retry_delay_ms.
    assert retry_delay(1, 0, 0.0) == 0.25
    assert retry_delay(1, 0, 1.0) == 0.5
    assert retry_delay(4, 0, 1.0) == 4.0
    assert retry_delay(40, 0, 1.0) == 30.0
    assert retry_delay(1, 1_000, 0.0) == 1.0
    assert retry_delay(1, 1_000, 1.0) == 1.25
    assert retry_delay(6, 1_000, 0.0) == 8.0


def test_a_trigger_refused_for_load_waits_past_the_hint_logs_and_tries_again(caplog):
    servicer = _Overloaded(refuse=2, hint_ms=300)
    server, address = _serving(servicer)
    try:
        with Client(address) as client, caplog.at_level("WARNING", logger="ax_sdk"):
            answer = client.trigger("etl")
        assert answer.run.id == 7
        assert len(servicer.calls) == 3
        for before, after in zip(servicer.calls, servicer.calls[1:]):
            assert after - before >= 0.3
        waits = [r.getMessage() for r in caplog.records if "refused for load" in r.getMessage()]
        assert len(waits) == 2, waits
        assert "the bound is met" in waits[0] and "(refusal 2, giving up after 60s)" in waits[1]
    finally:
        server.stop(None)


def test_a_trigger_still_refused_after_retry_for_raises_with_the_bound():
    servicer = _Overloaded(refuse=1_000, hint_ms=300)
    server, address = _serving(servicer)
    try:
        with Client(address, retry_for=1.0) as client:
            started = time.monotonic()
            with pytest.raises(AxError) as raised:
                client.trigger("etl")
            assert time.monotonic() - started <= 1.5
            error = raised.value
            assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (error.overloaded.bound, error.overloaded.app, error.overloaded.limit) == ("app", "etl", 5)
            assert error.refusals == len(servicer.calls) >= 2
            calls = len(servicer.calls)
            with pytest.raises(AxError):
                client.trigger("etl", retry_for=0)
            assert len(servicer.calls) == calls + 1
    finally:
        server.stop(None)


def test_other_refusals_are_not_tried_again():
    for servicer in (
        _Overloaded(refuse=5, code=grpc.StatusCode.NOT_FOUND),
        # Too many failed authentications: RESOURCE_EXHAUSTED without the hint.
        _Overloaded(refuse=5, hinted=False),
    ):
        server, address = _serving(servicer)
        try:
            with Client(address) as client, pytest.raises(AxError) as raised:
                client.trigger("etl")
            assert raised.value.overloaded is None
            assert len(servicer.calls) == 1
        finally:
            server.stop(None)


def test_https_addresses_verify_the_server_against_the_ca_file(tmp_path):
    cert, key = _self_signed(tmp_path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_pb2_grpc.add_ControlServiceServicer_to_server(_Echo(), server)
    hello = _Hello()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(hello, server)
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        address = f"https://127.0.0.1:{port}"
        with Client(address, token="over-tls", tls_ca=str(cert)) as client:
            assert client.get_run(7).triggered_by == "Bearer over-tls"
        # Without the CA the server's certificate is not trusted.
        with Client(address, timeout=5) as client:
            with pytest.raises(AxError) as refused:
                client.get_run(7)
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        # Plaintext to a TLS port fails too: the scheme decides.
        with Client(f"http://127.0.0.1:{port}", timeout=5) as client:
            with pytest.raises(AxError):
                client.get_run(7)
        worker = Worker(address, "unit-tls", tls_ca=str(cert))
        worker.start()
        try:
            _, register = hello.seen.get(timeout=30)
        finally:
            worker.stop(drain=False, timeout=5)
        assert register.register.worker_id == "unit-tls"
    finally:
        server.stop(None)


def _running(worker, session, instance_id, tmp_path):
    """Dispatches a task that runs until killed; returns its attempt once its pid is known."""
    pid_file = tmp_path / f"pid-{instance_id}"
    command = f"echo $$ > '{pid_file}'; exec sleep 300"
    worker._dispatch(wpb.Dispatch(instance_id=instance_id, attempt=1, command=command))
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the task did not start"
        time.sleep(0.01)
    return worker._attempts[(instance_id, 1)]


def _wait_forgotten(worker, key):
    deadline = time.monotonic() + 30
    while key in worker._attempts:
        assert time.monotonic() < deadline, f"{key} is still held"
        time.sleep(0.01)


def test_stale_and_refused_attempts_are_killed_and_forgotten(tmp_path):
    worker = Worker("http://127.0.0.1:1", "unit-stale", kill_grace=0.1)
    first = _Session(worker.endpoints[0])
    first.registered = True
    worker._session = first
    stale = _running(worker, first, 11, tmp_path)
    refused = _running(worker, first, 12, tmp_path)
    kept = _running(worker, first, 13, tmp_path)

    # ReportRefused with kill: the process group dies, nothing more is said about it.
    refusal = wpb.ReportRefused(instance_id=12, attempt=1, reason="not current", kill=True, code=9)
    worker._handle(first, wpb.SchedulerMessage(refused=refusal))
    _wait_forgotten(worker, (12, 1))
    assert refused.proc.returncode == -9

    # A new stream on which the scheduler calls attempt 11 stale.
    worker._detach(first)
    frames(first)
    second = _Session(worker.endpoints[0])
    worker._attach(second, wpb.Registered(stale=[wpb.AttemptRef(instance_id=11, attempt=1)]))
    _wait_forgotten(worker, (11, 1))
    assert stale.proc.returncode == -9
    about = {(m.started.instance_id if m.WhichOneof("body") == "started" else None) for m in frames(second)}
    assert about == {13}
    # Both stay known: a repeated dispatch of either is a duplicate.
    worker._dispatch(wpb.Dispatch(instance_id=11, attempt=1, command="true"))
    worker._dispatch(wpb.Dispatch(instance_id=12, attempt=1, command="true"))
    assert [m.rejected.duplicate for m in frames(second)] == [True, True]
    kept.proc.kill()


def test_a_function_of_the_main_script_runs_without_its_main_block(tmp_path):
    script = tmp_path / "my_worker.py"
    script.write_text(
        "def hello(ctx):\n"
        "    print('hello', ctx.args, ctx.params, ctx.run_id)\n"
        "    raise SystemExit(5)\n"
        "if __name__ == '__main__':\n"
        "    print('the main block ran')\n"
    )
    ref = functions.FunctionRef(name="hello", module="__main__", qualname="hello", file=str(script))
    env = dict(os.environ)
    env[functions.SPEC_ENV] = json.dumps(functions.child_spec(ref, ["x"]))
    env.update({"AX_PARAM_day": "monday", "AX_RUN_ID": "12"})
    done = subprocess.run(
        [sys.executable, "-m", "ax_sdk._fnrun"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout == "hello ('x',) {'day': 'monday'} 12\n"


def test_outputs_read_as_the_rust_worker_reads_them():
    from ax_sdk import outputs

    text = "rows=1250\n\nreport<<EOF\nfirst\nsecond = 2\nEOF\nempty=\nrows=1251\nurl=a=b\n"
    assert outputs.parse(text.encode()) == {
        "rows": "1251",
        "report": "first\nsecond = 2",
        "empty": "",
        "url": "a=b",
    }
    refusals = [
        ("rows 12\n", "$AX_OUTPUT line 1: expected KEY=VALUE or KEY<<DELIMITER"),
        ("ok=1\n1rows=2\n", '$AX_OUTPUT line 2: "1rows" is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)'),
        ("text<<END\nline\n", '$AX_OUTPUT line 1: the block is not closed by a line "END"'),
        ("text<<\n", "$AX_OUTPUT line 1: a block needs a delimiter after <<"),
    ]
    for text, message in refusals:
        with pytest.raises(outputs.OutputsError) as refused:
            outputs.parse(text.encode())
        assert str(refused.value) == message
    over = b"k=" + b"x" * outputs.MAX_ATTEMPT_BYTES
    with pytest.raises(outputs.OutputsError, match="more than the 65536"):
        outputs.parse(over)
    rendered = outputs.render({"a": "1", "b": "x\ny"})
    assert outputs.parse(rendered.encode()) == {"a": "1", "b": "x\ny"}
    assert outputs.from_return({"n": 3, "s": "t", "not-a-name": 1}) == {
        "return": '{"n": 3, "s": "t", "not-a-name": 1}',
        "n": "3",
        "s": "t",
    }
    assert outputs.from_return([1, 2]) == {"return": "[1, 2]"}
    assert outputs.env_name("load-db.v2", "rows") == "AX_UPSTREAM_LOAD_DB_V2_rows"


def _typed(ctx, count, rows: int = upstream("count", "rows"), note: str = upstream("count", "note")):
    return ctx, count, rows, note


def _only_upstream(names: list = upstream("count", "names")):
    return names


def _plain_one(anything):
    return anything


def test_upstream_values_become_arguments_by_name_and_by_upstream():
    env = {
        "AX_UPSTREAM_COUNT_return": '{"a": [1, 2]}',
        "AX_UPSTREAM_COUNT_rows": "3",
        "AX_UPSTREAM_COUNT_note": "two\nlines",
        "AX_UPSTREAM_COUNT_names": '["a", "b"]',
    }
    ctx = object()
    args, kwargs = bind(_typed, ctx, env)
    assert args == [ctx, {"a": [1, 2]}, 3, "two\nlines"] and kwargs == {}
    assert bind(_only_upstream, ctx, env) == ([["a", "b"]], {})
    # A function's only plain parameter is its context, as before upstream arguments.
    assert bind(_plain_one, ctx, env) == ([ctx], {})
    assert bind(lambda: None, ctx, env) == ([], {})


def test_a_missing_or_unconvertible_upstream_value_is_named():
    with pytest.raises(ArgumentError, match="parameter count: no direct upstream task count passed on a value and the run has no param count"):
        bind(_typed, object(), {"AX_UPSTREAM_COUNT_rows": "3", "AX_UPSTREAM_COUNT_note": "n"})
    bad = {"AX_UPSTREAM_COUNT_return": "1", "AX_UPSTREAM_COUNT_rows": "many", "AX_UPSTREAM_COUNT_note": "n"}
    with pytest.raises(ArgumentError, match="parameter rows: output rows of task count is 'many', not int"):
        bind(_typed, object(), bad)


class _Refusing(worker_pb2_grpc.WorkerServiceServicer):
    """A worker service that refuses every stream's credentials with `code`."""

    def __init__(self, code):
        self.code = code
        self.calls = 0

    def Connect(self, request_iterator, context):
        self.calls += 1
        context.abort(self.code, "token not accepted (create one with axctl token create --role worker)")


@pytest.mark.parametrize(
    "code, advice",
    [
        (grpc.StatusCode.UNAUTHENTICATED, "Give the worker a valid token: Worker(token=...)"),
        (grpc.StatusCode.PERMISSION_DENIED, "Give it a worker token whose worker ids include 'unit-refused'"),
    ],
)
def test_a_refused_token_stops_the_worker_with_an_sdk_worded_error(code, advice):
    from ax_sdk import WorkerRefused

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    refusing = _Refusing(code)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(refusing, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        worker = Worker(f"http://127.0.0.1:{port}", "unit-refused", token="wrong")
        raised = queue.Queue()

        def serve():
            try:
                worker.run()
                raised.put(None)
            except BaseException as error:  # what run() raised, for the assertion below
                raised.put(error)

        import threading

        threading.Thread(target=serve, daemon=True).start()
        error = raised.get(timeout=30)
        assert isinstance(error, WorkerRefused), error
        assert f"the scheduler at http://127.0.0.1:{port} refused worker 'unit-refused' ({code.name}:" in str(error)
        assert advice in str(error)
        # Asked once: trying again cannot help.
        assert refusing.calls == 1
    finally:
        server.stop(None)


def test_an_address_refusing_connections_is_warned_about_at_once(caplog):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level("WARNING", logger="ax_sdk")
    worker = Worker(f"http://127.0.0.1:{port}", "unit-unreachable")
    worker.start()
    try:
        deadline = time.monotonic() + 10
        wanted = f"cannot connect to http://127.0.0.1:{port} (connection refused: is a scheduler running there?); trying again"
        while wanted not in caplog.messages:
            assert time.monotonic() < deadline, caplog.messages
            time.sleep(0.05)
        time.sleep(1.0)
        # Once, not on every try of the next half minute.
        assert caplog.messages.count(wanted) == 1, caplog.messages
    finally:
        worker.stop(drain=False, timeout=5)


def test_the_sdk_enums_are_the_protocols():
    from ax_sdk import InstanceState, RunState, Trigger
    from ax_sdk.pb import types

    for enum_type, proto_enum, prefix in (
        (RunState, types.RunState, "RUN_STATE_"),
        (InstanceState, types.InstanceState, "INSTANCE_STATE_"),
        (Trigger, types.TriggerKind, "TRIGGER_KIND_"),
    ):
        assert {m.name: m.value for m in enum_type} == {
            name[len(prefix):]: value for name, value in proto_enum.items()
        }
    assert str(RunState.SUCCESS) == "SUCCESS" and RunState.FAILED.ended and not RunState.QUEUED.ended
