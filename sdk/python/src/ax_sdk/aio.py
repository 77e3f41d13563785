"""An asyncio client of the scheduler's control API (`grpc.aio`), for services that trigger and
wait on runs without a thread per wait.

    async with AsyncClient("http://127.0.0.1:7070") as client:
        triggered = await client.trigger("etl", {"day": "2026-01-31"})
        run = await client.wait(triggered.run_id)      # follows the run's stream, no polling

It speaks as `Client` does: the same addresses (moving to the next while a node is
unavailable), token, TLS and retries of a trigger refused for load; runs and instances come
back typed (`ax_sdk.runs`).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, List, Mapping, Optional, Union, cast

import grpc
import grpc.aio

from ._pb import control_pb2 as control
from ._pb import control_pb2_grpc
from .client import (
    DEFAULT_RETRY_FOR,
    DEFAULT_SETTLE,
    AxError,
    MarkState,
    _default_actor,
    _mark_state,
    _overloaded,
    _settle_ms,
    _task_names,
    _workflow_source,
    encode_params,
    log,
    retry_delay,
)
from .connection import Credentials, parse_endpoints
from .runs import Instance, Run, Triggered, WorkflowParam

if TYPE_CHECKING:
    from .workflow import Workflow


class AsyncClient:
    """A control API client for asyncio; arguments as `Client`'s."""

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
        self._credentials = Credentials.load(token, token_file, tls_ca, tls_cert, tls_key)
        self._metadata = tuple(self._credentials.metadata())
        self._actor = actor or _default_actor()
        self._timeout = timeout
        self._retry_for = retry_for
        self._current = 0
        self._channel: Optional[grpc.aio.Channel] = None
        self._stub: Optional[control_pb2_grpc.ControlServiceStub] = None

    @staticmethod
    def from_env(
        *,
        actor: Optional[str] = None,
        timeout: float = 30.0,
        retry_for: float = DEFAULT_RETRY_FOR,
    ) -> "AsyncClient":
        """As `Client.from_env`: AX_SERVER with AX_TOKEN/AX_TOKEN_FILE and AX_TLS_*."""
        import os

        creds = Credentials.from_env()
        return AsyncClient(
            os.environ.get("AX_SERVER") or "http://127.0.0.1:7070",
            token=creds.token,
            tls_ca=creds.tls_ca,
            tls_cert=creds.tls_cert,
            tls_key=creds.tls_key,
            actor=actor,
            timeout=timeout,
            retry_for=retry_for,
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------------------------
    # Plumbing.

    def _connect(self) -> Any:
        if self._stub is None:
            self._channel = self._credentials.aio_channel(self._endpoints[self._current])
            self._stub = control_pb2_grpc.ControlServiceStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    async def _next_endpoint(self) -> None:
        if len(self._endpoints) > 1:
            await self.close()
            self._current = (self._current + 1) % len(self._endpoints)

    async def _call(self, name: str, request: Any) -> Any:
        last: Optional[grpc.aio.AioRpcError] = None
        for _ in range(len(self._endpoints)):
            stub = self._connect()
            try:
                return await getattr(stub, name)(request, timeout=self._timeout, metadata=self._metadata)
            except grpc.aio.AioRpcError as error:
                last = error
                if error.code() != grpc.StatusCode.UNAVAILABLE or len(self._endpoints) == 1:
                    break
                await self._next_endpoint()
        assert last is not None
        raise AxError(name, last.code(), last.details() or "", _overloaded(last)) from None

    async def _call_patiently(self, name: str, request: Any, retry_for: Optional[float]) -> Any:
        patience = self._retry_for if retry_for is None else retry_for
        start = time.monotonic()
        refusals = 0
        while True:
            try:
                return await self._call(name, request)
            except AxError as error:
                if error.overloaded is None:
                    raise
                refusals += 1
                error.refusals = refusals
                delay = retry_delay(refusals, error.overloaded.retry_after_ms, random.random())
                if time.monotonic() - start + delay > patience:
                    raise
                log.warning("%s refused for load (%s); trying again in %.1fs", name, error.details, delay)
                await asyncio.sleep(delay)

    # ------------------------------------------------------------------------------------------
    # Workflows and runs.

    async def apply(
        self,
        path: Union[None, str, Path, "Workflow"] = None,
        *,
        source: Optional[str] = None,
        source_name: Optional[str] = None,
        dry_run: bool = False,
    ) -> control.ApplyWorkflowResponse:
        source, source_name = _workflow_source(path, source, source_name)
        request = control.ApplyWorkflowRequest(source=source, source_name=source_name, dry_run=dry_run, actor=self._actor)
        response: control.ApplyWorkflowResponse = await self._call("ApplyWorkflow", request)
        return response

    async def get_workflow(self, name: str) -> control.Workflow:
        """As `Client.get_workflow`: the latest version, its declared params in `.params`."""
        workflow: control.Workflow = await self._call("GetWorkflow", control.GetWorkflowRequest(name=name))
        return workflow

    async def workflow_params(self, name: str) -> List[WorkflowParam]:
        """As `Client.workflow_params`: the params the workflow declares, in file order, typed."""
        return WorkflowParam.of(await self.get_workflow(name))

    async def trigger(
        self,
        workflow: str,
        params: Optional[Mapping[str, Any]] = None,
        *,
        idempotency_key: str = "",
        logical_time_ms: int = 0,
        retry_for: Optional[float] = None,
    ) -> Triggered:
        request = control.TriggerWorkflowRequest(
            name=workflow,
            params=encode_params(params),
            idempotency_key=idempotency_key,
            actor=self._actor,
            logical_time_ms=logical_time_ms,
        )
        response = await self._call_patiently("TriggerWorkflow", request, retry_for)
        return Triggered(run=Run.from_pb(response.run), created=response.created)

    async def get_run(self, run_id: int) -> Run:
        return Run.from_pb(await self._call("GetRun", control.GetRunRequest(id=run_id)))

    async def list_runs(self, workflow: str = "", limit: int = 50, state: int = 0) -> List[Run]:
        response = await self._call("ListRuns", control.ListRunsRequest(workflow=workflow, limit=limit, state=cast(Any, state)))
        return [Run.from_pb(run) for run in response.runs]

    async def watch(
        self, run_id: int, settle: float = DEFAULT_SETTLE, timeout: Optional[float] = None
    ) -> AsyncIterator[Run]:
        """The run now, then each change of its state or counts (`WatchRun`), until it has ended
        and its processes have."""
        request = control.WatchRunRequest(id=run_id, settle_ms=_settle_ms(settle))
        stub = self._connect()
        try:
            async for message in stub.WatchRun(request, timeout=timeout, metadata=self._metadata):
                yield Run.from_pb(message)
        except grpc.aio.AioRpcError as error:
            raise AxError("WatchRun", error.code(), error.details() or "") from None

    async def wait(self, run_id: int, timeout: Optional[float] = None, settle: float = DEFAULT_SETTLE) -> Run:
        """As `Client.wait`: the run once it has ended and its processes have; TimeoutError
        after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = "nothing yet"
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"run {run_id} did not end within {timeout} s (last seen: {seen})")
            last: Optional[Run] = None
            try:
                async for run in self.watch(run_id, settle, remaining):
                    last = run
                    seen = str(run.state)
                if last is not None and last.state.ended:
                    return last
            except AxError as error:
                if error.code == grpc.StatusCode.UNIMPLEMENTED:
                    return await self._poll_until_ended(run_id, deadline, timeout, settle)
                if error.code not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.CANCELLED,
                ):
                    raise
                if error.code == grpc.StatusCode.UNAVAILABLE:
                    seen = f"scheduler unavailable ({error.details})"
                    await self._next_endpoint()
            # The stream ended before the run did (its node is stopping) or broke: again soon.
            await asyncio.sleep(0.25)

    async def _poll_until_ended(
        self, run_id: int, deadline: Optional[float], timeout: Optional[float], settle: float
    ) -> Run:
        """`wait` against a scheduler without WatchRun (0.1), as `Client._poll_until_ended`."""
        ended_at: Optional[float] = None
        seen = "nothing yet"
        while True:
            try:
                run = await self.get_run(run_id)
                seen = str(run.state)
                if run.state.ended:
                    ended_at = ended_at or time.monotonic()
                    instances = await self.instances(run_id)
                    settled = not any(a.process_may_run for i in instances for a in i.attempts)
                    if settled or time.monotonic() - ended_at >= settle:
                        return run
            except AxError as error:
                if error.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                seen = f"scheduler unavailable ({error.details})"
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not end within {timeout} s (last seen: {seen})")
            await asyncio.sleep(0.25)

    async def cancel_run(self, run_id: int, reason: str = "") -> Run:
        request = control.CancelRunRequest(id=run_id, actor=self._actor, reason=reason)
        return Run.from_pb(await self._call("CancelRun", request))

    async def rerun(
        self,
        run_id: int,
        *,
        failed: bool = False,
        from_task: str = "",
        tasks: Union[str, Iterable[str]] = (),
    ) -> Run:
        """As `Client.rerun`: `failed=True`, `from_task` or `tasks` (with everything below each)."""
        request = control.RerunRunRequest(
            id=run_id, failed=failed, from_task=from_task, tasks=_task_names(tasks), actor=self._actor
        )
        return Run.from_pb(await self._call("RerunRun", request))

    # ------------------------------------------------------------------------------------------
    # Instances and logs.

    async def instances(self, run_id: int) -> List[Instance]:
        response = await self._call("ListInstances", control.ListInstancesRequest(run_id=run_id, attempts=True))
        return [Instance.from_pb(i) for i in response.instances]

    async def get_instance(self, instance_id: int) -> Instance:
        return Instance.from_pb(await self._call("GetInstance", control.GetInstanceRequest(id=instance_id)))

    async def cancel_instance(self, instance_id: int, reason: str = "") -> Instance:
        request = control.CancelInstanceRequest(id=instance_id, actor=self._actor, reason=reason)
        return Instance.from_pb(await self._call("CancelInstance", request))

    async def retry_instance(self, instance_id: int) -> Instance:
        request = control.RetryInstanceRequest(id=instance_id, actor=self._actor)
        return Instance.from_pb(await self._call("RetryInstance", request))

    async def mark(self, instance_id: int, state: MarkState, *, reason: str) -> Instance:
        """As `Client.mark`: SUCCESS or FAILED without running it, a reason required."""
        request = control.MarkInstanceRequest(
            id=instance_id, state=cast(Any, _mark_state(state)), reason=reason, actor=self._actor
        )
        return Instance.from_pb(await self._call("MarkInstance", request))

    async def logs(
        self, instance_id: int, *, attempt: int = 0, follow: bool = False, after_seq: int = 0
    ) -> AsyncIterator[control.StoredLogLine]:
        """The attempt's log lines in order; with `follow`, until the attempt has ended and every
        line it produced was sent."""
        request = control.GetLogsRequest(instance_id=instance_id, attempt=attempt, follow=follow, after_seq=after_seq)
        stub = self._connect()
        try:
            async for chunk in stub.GetLogs(
                request, timeout=None if follow else self._timeout, metadata=self._metadata
            ):
                for line in chunk.lines:
                    yield line
        except grpc.aio.AioRpcError as error:
            raise AxError("GetLogs", error.code(), error.details() or "") from None
