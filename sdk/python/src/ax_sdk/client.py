"""A client of the scheduler's control API (`proto/ax/v1/control.proto`).

Every scheduler node serves the whole API, so a client given several addresses uses the first
that answers and moves to the next when a call finds its node unavailable. Calls return the
generated protobuf messages (`ax_sdk.pb`); a refused call raises `AxError` with the gRPC status
code and the scheduler's message.

A trigger or backfill the scheduler refuses for load (RESOURCE_EXHAUSTED with the trailers
`retry-after` and `ax-overloaded-bin`: too many task instances waiting) is tried again after a
jittered, growing wait never shorter than the scheduler's hint, for at most `retry_for` seconds,
each wait logged on the `ax_sdk` logger; then `AxError` is raised with `overloaded` set. The
policy is the scheduler's own (`ax_core::admission::client_retry_delay_ms`), so axctl and this
client wait alike.
"""

from __future__ import annotations

import getpass
import json
import logging
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Mapping, Optional, Union, cast

import grpc

from ._pb import control_pb2 as control
from ._pb import control_pb2_grpc
from .connection import Credentials, parse_endpoints
from .convert import to_json
from .runs import Instance, InstanceState, Run, RunState, Triggered, WorkflowParam

if TYPE_CHECKING:
    from .workflow import Workflow

# What `mark` takes as the state: an InstanceState (or its protocol value), or its name.
MarkState = Union[InstanceState, int, str]


# A run in one of these states is over.
FINAL_RUN_STATES = frozenset({RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED})

# How long `wait` waits, after the run ended, for the processes of its cancelled or timed-out
# attempts to be reported ended, unless told otherwise.
DEFAULT_SETTLE = 30.0

# The trailer of a refusal for load: an encoded `ax.v1.Overloaded`.
OVERLOADED_TRAILER = "ax-overloaded-bin"

# How long trigger and backfill keep trying while refused for load, unless told otherwise.
DEFAULT_RETRY_FOR = 60.0

log = logging.getLogger("ax_sdk")


class AxError(Exception):
    """A call the scheduler refused or could not answer. `overloaded` is the bound a refusal for
    load met (`pb.control.Overloaded`), None for any other refusal; `refusals` counts the refusals
    for load before the client gave up."""

    def __init__(
        self,
        call: str,
        code: grpc.StatusCode,
        details: str,
        overloaded: Optional[control.Overloaded] = None,
        refusals: int = 0,
    ):
        super().__init__(f"{call}: {code.name}: {details}")
        self.call = call
        self.code = code
        self.details = details
        self.overloaded = overloaded
        self.refusals = refusals


def _overloaded(error: Any) -> Optional[control.Overloaded]:
    """The refusal for load an error carries, if it is one."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == OVERLOADED_TRAILER:
            try:
                return control.Overloaded.FromString(value)
            except Exception:  # a trailer that does not decode is no hint
                return None
    return None


def retry_delay(refusals: int, hint_ms: int, unit_random: float) -> float:
    """Seconds to wait before the try after `refusals` refusals for load (1-based): exponential
    from half a second to 30 s, jittered down to half, never sooner than the hint stretched by up to
    a quarter. `ax_core::admission::client_retry_delay_ms`, in seconds."""
    r = min(max(unit_random, 0.0), 1.0)
    exponent = min(max(refusals - 1, 0), 16)
    full = min(500 * (1 << exponent), 30_000)
    backoff = int(full * (0.5 + 0.5 * r))
    hinted = int(hint_ms * (1.0 + 0.25 * r))
    return max(backoff, hinted) / 1000.0


def _default_actor() -> str:
    try:
        return f"{getpass.getuser()} (python-sdk)"
    except Exception:  # getuser fails without a passwd entry or LOGNAME
        return "python-sdk"


class Client:
    """A control API client. Runs, instances and attempts come back typed (`ax_sdk.runs`); the
    other calls return the generated messages (`ax_sdk.pb.control`).

    `addresses`: one address or several (a list, or comma-separated), each `http://host:port`,
    `https://host:port` or `host:port`. `token`/`token_file`: a bearer token sent as
    `authorization: Bearer <token>`. `tls_ca`: the CA file for https:// addresses.
    `actor`: who the audit trail records for mutating calls. `retry_for`: how many seconds
    `trigger` and `backfill` keep trying while refused for load (0: not at all).
    """

    def __init__(
        self,
        addresses: Union[str, Iterable[str]] = "http://127.0.0.1:7070",
        *,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        actor: Optional[str] = None,
        timeout: float = 30.0,
        retry_for: float = DEFAULT_RETRY_FOR,
    ):
        self._endpoints = parse_endpoints(addresses)
        self._retry_for = retry_for
        self._credentials = Credentials.load(token, token_file, tls_ca, tls_cert, tls_key)
        self._actor = actor or _default_actor()
        self._timeout = timeout
        self._current = 0
        self._channel: Optional[grpc.Channel] = None
        self._stub: Optional[control_pb2_grpc.ControlServiceStub] = None

    @staticmethod
    def from_env(
        *,
        actor: Optional[str] = None,
        timeout: float = 30.0,
        retry_for: float = DEFAULT_RETRY_FOR,
    ) -> "Client":
        """AX_SERVER (default http://127.0.0.1:7070) with AX_TOKEN/AX_TOKEN_FILE, AX_TLS_CA,
        AX_TLS_CERT and AX_TLS_KEY, as axctl reads them."""
        import os

        creds = Credentials.from_env()
        return Client(
            os.environ.get("AX_SERVER") or "http://127.0.0.1:7070",
            token=creds.token,
            tls_ca=creds.tls_ca,
            tls_cert=creds.tls_cert,
            tls_key=creds.tls_key,
            actor=actor,
            timeout=timeout,
            retry_for=retry_for,
        )

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------
    # Plumbing.

    def _connect(self) -> control_pb2_grpc.ControlServiceStub:
        if self._stub is None:
            self._channel = self._credentials.channel(self._endpoints[self._current])
            self._stub = control_pb2_grpc.ControlServiceStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _call(self, name: str, request: Any, timeout: Optional[float] = None) -> Any:
        """Calls `name`, moving to the next address while a node is unavailable (the call did not
        reach a scheduler, so trying it elsewhere cannot double it)."""
        last = None
        for _ in range(len(self._endpoints)):
            stub = self._connect()
            try:
                return getattr(stub, name)(request, timeout=timeout or self._timeout)
            except grpc.RpcError as error:
                last = error
                if error.code() != grpc.StatusCode.UNAVAILABLE or len(self._endpoints) == 1:
                    break
                self.close()
                self._current = (self._current + 1) % len(self._endpoints)
        assert last is not None
        raise AxError(name, last.code(), last.details() or "", _overloaded(last)) from None

    def _call_patiently(self, name: str, request: Any, retry_for: Optional[float]) -> Any:
        """`_call`, tried again while refused for load, for at most `retry_for` seconds (the
        client's when None). A refusal creates nothing, so trying again cannot double a run."""
        patience = self._retry_for if retry_for is None else retry_for
        start = time.monotonic()
        refusals = 0
        while True:
            try:
                return self._call(name, request)
            except AxError as error:
                if error.overloaded is None:
                    raise
                refusals += 1
                error.refusals = refusals
                delay = retry_delay(refusals, error.overloaded.retry_after_ms, random.random())
                if time.monotonic() - start + delay > patience:
                    raise
                log.warning(
                    "%s refused for load (%s); trying again in %.1fs (refusal %d, giving up after %gs)",
                    name,
                    error.details,
                    delay,
                    refusals,
                    patience,
                )
                time.sleep(delay)

    # ------------------------------------------------------------------------------------------
    # Workflows.

    def apply(
        self,
        path: Union[None, str, Path, "Workflow"] = None,
        *,
        source: Optional[str] = None,
        source_name: Optional[str] = None,
        dry_run: bool = False,
    ) -> control.ApplyWorkflowResponse:
        """Applies a workflow file, a `Workflow` built in Python, or a file's text as `source`.
        A refusal names file:line: field."""
        source, source_name = _workflow_source(path, source, source_name)
        request = control.ApplyWorkflowRequest(
            source=source, source_name=source_name, dry_run=dry_run, actor=self._actor
        )
        return cast(control.ApplyWorkflowResponse, self._call("ApplyWorkflow", request))

    def get_workflow(self, name: str) -> control.Workflow:
        """The workflow's latest version: its tasks, schedule, source, and the params it declares
        (`.params`, typed by `WorkflowParam.of` or `workflow_params`)."""
        return cast(control.Workflow, self._call("GetWorkflow", control.GetWorkflowRequest(name=name)))

    def workflow_params(self, name: str) -> List[WorkflowParam]:
        """The params the workflow declares (`params:` in its file), in file order, typed: what a
        trigger form asks for."""
        return WorkflowParam.of(self.get_workflow(name))

    def list_workflows(self, app: str = "") -> control.ListWorkflowsResponse:
        return cast(control.ListWorkflowsResponse, self._call("ListWorkflows", control.ListWorkflowsRequest(app=app, summary=True)))

    def pause(self, name: str) -> control.Workflow:
        return cast(control.Workflow, self._call("PauseWorkflow", control.PauseWorkflowRequest(name=name, actor=self._actor)))

    def resume(self, name: str) -> control.Workflow:
        return cast(control.Workflow, self._call("ResumeWorkflow", control.ResumeWorkflowRequest(name=name, actor=self._actor)))

    # ------------------------------------------------------------------------------------------
    # Runs.

    def trigger(
        self,
        workflow: str,
        params: Optional[Mapping[str, Any]] = None,
        *,
        idempotency_key: str = "",
        logical_time_ms: int = 0,
        retry_for: Optional[float] = None,
    ) -> Triggered:
        """Starts a run. A repeated idempotency key returns the first call's run with
        `created` False. Each param reaches every task as AX_PARAM_<name>: a string as it is,
        any other value as JSON (`{"n": 3, "flag": True}` gives `3` and `true`), which a task
        function's annotated parameters read back typed. Refused for load, it tries again for
        `retry_for` seconds (the client's `retry_for` when None)."""
        request = control.TriggerWorkflowRequest(
            name=workflow,
            params=encode_params(params),
            idempotency_key=idempotency_key,
            actor=self._actor,
            logical_time_ms=logical_time_ms,
        )
        response = self._call_patiently("TriggerWorkflow", request, retry_for)
        return Triggered(run=Run.from_pb(response.run), created=response.created)

    def get_run(self, run_id: int) -> Run:
        return Run.from_pb(self._call("GetRun", control.GetRunRequest(id=run_id)))

    def list_runs(self, workflow: str = "", limit: int = 50, state: int = 0) -> List[Run]:
        """The newest runs (of `workflow`, in `state` when given), newest first."""
        response = self._call("ListRuns", control.ListRunsRequest(workflow=workflow, limit=limit, state=cast(Any, state)))
        return [Run.from_pb(run) for run in response.runs]

    def watch(self, run_id: int, settle: float = DEFAULT_SETTLE, timeout: Optional[float] = None) -> Iterator[Run]:
        """The run now, then each change of its state or counts, as the scheduler streams them
        (`WatchRun`); the iterator ends once the run has ended and its processes have (at most
        `settle` seconds after its end). A broken stream, or one open `timeout` seconds, raises
        AxError."""
        request = control.WatchRunRequest(id=run_id, settle_ms=_settle_ms(settle))
        stub = self._connect()
        try:
            for message in stub.WatchRun(request, timeout=timeout):
                yield Run.from_pb(message)
        except grpc.RpcError as error:
            raise AxError("WatchRun", error.code(), error.details() or "") from None

    def wait(self, run_id: int, timeout: Optional[float] = None, settle: float = DEFAULT_SETTLE) -> Run:
        """Waits until the run is SUCCESS, FAILED or CANCELLED and the processes of its
        attempts have ended (a cancelled or timed-out attempt's process is killed after the
        run ends; at most `settle` seconds more), and returns it. Raises TimeoutError after
        `timeout` seconds (None: no limit). It follows the scheduler's stream of the run's
        changes, and while its node is unavailable (restarting) it tries the stream again, on
        the next address when there are several."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = "nothing yet"
        last: Optional[Run] = None
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"run {run_id} did not end within {timeout} s (last seen: {seen})")
            try:
                for run in self.watch(run_id, settle, remaining):
                    last = run
                    seen = str(run.state)
                if last is not None and last.state.ended:
                    return last
            except AxError as error:
                if error.code == grpc.StatusCode.UNIMPLEMENTED:
                    return self._poll_until_ended(run_id, deadline, timeout, settle)
                if error.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                    raise
                if error.code == grpc.StatusCode.UNAVAILABLE:
                    seen = f"scheduler unavailable ({error.details})"
                    self._next_endpoint()
            # The stream ended before the run did (its node is stopping) or broke: again soon.
            time.sleep(0.25)

    def _next_endpoint(self) -> None:
        if len(self._endpoints) > 1:
            self.close()
            self._current = (self._current + 1) % len(self._endpoints)

    def _poll_until_ended(self, run_id: int, deadline: Optional[float], timeout: Optional[float], settle: float) -> Run:
        """`wait` against a scheduler without WatchRun (0.1): GetRun four times a
        second, then the run's instances until no process may run."""
        ended_at: Optional[float] = None
        seen = "nothing yet"
        while True:
            try:
                run = self.get_run(run_id)
                seen = str(run.state)
                if run.state.ended:
                    ended_at = ended_at or time.monotonic()
                    settled = not any(
                        a.process_may_run for i in self.instances(run_id) for a in i.attempts
                    )
                    if settled or time.monotonic() - ended_at >= settle:
                        return run
            except AxError as error:
                if error.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                seen = f"scheduler unavailable ({error.details})"
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not end within {timeout} s (last seen: {seen})")
            time.sleep(0.25)

    def cancel_run(self, run_id: int, reason: str = "") -> Run:
        request = control.CancelRunRequest(id=run_id, actor=self._actor, reason=reason)
        return Run.from_pb(self._call("CancelRun", request))

    def rerun(
        self,
        run_id: int,
        *,
        failed: bool = False,
        from_task: str = "",
        tasks: Union[str, Iterable[str]] = (),
    ) -> Run:
        """New attempts for part of a run, one of: `failed=True`, every FAILED, TIMEOUT and
        CANCELLED instance (their downstream follows); `from_task`, that task and everything below
        it; `tasks`, exactly those tasks (a name or several) and everything below each, like
        Airflow's "clear with downstream" (a chosen task below another waits for it). The earlier
        attempts keep their records. A refusal (none or several of the three, an unknown task, a
        task still active) raises AxError naming it, and nothing is rerun."""
        request = control.RerunRunRequest(
            id=run_id, failed=failed, from_task=from_task, tasks=_task_names(tasks), actor=self._actor
        )
        return Run.from_pb(self._call("RerunRun", request))

    # ------------------------------------------------------------------------------------------
    # Instances and logs.

    def list_instances(self, run_id: int, attempts: bool = False) -> control.ListInstancesResponse:
        return cast(control.ListInstancesResponse, self._call("ListInstances", control.ListInstancesRequest(run_id=run_id, attempts=attempts)))

    def instances(self, run_id: int) -> List[Instance]:
        """The run's instances, each with its attempts."""
        return [Instance.from_pb(i) for i in self.list_instances(run_id, attempts=True).instances]

    def get_instance(self, instance_id: int) -> Instance:
        return Instance.from_pb(self._call("GetInstance", control.GetInstanceRequest(id=instance_id)))

    def cancel_instance(self, instance_id: int, reason: str = "") -> Instance:
        request = control.CancelInstanceRequest(id=instance_id, actor=self._actor, reason=reason)
        return Instance.from_pb(self._call("CancelInstance", request))

    def retry_instance(self, instance_id: int) -> Instance:
        request = control.RetryInstanceRequest(id=instance_id, actor=self._actor)
        return Instance.from_pb(self._call("RetryInstance", request))

    def mark(self, instance_id: int, state: MarkState, *, reason: str) -> Instance:
        """Marks the instance SUCCESS or FAILED without running it (operator role;
        docs/dag-semantics.md, "Marks"): a running attempt is killed and not retried, what
        depends on the task follows its trigger rules, an ended run runs again until nothing is
        left. `state` is `InstanceState.SUCCESS` or `InstanceState.FAILED`, or `"success"` or
        `"failed"`. `reason` is required: the audit trail and the attempt's message keep it. A
        refusal (no reason, a state the instance has already, a PENDING instance, a mapped task
        with items still going) raises AxError saying why, and changes nothing."""
        request = control.MarkInstanceRequest(
            id=instance_id, state=cast(Any, _mark_state(state)), reason=reason, actor=self._actor
        )
        return Instance.from_pb(self._call("MarkInstance", request))

    def logs(
        self,
        instance_id: int,
        *,
        attempt: int = 0,
        follow: bool = False,
        after_seq: int = 0,
        contains: str = "",
    ) -> Iterator[control.StoredLogLine]:
        """The attempt's log lines in order (attempt 0: the current one). With `follow` the
        iterator ends once the attempt has ended and every line it produced was sent."""
        request = control.GetLogsRequest(
            instance_id=instance_id, attempt=attempt, follow=follow, after_seq=after_seq, contains=contains
        )
        stub = self._connect()
        try:
            for chunk in stub.GetLogs(request, timeout=None if follow else self._timeout):
                yield from chunk.lines
        except grpc.RpcError as error:
            raise AxError("GetLogs", error.code(), error.details() or "") from None

    def log_text(self, instance_id: int, attempt: int = 0) -> List[str]:
        """The text of every stored line of the attempt."""
        return [line.text for line in self.logs(instance_id, attempt=attempt)]

    # ------------------------------------------------------------------------------------------
    # The cluster.

    def list_workers(self) -> List[control.WorkerInfo]:
        return list(self._call("ListWorkers", control.ListWorkersRequest()).workers)

    def list_nodes(self) -> control.ListNodesResponse:
        return cast(control.ListNodesResponse, self._call("ListNodes", control.ListNodesRequest()))

    def explain(self, workflow: str, at_ms: int = 0) -> control.Explanation:
        return cast(control.Explanation, self._call("ExplainWorkflow", control.ExplainWorkflowRequest(name=workflow, at_ms=at_ms)))

    def backfill(
        self,
        workflow: str,
        from_ms: int,
        to_ms: int,
        dry_run: bool = False,
        retry_for: Optional[float] = None,
    ) -> control.BackfillWorkflowResponse:
        """One run per cron slot of the range; refused for load, tried again as `trigger` is."""
        request = control.BackfillWorkflowRequest(
            name=workflow, from_ms=from_ms, to_ms=to_ms, dry_run=dry_run, actor=self._actor
        )
        return cast(control.BackfillWorkflowResponse, self._call_patiently("BackfillWorkflow", request, retry_for))


def _mark_state(state: MarkState) -> InstanceState:
    """SUCCESS or FAILED, from what `mark` was given; anything else is refused, naming it."""
    found: Optional[InstanceState] = None
    if isinstance(state, str):
        name = state.strip().upper()
        name = name[len("INSTANCE_STATE_"):] if name.startswith("INSTANCE_STATE_") else name
        found = InstanceState.__members__.get(name)
    elif isinstance(state, int) and not isinstance(state, bool):
        found = InstanceState(state) if state in InstanceState._value2member_map_ else None
    if found is None or found not in (InstanceState.SUCCESS, InstanceState.FAILED):
        raise ValueError(f"an instance can be marked SUCCESS or FAILED only, not {state!r}")
    return found


def _task_names(tasks: Union[str, Iterable[str]]) -> List[str]:
    """The tasks of a rerun: one name, or several."""
    if isinstance(tasks, str):
        return [tasks]
    names = list(tasks)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"tasks are task names (strings), not {type(name).__name__} {name!r}")
    return names


def encode_params(params: Optional[Mapping[str, Any]]) -> Mapping[str, str]:
    """A trigger's params as the protocol carries them: strings as they are, other values as
    JSON (`convert.to_json`: dataclasses, enums and dates included), except that a value whose
    JSON is a string goes bare (a date as `2026-01-31`, an enum by its value), as a shell task
    and `${params.NAME}` expect it."""
    encoded: Dict[str, str] = {}
    for key, value in (params or {}).items():
        text = value if isinstance(value, str) else to_json(value)
        if not isinstance(value, str) and text.startswith('"'):
            text = json.loads(text)
        encoded[str(key)] = text
    return encoded


def _settle_ms(settle: float) -> int:
    if not 0 < settle <= 600:
        raise ValueError(f"settle must be more than 0 and at most 600 seconds, not {settle}")
    return max(1, int(settle * 1000))


def _workflow_source(
    path: Union[None, str, Path, "Workflow"], source: Optional[str], source_name: Optional[str]
) -> "tuple[str, str]":
    """The text and name of what `apply` was given: a file, a `Workflow`, or text."""
    from .workflow import Workflow

    if isinstance(path, Workflow):
        if source is not None:
            raise ValueError("apply takes a Workflow or source text, not both")
        return path.to_yaml(), source_name or f"{path.name} (built in Python)"
    if (path is None) == (source is None):
        raise ValueError("apply needs a workflow file path, a Workflow or source text, exactly one")
    if path is not None:
        try:
            source = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ValueError(f"cannot read workflow file {path}: {error.strerror or error}") from None
        source_name = source_name or str(path)
    assert source is not None
    return source, source_name or "workflow.yaml"
