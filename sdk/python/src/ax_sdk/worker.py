"""An ax worker in Python: the contract of `proto/ax/v1/worker.proto`, as `ax-worker` keeps it.

It holds one stream to one scheduler node at a time and

- registers first, with its id, labels, capacity and version, listing the attempts it still
  runs (`running`) and the ends not yet acknowledged (`finished`), so a reconnect re-attaches
  them; then resends, per attempt and in order, AttemptStarted, every LogBatch not covered by a
  LogAck and the AttemptFinished not yet acknowledged;
- sends WorkerHeartbeat and a TaskHeartbeat per running attempt at the intervals the scheduler
  asks in Registered, and treats a stream whose HeartbeatAcks stop as broken;
- answers Dispatch with DispatchAccepted and starts the task, or DispatchRejected (`duplicate`
  for an attempt it runs or ran; otherwise only when it did not and will not start it);
- runs each attempt as a child process leading a process group of its own, with the Dispatch's
  env added to the worker's; a guardian process kills the groups if the worker dies;
- numbers the output lines from 1, sends them in packed LogBatches, and keeps each batch until
  a LogAck covers it, resending it exactly as first cut (the scheduler knows a batch by its
  first_seq);
- enforces Dispatch.timeout_ms itself from the process's start (SIGTERM to the group, SIGKILL
  after the kill grace, outcome TIMEOUT), and CancelAttempt the same way (outcome CANCELLED);
- resends AttemptFinished on every new stream until FinishedAck or ReportRefused;
- kills what ReportRefused(kill) and Registered.stale name, and forgets it;
- sends the same random incarnation on every Register of the process, so a node lets it take
  its id back from its own lingering stream at once, and refuses (ALREADY_EXISTS) a second
  process under a live id; a refused Register is retried like any broken stream;
- reconnects with exponential backoff and full jitter, going round its list of addresses,
  follows MoveElsewhere, and fences itself (kills its attempts, reported FAILED) when cut off
  from every live node for 3/4 of the scheduler's dead-worker threshold, an endpoint that
  actively refuses connections counting as a node that is down rather than one judging it.

Tasks are shell commands (`/bin/sh -c`, or the Dispatch's argv) and Python functions registered
with `@worker.task("name")` (see `ax_sdk.functions` for how a workflow selects one).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import queue
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union, cast, overload

import grpc

from . import duration, functions
from . import outputs as outputs_mod
from .outputs import OutputsError
from ._pb import types_pb2 as types
from ._pb import worker_pb2 as wpb
from ._pb import worker_pb2_grpc
from .connection import ConfigError, Credentials, Endpoint, parse_endpoints
from .functions import P, R
from .version import __version__

log = logging.getLogger("ax_sdk.worker")

VERSION = "ax-sdk-python/" + __version__

# LogBatch limits: lines and body bytes per batch, and how long a line may wait for company.
BATCH_MAX_LINES = 4096
BATCH_MAX_BYTES = 1 << 20
BATCH_DELAY = 0.05

# The fraction of the scheduler's dead-worker threshold after which a cut-off worker fences.
FENCE_FRACTION = 0.75

# How often an endpoint that cannot be reached is warned about while it stays so, in seconds.
UNREACHABLE_WARNING_EVERY = 30.0

Key = Tuple[int, int]

# A resolved address of an endpoint: (address family, (host, port)).
Address = Tuple[int, Tuple[Any, ...]]


def _output_file(key: Key) -> str:
    """Makes an attempt's empty $AX_OUTPUT file, readable by this worker's account only."""
    directory = os.path.join(tempfile.gettempdir(), f"ax-sdk-outputs-{os.getuid()}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"output-{key[0]}-{key[1]}-{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    return path


def _read_outputs(path: Optional[str]) -> Dict[str, str]:
    """The outputs an attempt wrote, its file removed; OutputsError when it cannot be read."""
    if not path:
        return {}
    try:
        size = os.stat(path).st_size
        if size > outputs_mod.MAX_ATTEMPT_BYTES:
            raise OutputsError(
                f"$AX_OUTPUT holds {size} bytes, more than the {outputs_mod.MAX_ATTEMPT_BYTES} an attempt may pass on"
            )
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return {}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return outputs_mod.parse(data)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _boundary(data: bytes, limit: int) -> int:
    """Where to cut `data` at most `limit` bytes in, not inside a UTF-8 character (at `limit`
    when the bytes are not UTF-8)."""
    cut = min(limit, len(data))
    while cut > 0 and cut > limit - 4 and cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 else min(limit, len(data))


def _killpg(group: int, sig: int) -> bool:
    """Signals a process group; False when it no longer exists."""
    if group <= 1:
        return False
    try:
        os.killpg(group, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class WorkerRefused(Exception):
    """A scheduler refused the worker's credentials (UNAUTHENTICATED or PERMISSION_DENIED)."""


class _Attempt:
    """One accepted attempt: its process, its unacknowledged lines and its end."""

    def __init__(self, dispatch: wpb.Dispatch):
        self.dispatch = dispatch
        self.key: Key = (dispatch.instance_id, dispatch.attempt)
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.pid = 0
        self.started_at_ms = 0
        self.started_mono = 0.0
        # Lines not yet cut into a batch: (stream byte, text), numbered from next_seq - len.
        self.pending: List[Tuple[int, str]] = []
        self.next_seq = 1
        # Batches cut and not yet acknowledged, as first sent: (last seq, frame). A resend must
        # repeat a batch exactly, since the scheduler knows a batch by its first_seq.
        self.batches: List[Tuple[int, wpb.LogBatch]] = []
        # How many of `batches` went out on the current stream.
        self.sent_batches = 0
        self.finished: Optional[wpb.AttemptFinished] = None
        self.finished_mono = 0.0
        # Why the worker killed it: "timeout", "cancel", "fence", "stop"; None while not killed.
        self.kill_reason: Optional[str] = None
        self.kill_message = ""
        # Refused by the scheduler or named stale: nothing more is sent about it.
        self.forgotten = False
        self.exited = threading.Event()
        # The file the task writes its outputs to ($AX_OUTPUT); read when it exits.
        self.output_path: Optional[str] = None
        self.readers: List[threading.Thread] = []

    @property
    def running(self) -> bool:
        return self.finished is None


class _Session:
    """One stream: the frames queued for it and whether it is registered."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.outgoing: "queue.Queue[Optional[wpb.WorkerMessage]]" = queue.Queue()
        self.registered = False
        self.closed = threading.Event()
        self.call = None
        self.last_frame = time.monotonic()
        self.acks_seen = False
        self.move_to: Optional[str] = None

    def requests(self) -> Iterator[wpb.WorkerMessage]:
        while True:
            message = self.outgoing.get()
            if message is None:
                return
            yield message

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.outgoing.put(None)


class _Guardian:
    """A helper process that kills the attempts' process groups if the worker dies (even of
    SIGKILL): the worker tells it each group as it starts and ends, and it kills every group
    still listed when its pipe from the worker closes."""

    def __init__(self) -> None:
        self._proc: Optional["subprocess.Popen[bytes]"] = None
        self._lock = threading.Lock()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ax_sdk._guardian"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as error:
            log.warning("cannot start the guardian process (%s): tasks will outlive a crashed worker", error)

    def _write(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                log.warning("the guardian process is gone: tasks will outlive a crashed worker")
                self._proc = None

    def add(self, group: int) -> None:
        self._write(f"+{group}\n")

    def remove(self, group: int) -> None:
        self._write(f"-{group}\n")

    def close(self, kill_left: bool) -> None:
        """Ends the guardian; with `kill_left` it first kills the groups still listed."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            try:
                if not kill_left:
                    proc.stdin.write(b"exit\n")
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


class Worker:
    """A worker. `scheduler`: one address or several (a list or comma-separated); every node
    should be listed (see SELF-FENCING in worker.proto). `worker_id` should be stable across
    restarts and must be unique among live workers (default: `<host name>-<pid>`, unique but not
    stable, as ax-worker's).

    Intervals are in seconds. The heartbeat intervals are used until a scheduler sends its own
    in Registered, which then apply. `self_fence_after` None disables self-fencing.
    """

    def __init__(
        self,
        scheduler: Union[str, Iterable[str]] = "http://127.0.0.1:7070",
        worker_id: Optional[str] = None,
        *,
        labels: Optional[Mapping[str, str]] = None,
        capacity: int = 20,
        tasks: Union[None, functions.Tasks, Sequence[functions.Tasks]] = None,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        heartbeat_interval: float = 5.0,
        task_heartbeat_interval: float = 30.0,
        kill_grace: float = 5.0,
        self_fence_after: Optional[float] = 10.0,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 10.0,
        register_timeout: float = 10.0,
        finished_retention: float = 3600.0,
        flush_timeout: float = 5.0,
        max_line_bytes: int = 64 * 1024,
        hostname: Optional[str] = None,
    ):
        self.endpoints = parse_endpoints(scheduler)
        self.worker_id = (worker_id or f"{socket.gethostname()}-{os.getpid()}").strip()
        if not 1 <= len(self.worker_id) <= 128:
            raise ConfigError(f"worker id {self.worker_id!r} must be 1 to 128 characters")
        if capacity < 1:
            raise ConfigError(f"capacity {capacity} must be at least 1")
        for name, value in (
            ("heartbeat_interval", heartbeat_interval),
            ("task_heartbeat_interval", task_heartbeat_interval),
            ("reconnect_initial", reconnect_initial),
            ("reconnect_max", reconnect_max),
            ("register_timeout", register_timeout),
        ):
            if not value > 0:
                raise ConfigError(f"{name} must be more than 0 seconds, not {value}")
        if kill_grace < 0:
            raise ConfigError(f"kill_grace must not be negative, not {kill_grace}")
        if self_fence_after is not None and not self_fence_after > 0:
            raise ConfigError(f"self_fence_after must be more than 0 seconds (or None), not {self_fence_after}")
        if max_line_bytes < 4:
            raise ConfigError(f"max_line_bytes must be at least 4, not {max_line_bytes}")
        self.labels = {str(k): str(v) for k, v in (labels or {}).items()}
        self.capacity = capacity
        self.credentials = Credentials.load(token, token_file, tls_ca, tls_cert, tls_key)
        self.tasks = functions.Tasks()
        if isinstance(tasks, functions.Tasks):
            tasks = [tasks]
        for registry in tasks or ():
            self.tasks.merge(registry)
        self.heartbeat_interval = heartbeat_interval
        self.task_heartbeat_interval = task_heartbeat_interval
        self.kill_grace = kill_grace
        self.self_fence_after = self_fence_after
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.register_timeout = register_timeout
        self.finished_retention = finished_retention
        self.flush_timeout = flush_timeout
        self.max_line_bytes = max_line_bytes
        self.hostname = hostname or socket.gethostname()
        self.started_at_ms = _now_ms()
        # Sent on every Register: the node tells this worker reconnecting (its old stream may
        # still be open there) from another process registering under the same id.
        self.incarnation = secrets.token_hex(16)

        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._attempts: Dict[Key, _Attempt] = {}
        # Attempts that ended and were acknowledged or refused, for duplicate detection.
        self._remembered: Dict[Key, float] = {}
        self._session: Optional[_Session] = None
        self._draining = False
        self._stopped = threading.Event()
        self._threads: List[threading.Thread] = []
        self._guardian: Optional[_Guardian] = None
        # Self-fencing: the last contact, each endpoint's resolved addresses of the latest pass
        # (None: it did not resolve), and each address's last active refusal.
        self._dead_after_ms = 0
        self._last_contact = time.monotonic()
        self._resolved: Dict[str, Optional[List[Address]]] = {}
        self._refused: Dict[Address, float] = {}
        self._registrations = 0
        self._warned_unreachable: Dict[str, float] = {}
        # Why the worker stopped by itself (its credentials refused); `run()` raises it.
        self.error: Optional[WorkerRefused] = None

    # ------------------------------------------------------------------------------------------
    # Public surface.

    @overload
    def task(self, name: Callable[P, R]) -> Callable[P, R]: ...
    @overload
    def task(self, name: Optional[str] = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def task(self, name: Any = None) -> Any:
        """Registers a Python function as a task: `@worker.task` or `@worker.task("name")`."""
        return self.tasks.task(name)

    def run(self) -> None:
        """Serves until stopped; raises `WorkerRefused` when a scheduler refuses the worker's
        credentials (nothing changes by trying again). In the main thread, SIGTERM and SIGINT drain the worker (no new
        attempts; the running ones finish and their ends are acknowledged); a second one stops
        it at once, killing what still runs."""
        if threading.current_thread() is threading.main_thread():
            signals = {"count": 0}

            def on_signal(signum: int, _frame: object) -> None:
                signals["count"] += 1
                if signals["count"] == 1:
                    log.info("signal %s: draining (send another to stop at once)", signum)
                    threading.Thread(target=self.stop, kwargs={"drain": True, "timeout": None}, daemon=True).start()
                else:
                    log.info("signal %s: stopping now", signum)
                    threading.Thread(target=self.stop, kwargs={"drain": False}, daemon=True).start()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        self.start()
        while not self._stopped.wait(0.5):
            pass
        for thread in self._threads:
            thread.join(timeout=10)
        if self.error is not None:
            raise self.error

    def start(self) -> "Worker":
        """Starts serving in background threads and returns at once."""
        if self._threads:
            raise RuntimeError("the worker was already started")
        self._guardian = _Guardian()
        for target, name in (
            (self._connection_loop, "ax-connection"),
            (self._flusher, "ax-log-flusher"),
            (self._fence_watch, "ax-fence"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, drain: bool = True, timeout: Optional[float] = None) -> None:
        """Stops the worker. With `drain` it takes no new attempts and waits for the running ones
        to end (at most `timeout` seconds; None: no limit); without, it kills them first
        (reported FAILED). Either way it then waits up to `flush_timeout` for the scheduler to
        acknowledge the attempts' ends, and kills what still runs."""
        with self._lock:
            self._draining = True
            if not drain:
                for attempt in self._attempts.values():
                    if attempt.running and attempt.pid:
                        self._kill(attempt, "stop", "the worker is stopping")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while any(a.running for a in self._attempts.values()):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self._wake.wait(0.2)
            flushed = time.monotonic() + self.flush_timeout
            while self._attempts and time.monotonic() < flushed:
                self._wake.wait(0.2)
            left = [a.key for a in self._attempts.values()]
            for attempt in self._attempts.values():
                if attempt.running and attempt.pid:
                    self._kill(attempt, "stop", "the worker is stopping")
        if left:
            log.warning("stopping with attempts whose end the scheduler has not acknowledged: %s", left)
        self._stopped.set()
        with self._lock:
            session = self._session
        if session is not None:
            session.close()
            if session.call is not None:
                session.call.cancel()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)
        if self._guardian is not None:
            with self._lock:
                running = any(a.running and a.pid for a in self._attempts.values())
            self._guardian.close(kill_left=running)

    @property
    def connected(self) -> bool:
        """Whether a stream is registered now."""
        with self._lock:
            return self._session is not None and self._session.registered

    @property
    def registrations(self) -> int:
        """How many times the worker registered (1 + its reconnects)."""
        with self._lock:
            return self._registrations

    def running_attempts(self) -> List[Key]:
        with self._lock:
            return [a.key for a in self._attempts.values() if a.running]

    # ------------------------------------------------------------------------------------------
    # Sending. Every send happens under the lock, onto the registered stream only; what is not
    # sent stays in the attempts' state and goes out on the next stream.

    def _send(self, body: str, message: Any) -> bool:
        session = self._session
        if session is None or not session.registered or session.closed.is_set():
            return False
        session.outgoing.put(wpb.WorkerMessage(**{body: message}))
        return True

    def _send_started(self, attempt: _Attempt) -> None:
        self._send(
            "started",
            wpb.AttemptStarted(
                instance_id=attempt.key[0],
                attempt=attempt.key[1],
                pid=attempt.pid,
                started_at_ms=attempt.started_at_ms,
            ),
        )

    def _flush(self, attempt: _Attempt) -> None:
        """Sends the attempt's batches not yet sent on this stream (as they were cut), then cuts
        its pending lines into new batches and sends those."""
        if attempt.forgotten or self._session is None or not self._session.registered:
            return
        while attempt.sent_batches < len(attempt.batches):
            if not self._send("logs", attempt.batches[attempt.sent_batches][1]):
                return
            attempt.sent_batches += 1
        while attempt.pending:
            first_seq = attempt.next_seq - len(attempt.pending)
            streams = bytearray()
            texts: List[str] = []
            size = 0
            for stream, text in attempt.pending[:BATCH_MAX_LINES]:
                if texts and size + len(text) > BATCH_MAX_BYTES:
                    break
                streams.append(stream)
                texts.append(text)
                size += len(text) + 1
            batch = wpb.LogBatch(
                instance_id=attempt.key[0],
                attempt=attempt.key[1],
                first_seq=first_seq,
                sent_at_ms=_now_ms(),
                streams=bytes(streams),
                body="\n".join(texts),
            )
            del attempt.pending[: len(texts)]
            attempt.batches.append((first_seq + len(texts) - 1, batch))
            if not self._send("logs", batch):
                return
            attempt.sent_batches += 1

    # ------------------------------------------------------------------------------------------
    # The connection loop.

    def _connection_loop(self) -> None:
        count = len(self.endpoints)
        index = zlib.crc32(self.worker_id.encode()) % count
        backoff = self.reconnect_initial
        failures = 0
        while not self._stopped.is_set():
            endpoint = self.endpoints[index]
            try:
                outcome, move_to = self._serve(endpoint)
            except Exception:
                # A bug here must not end the worker's only connection loop.
                log.exception("the stream to %s failed", endpoint.address)
                outcome, move_to = "failed", None
            if self._stopped.is_set() or outcome == "refused":
                return
            if outcome == "moved":
                index = self._move_target(index, move_to)
                failures = 0
                continue
            index = (index + 1) % count
            if outcome == "registered":
                failures = 0
                backoff = self.reconnect_initial
                self._stopped.wait(random.uniform(0, self.reconnect_initial))
                continue
            failures += 1
            if failures % count == 0:
                ceiling = self.reconnect_max
                fence = self._fence_delay()
                with self._lock:
                    busy = bool(self._attempts)
                if busy and fence is not None:
                    # Every endpoint is tried at least every quarter of the fence delay, so a
                    # refusal is never stale and a node that comes back hears from us in time.
                    ceiling = min(ceiling, fence / 4)
                backoff = min(backoff * 2, ceiling)
                self._stopped.wait(random.uniform(0, backoff))

    def _move_target(self, index: int, to_address: Optional[str]) -> int:
        """The endpoint to go to after MoveElsewhere: `to_address` when it is one of ours (compared
        after resolution), else the next one other than the current."""
        if to_address:
            try:
                wanted = set(self._addresses(parse_endpoints(to_address)[0]) or ())
            except ConfigError:
                wanted = set()
            for i, endpoint in enumerate(self.endpoints):
                if endpoint.address == to_address or wanted & set(self._addresses(endpoint) or ()):
                    if i != index:
                        return i
        return (index + 1) % len(self.endpoints)

    @staticmethod
    def _addresses(endpoint: Endpoint) -> Optional[List[Address]]:
        try:
            infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        return sorted({(info[0], info[4][:2]) for info in infos})

    def _probe(self, endpoint: Endpoint) -> Optional[str]:
        """Resolves the endpoint and tries a TCP connection to each of its addresses, noting each
        active refusal for self-fencing; None when one accepted, else why none did."""
        addresses = self._addresses(endpoint)
        with self._lock:
            self._resolved[endpoint.address] = addresses
        if not addresses:
            return f"{endpoint.host} does not resolve"
        problem = "no address answered"
        accepted = False
        for family, sockaddr in addresses:
            try:
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    probe.settimeout(min(2.0, self.register_timeout))
                    probe.connect(sockaddr)
                accepted = True
            except OSError as error:
                if isinstance(error, ConnectionRefusedError) or error.errno == errno.ECONNREFUSED:
                    with self._lock:
                        self._refused[(family, sockaddr)] = time.monotonic()
                    problem = "connection refused: is a scheduler running there?"
                else:
                    problem = error.strerror or str(error) or type(error).__name__
        return None if accepted else problem

    def _unreachable(self, endpoint: Endpoint, problem: str) -> None:
        """Warns that an endpoint cannot be reached: at once, then every UNREACHABLE_WARNING_EVERY
        seconds while it stays so."""
        now = time.monotonic()
        last = self._warned_unreachable.get(endpoint.address)
        if last is None or now - last >= UNREACHABLE_WARNING_EVERY:
            self._warned_unreachable[endpoint.address] = now
            log.warning("cannot connect to %s (%s); trying again", endpoint.address, problem)
        else:
            log.debug("%s does not accept connections: %s", endpoint.address, problem)

    def _refuse(self, endpoint: Endpoint, error: grpc.RpcError) -> None:
        """A scheduler refused this worker's credentials: trying again cannot help, so the worker
        stops, and `run()` raises the refusal."""
        code = error.code()
        self.error = WorkerRefused(
            f"the scheduler at {endpoint.address} refused worker {self.worker_id!r} "
            f"({code.name}: {error.details()}). "
            + (
                "Give the worker a valid token: Worker(token=...) or Worker(token_file=...), "
                "--token/--token-file, or AX_TOKEN/AX_TOKEN_FILE"
                if code == grpc.StatusCode.UNAUTHENTICATED
                else f"Give it a worker token whose worker ids include {self.worker_id!r} (and the "
                "apps and labels it serves)"
            )
        )
        log.error("%s", self.error)
        threading.Thread(target=self.stop, kwargs={"drain": False}, name="ax-refused-stop", daemon=True).start()

    def _serve(self, endpoint: Endpoint) -> Tuple[str, Optional[str]]:
        """One stream: ("failed", None), ("registered", None) once a registered stream ended, or
        ("moved", to_address)."""
        problem = self._probe(endpoint)
        if problem is not None:
            self._unreachable(endpoint, problem)
            return "failed", None
        self._warned_unreachable.pop(endpoint.address, None)
        channel = self.credentials.channel(endpoint)
        session = _Session(endpoint)
        try:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            with self._lock:
                register = self._register_frame()
            session.outgoing.put(wpb.WorkerMessage(register=register))
            call = stub.Connect(session.requests())
            session.call = call
            timer = threading.Timer(self.register_timeout, call.cancel)
            timer.daemon = True
            timer.start()
            try:
                first = next(call)
            except grpc.RpcError as error:
                if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    self._refuse(endpoint, error)
                    return "refused", None
                log.warning("registering with %s failed: %s: %s", endpoint.address, error.code().name, error.details())
                return "failed", None
            except StopIteration:
                log.warning("%s ended the stream before Registered", endpoint.address)
                return "failed", None
            finally:
                timer.cancel()
            if first.WhichOneof("body") != "registered":
                log.warning("%s answered Register with %s, not Registered", endpoint.address, first.WhichOneof("body"))
                return "failed", None
            self._attach(session, first.registered)
            log.info(
                "registered with %s (node %s) as %s", endpoint.address, first.registered.scheduler_node, self.worker_id
            )
            beats = threading.Thread(target=self._heartbeats, args=(session,), name="ax-heartbeat", daemon=True)
            beats.start()
            try:
                for message in call:
                    self._contact(session)
                    if self._handle(session, message):
                        break
            except grpc.RpcError as error:
                if not self._stopped.is_set() and session.move_to is None:
                    log.warning("stream to %s broke: %s: %s", endpoint.address, error.code().name, error.details())
            if session.move_to is not None:
                return "moved", session.move_to
            return "registered", None
        finally:
            self._detach(session)
            session.close()
            if session.call is not None:
                session.call.cancel()
            channel.close()

    def _detach(self, session: _Session) -> None:
        """The stream is over: nothing more goes onto it, and what it carried without an
        acknowledgement goes out again on the next one."""
        with self._lock:
            if self._session is session:
                self._session = None
                for attempt in self._attempts.values():
                    attempt.sent_batches = 0

    def _register_frame(self) -> wpb.Register:
        running: List[wpb.AttemptRef] = []
        finished: List[wpb.AttemptRef] = []
        for attempt in self._attempts.values():
            if attempt.forgotten:
                continue
            ref = wpb.AttemptRef(instance_id=attempt.key[0], attempt=attempt.key[1])
            (running if attempt.running else finished).append(ref)
        return wpb.Register(
            protocol=wpb.PROTOCOL_VERSION_1,
            worker_id=self.worker_id,
            version=VERSION,
            labels=self.labels,
            capacity=self.capacity,
            started_at_ms=self.started_at_ms,
            hostname=self.hostname,
            running=running,
            finished=finished,
            incarnation=self.incarnation,
        )

    def _attach(self, session: _Session, registered: wpb.Registered) -> None:
        """Makes the stream current and resends, per attempt and in order, what the old stream
        may have lost."""
        with self._lock:
            if registered.heartbeat_interval_ms:
                self.heartbeat_interval = registered.heartbeat_interval_ms / 1000
            if registered.task_heartbeat_interval_ms:
                self.task_heartbeat_interval = registered.task_heartbeat_interval_ms / 1000
            if registered.worker_dead_after_ms:
                self._dead_after_ms = registered.worker_dead_after_ms
            for ref in registered.stale:
                attempt = self._attempts.get((ref.instance_id, ref.attempt))
                if attempt is not None and attempt.running:
                    log.warning("attempt %s is stale on the scheduler: killing it", attempt.key)
                    self._forget(attempt, kill=True)
            session.registered = True
            session.last_frame = time.monotonic()
            self._session = session
            self._last_contact = time.monotonic()
            self._registrations += 1
            for attempt in list(self._attempts.values()):
                if attempt.forgotten:
                    continue
                if attempt.pid:
                    self._send_started(attempt)
                attempt.sent_batches = 0
                self._flush(attempt)
                if attempt.finished is not None:
                    self._send("finished", attempt.finished)

    def _contact(self, session: _Session) -> None:
        now = time.monotonic()
        session.last_frame = now
        with self._lock:
            self._last_contact = now

    def _heartbeats(self, session: _Session) -> None:
        next_worker = time.monotonic()
        next_task = time.monotonic() + self.task_heartbeat_interval
        while not session.closed.is_set():
            now = time.monotonic()
            if now - session.last_frame > max(4 * self.heartbeat_interval, 2.0):
                # The scheduler acknowledges every heartbeat: a silent stream is a broken one,
                # even while the transport still looks up (a blackholed connection does for
                # minutes, gRPC's keepalive pings included).
                log.warning("no frame from %s for %.1f s: reconnecting", session.endpoint.address, now - session.last_frame)
                if session.call is not None:
                    session.call.cancel()
                return
            with self._lock:
                if self._session is not session:
                    return
                if now >= next_worker:
                    running = sum(1 for a in self._attempts.values() if a.running)
                    sent = self._send(
                        "heartbeat",
                        wpb.WorkerHeartbeat(
                            sent_at_ms=_now_ms(), running=running, capacity=self.capacity, draining=self._draining
                        ),
                    )
                    if sent and not session.acks_seen:
                        # A scheduler that does not acknowledge heartbeats: frames sent on a
                        # stream that is up are the only contact there is (SELF-FENCING).
                        self._last_contact = now
                    next_worker = now + self.heartbeat_interval
                if now >= next_task:
                    for attempt in self._attempts.values():
                        if attempt.running and attempt.pid and not attempt.forgotten:
                            self._send(
                                "task_heartbeat",
                                wpb.TaskHeartbeat(
                                    instance_id=attempt.key[0], attempt=attempt.key[1], sent_at_ms=_now_ms()
                                ),
                            )
                    next_task = now + self.task_heartbeat_interval
            session.closed.wait(max(0.01, min(next_worker, next_task) - time.monotonic()))

    # ------------------------------------------------------------------------------------------
    # Frames from the scheduler.

    def _handle(self, session: _Session, message: wpb.SchedulerMessage) -> bool:
        """Handles one frame; True when the stream must end (MoveElsewhere)."""
        kind = message.WhichOneof("body")
        if kind == "dispatch":
            self._dispatch(message.dispatch)
        elif kind == "heartbeat_ack":
            session.acks_seen = True
        elif kind == "log_ack":
            ack = message.log_ack
            with self._lock:
                attempt = self._attempts.get((ack.instance_id, ack.attempt))
                if attempt is not None:
                    acked = 0
                    while acked < len(attempt.batches) and attempt.batches[acked][0] <= ack.seq:
                        acked += 1
                    del attempt.batches[:acked]
                    attempt.sent_batches = max(0, attempt.sent_batches - acked)
        elif kind == "finished_ack":
            finished_ack = message.finished_ack
            with self._lock:
                attempt = self._attempts.get((finished_ack.instance_id, finished_ack.attempt))
                if attempt is not None and attempt.finished is not None:
                    self._drop(attempt)
        elif kind == "cancel":
            cancel = message.cancel
            with self._lock:
                attempt = self._attempts.get((cancel.instance_id, cancel.attempt))
                if attempt is not None and attempt.running and attempt.pid and not attempt.forgotten:
                    log.info("cancelling attempt %s: %s", attempt.key, cancel.reason)
                    self._kill(attempt, "cancel", cancel.reason or "cancelled")
        elif kind == "refused":
            refused = message.refused
            with self._lock:
                attempt = self._attempts.get((refused.instance_id, refused.attempt))
                if attempt is not None:
                    log.warning("scheduler refused the report of %s: %s", attempt.key, refused.reason)
                    self._forget(attempt, kill=refused.kill)
        elif kind == "move_elsewhere":
            move = message.move_elsewhere
            log.info("asked to move to another node (%s): %s", move.to_address or "any", move.reason)
            session.move_to = move.to_address or ""
            self._detach(session)
            session.close()
            if session.call is not None:
                session.call.cancel()
            return True
        return False

    def _forget(self, attempt: _Attempt, kill: bool) -> None:
        """Sends nothing more about the attempt; kills its group first when asked."""
        attempt.forgotten = True
        attempt.pending.clear()
        attempt.batches.clear()
        if kill and attempt.running and attempt.pid:
            _killpg(attempt.pid, signal.SIGKILL)
        if not attempt.running:
            self._drop(attempt)

    def _drop(self, attempt: _Attempt) -> None:
        self._attempts.pop(attempt.key, None)
        self._remembered[attempt.key] = time.monotonic()
        self._wake.notify_all()

    def _reject(self, dispatch: wpb.Dispatch, reason: str, duplicate: bool) -> None:
        with self._lock:
            self._send(
                "rejected",
                wpb.DispatchRejected(
                    instance_id=dispatch.instance_id, attempt=dispatch.attempt, reason=reason, duplicate=duplicate
                ),
            )

    def _dispatch(self, dispatch: wpb.Dispatch) -> None:
        key = (dispatch.instance_id, dispatch.attempt)
        with self._lock:
            if key in self._attempts or key in self._remembered:
                self._reject(dispatch, "this worker already runs or ran this attempt", True)
                return
            if self._draining:
                self._reject(dispatch, "the worker is draining", False)
                return
            if sum(1 for a in self._attempts.values() if a.running) >= self.capacity:
                self._reject(dispatch, f"the worker is full ({self.capacity} attempts)", False)
                return
            attempt = _Attempt(dispatch)
            self._attempts[key] = attempt
            self._send("accepted", wpb.DispatchAccepted(instance_id=key[0], attempt=key[1]))
        try:
            args, env = self._command(dispatch)
            attempt.output_path = _output_file(key)
            env["AX_OUTPUT"] = attempt.output_path
            proc = subprocess.Popen(
                args,
                env=env,
                cwd=dispatch.working_dir or None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except (OSError, ValueError) as error:
            message = f"spawn failed: {error}"
            log.warning("attempt %s: %s", key, message)
            with self._lock:
                self._end(attempt, types.ATTEMPT_OUTCOME_SPAWN_FAILED, None, None, message)
            return
        with self._lock:
            attempt.proc = proc
            attempt.pid = proc.pid
            attempt.started_at_ms = _now_ms()
            attempt.started_mono = time.monotonic()
            if self._guardian is not None:
                self._guardian.add(proc.pid)
            self._send_started(attempt)
            for pipe, stream in ((proc.stdout, wpb.LOG_STREAM_STDOUT), (proc.stderr, wpb.LOG_STREAM_STDERR)):
                reader = threading.Thread(target=self._read, args=(attempt, pipe, stream), daemon=True)
                attempt.readers.append(reader)
                reader.start()
        threading.Thread(target=self._supervise, args=(attempt,), name=f"ax-attempt-{key}", daemon=True).start()

    def _command(self, dispatch: wpb.Dispatch) -> Tuple[List[str], Dict[str, str]]:
        env = dict(os.environ)
        # The worker's own credential is not the task's to use.
        for secret in ("AX_TOKEN", "AX_TOKEN_FILE"):
            env.pop(secret, None)
        env.update(dispatch.env)
        call = functions.function_call(dispatch.command, list(dispatch.argv))
        if call is not None:
            name, args = call
            ref = self.tasks.get(name)
            if ref is None:
                known = ", ".join(self.tasks.names()) or "none"
                raise ValueError(f"no Python task function {name!r} is registered on this worker (registered: {known})")
            env[functions.SPEC_ENV] = json.dumps(functions.child_spec(ref, args))
            env["PYTHONUNBUFFERED"] = "1"
            return [sys.executable, "-m", "ax_sdk._fnrun"], env
        if dispatch.argv:
            return list(dispatch.argv), env
        return ["/bin/sh", "-c", dispatch.command], env

    # ------------------------------------------------------------------------------------------
    # Attempts.

    def _read(self, attempt: _Attempt, pipe: IO[bytes], stream: int) -> None:
        """Reads one pipe into numbered lines; a line longer than max_line_bytes is cut into
        several at a UTF-8 character boundary."""
        limit = self.max_line_bytes
        carry = b""
        with pipe:
            while True:
                chunk = pipe.readline(limit)
                if not chunk:
                    if carry:
                        self._add_pieces(attempt, stream, carry)
                    return
                data, carry = carry + chunk, b""
                if data.endswith(b"\n"):
                    # Only the newline goes, a '\r' before it stays, as ax-worker does.
                    data = data[:-1]
                    self._add_pieces(attempt, stream, data)
                elif len(data) >= limit:
                    cut = _boundary(data, limit)
                    self._add_pieces(attempt, stream, data[:cut])
                    carry = data[cut:]
                else:
                    # A short read without a newline: the pipe ends next.
                    carry = data

    def _add_pieces(self, attempt: _Attempt, stream: int, data: bytes) -> None:
        limit = self.max_line_bytes
        while len(data) > limit:
            cut = _boundary(data, limit)
            self._add_line(attempt, stream, data[:cut].decode("utf-8", "replace"))
            data = data[cut:]
        self._add_line(attempt, stream, data.decode("utf-8", "replace"))

    def _add_line(self, attempt: _Attempt, stream: int, text: str) -> None:
        with self._lock:
            if attempt.forgotten:
                return
            attempt.pending.append((stream, text))
            attempt.next_seq += 1
            if len(attempt.pending) >= BATCH_MAX_LINES:
                self._flush(attempt)
            else:
                self._wake.notify_all()

    def _flusher(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                self._wake.wait(BATCH_DELAY)
                for attempt in list(self._attempts.values()):
                    if attempt.pending or attempt.sent_batches < len(attempt.batches):
                        self._flush(attempt)
            # Lines that arrive now wait a little for company.
            self._stopped.wait(BATCH_DELAY)

    def _kill(self, attempt: _Attempt, reason: str, message: str) -> None:
        """SIGTERM to the attempt's group, SIGKILL after the kill grace, once: the first reason
        sticks, and a cancel from a second node or a timeout after a cancel sends nothing more
        (a task's handler runs once)."""
        if attempt.kill_reason is not None:
            log.info("attempt %s is already being stopped (%s); not signalled again", attempt.key, message)
            return
        attempt.kill_reason = reason
        attempt.kill_message = message
        group = attempt.pid
        _killpg(group, signal.SIGTERM)

        def hard_kill() -> None:
            if not attempt.exited.is_set():
                _killpg(group, signal.SIGKILL)

        timer = threading.Timer(self.kill_grace, hard_kill)
        timer.daemon = True
        timer.start()

    def _supervise(self, attempt: _Attempt) -> None:
        proc = attempt.proc
        assert proc is not None
        timeout = attempt.dispatch.timeout_ms / 1000 if attempt.dispatch.timeout_ms else None
        deadline = attempt.started_mono + timeout if timeout else None
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                with self._lock:
                    if attempt.kill_reason is None and not attempt.forgotten:
                        log.info("attempt %s ran past its timeout of %s s: killing it", attempt.key, timeout)
                        self._kill(attempt, "timeout", f"killed after the timeout of {attempt.dispatch.timeout_ms} ms")
                deadline = None
                continue
            try:
                proc.wait(timeout=remaining)
                break
            except subprocess.TimeoutExpired:
                continue
        attempt.exited.set()
        # The group is the attempt: what the task left running in it goes with it, and its
        # pipes close.
        _killpg(attempt.pid, signal.SIGKILL)
        for reader in attempt.readers:
            reader.join()
        code = proc.returncode
        exit_code = code if code >= 0 else None
        sig = -code if code < 0 else None
        with self._lock:
            if self._guardian is not None:
                self._guardian.remove(attempt.pid)
            reason = attempt.kill_reason
            if reason == "timeout":
                outcome = types.ATTEMPT_OUTCOME_TIMEOUT
            elif reason == "cancel":
                outcome = types.ATTEMPT_OUTCOME_CANCELLED
            elif reason in ("fence", "stop"):
                outcome = types.ATTEMPT_OUTCOME_FAILED
            elif code == 0:
                outcome = types.ATTEMPT_OUTCOME_SUCCESS
            else:
                outcome = types.ATTEMPT_OUTCOME_FAILED
            message = attempt.kill_message
            if not message and outcome == types.ATTEMPT_OUTCOME_FAILED:
                message = f"exited with code {code}" if sig is None else f"killed by signal {sig}"
            passed: Dict[str, str] = {}
            try:
                read = _read_outputs(attempt.output_path)
                if outcome == types.ATTEMPT_OUTCOME_SUCCESS:
                    passed = read
            except OutputsError as error:
                if outcome == types.ATTEMPT_OUTCOME_SUCCESS:
                    outcome = types.ATTEMPT_OUTCOME_FAILED
                    message = f"outputs refused: {error}"
            self._end(attempt, outcome, exit_code, sig, message, passed)

    def _end(
        self,
        attempt: _Attempt,
        outcome: int,
        exit_code: Optional[int],
        sig: Optional[int],
        message: str,
        outputs: Optional[Dict[str, str]] = None,
    ) -> None:
        """Records the attempt's end and sends it after its last lines (lock held)."""
        finished = wpb.AttemptFinished(
            instance_id=attempt.key[0],
            attempt=attempt.key[1],
            outcome=cast(Any, outcome),
            finished_at_ms=_now_ms(),
            log_lines=attempt.next_seq - 1,
            message=message,
            outputs=outputs or {},
        )
        if exit_code is not None:
            finished.exit_code = exit_code
        if sig is not None:
            finished.signal = sig
        attempt.finished = finished
        attempt.finished_mono = time.monotonic()
        if attempt.forgotten:
            self._drop(attempt)
            return
        log.info("attempt %s ended: %s %s", attempt.key, types.AttemptOutcome.Name(outcome), message)
        self._flush(attempt)
        self._send("finished", finished)
        self._wake.notify_all()

    # ------------------------------------------------------------------------------------------
    # Self-fencing and retention.

    def _fence_delay(self) -> Optional[float]:
        if self.self_fence_after is None:
            return None
        delay = self.self_fence_after
        if self._dead_after_ms:
            delay = min(delay, self._dead_after_ms / 1000 * FENCE_FRACTION)
        return delay

    def _fence_base(self) -> float:
        """The moment no node could have heard from us since: the last contact, or later when
        every address of every endpoint has actively refused a connection since (those nodes are
        down, and a node that starts later judges nobody dead before the threshold)."""
        base = self._last_contact
        resolved = [self._resolved.get(e.address) for e in self.endpoints]
        if resolved and all(r for r in resolved):
            oldest = min(self._refused.get(address, 0.0) for r in resolved for address in r or ())
            base = max(base, oldest)
        return base

    def _fence_watch(self) -> None:
        while not self._stopped.is_set():
            delay = self._fence_delay()
            tick = 0.5 if delay is None else min(0.5, delay / 10)
            if self._stopped.wait(tick):
                return
            now = time.monotonic()
            with self._lock:
                for key, at in list(self._remembered.items()):
                    if now - at > self.finished_retention:
                        del self._remembered[key]
                for attempt in list(self._attempts.values()):
                    if attempt.finished is not None and now - attempt.finished_mono > self.finished_retention:
                        log.warning("giving up on the unacknowledged end of %s", attempt.key)
                        self._drop(attempt)
                if delay is None:
                    continue
                silent = now - self._fence_base()
                if silent <= delay:
                    continue
                for attempt in self._attempts.values():
                    if (
                        attempt.running
                        and attempt.pid
                        and not attempt.forgotten
                        and attempt.kill_reason is None
                        and not attempt.dispatch.keep_when_cut_off
                    ):
                        log.warning(
                            "no contact with a scheduler for %.1f s: fencing attempt %s", silent, attempt.key
                        )
                        self._kill(attempt, "fence", f"fenced: no contact with a scheduler for {silent:.1f} s")


# ----------------------------------------------------------------------------------------------
# The command line: `ax-python-worker` / `python -m ax_sdk`.


def _duration(text: str) -> float:
    try:
        return duration.parse(text)
    except duration.DurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _label(text: str) -> Tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"label {text!r} is not key=value")
    return key, value


def _load_module(spec: str) -> Any:
    """Imports a module by name or a .py file by path."""
    import importlib
    import importlib.util

    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise ConfigError(f"--module {spec}: no such file")
        directory = os.path.dirname(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        name = os.path.splitext(os.path.basename(path))[0]
        return importlib.import_module(name)
    return importlib.import_module(spec)


def main(argv: Optional[Sequence[str]] = None) -> int:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="ax-python-worker",
        description="An ax worker in Python: runs shell tasks and the Python task functions of --module.",
    )
    parser.add_argument(
        "--scheduler",
        action="append",
        help="scheduler address (http://host:port or https://host:port); repeat or comma-separate; "
        "env AX_SCHEDULER; default http://127.0.0.1:7070",
    )
    parser.add_argument(
        "--id", help="worker id, stable across restarts and unique among live workers; default: <host name>-<pid>"
    )
    parser.add_argument("--label", action="append", type=_label, default=[], help="key=value; repeatable")
    parser.add_argument("--capacity", type=int, default=20, help="attempts run at once (default 20)")
    parser.add_argument(
        "--module",
        action="append",
        default=[],
        help="a module name or .py file whose ax_sdk.Tasks registries (module attributes) are served; repeatable",
    )
    parser.add_argument("--heartbeat-interval", type=_duration, default=5.0)
    parser.add_argument("--task-heartbeat-interval", type=_duration, default=30.0)
    parser.add_argument("--kill-grace", type=_duration, default=5.0, help="SIGTERM to SIGKILL (default 5s)")
    parser.add_argument("--self-fence-after", default="10s", help='a duration, or "off" (default 10s)')
    parser.add_argument("--token", help="bearer token (env AX_TOKEN)")
    parser.add_argument("--token-file", help="file holding the bearer token (env AX_TOKEN_FILE)")
    parser.add_argument("--tls-ca", help="CA file for https:// addresses (env AX_TLS_CA)")
    parser.add_argument("--tls-cert", help="client certificate (env AX_TLS_CERT)")
    parser.add_argument("--tls-key", help="client certificate's key (env AX_TLS_KEY)")
    parser.add_argument("--log-level", default=env.get("AX_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        fence = None if args.self_fence_after.strip() == "off" else _duration(args.self_fence_after)
        registries: List[functions.Tasks] = []
        for spec in args.module:
            module = _load_module(spec)
            found = [value for value in vars(module).values() if isinstance(value, functions.Tasks)]
            found += [value.tasks for value in vars(module).values() if isinstance(value, Worker)]
            if not found:
                raise ConfigError(f"--module {spec}: it defines no ax_sdk.Tasks registry")
            registries.extend(found)
        token = args.token or (None if args.token_file else env.get("AX_TOKEN") or None)
        token_file = args.token_file or (None if token else env.get("AX_TOKEN_FILE") or None)
        worker = Worker(
            ",".join(args.scheduler or []) or env.get("AX_SCHEDULER") or "http://127.0.0.1:7070",
            args.id,
            labels=dict(args.label),
            capacity=args.capacity,
            tasks=registries,
            token=token,
            token_file=token_file,
            tls_ca=args.tls_ca or env.get("AX_TLS_CA") or None,
            tls_cert=args.tls_cert or env.get("AX_TLS_CERT") or None,
            tls_key=args.tls_key or env.get("AX_TLS_KEY") or None,
            heartbeat_interval=args.heartbeat_interval or 5.0,
            task_heartbeat_interval=args.task_heartbeat_interval or 30.0,
            kill_grace=args.kill_grace,
            self_fence_after=fence,
        )
    except (ConfigError, argparse.ArgumentTypeError, ImportError, ValueError) as error:
        print(f"ax-python-worker: {error}", file=sys.stderr)
        return 2
    log.info(
        "worker %s starting: %s; functions: %s",
        worker.worker_id,
        ", ".join(e.address for e in worker.endpoints),
        ", ".join(worker.tasks.names()) or "none",
    )
    try:
        worker.run()
    except WorkerRefused as error:
        print(f"ax-python-worker: {error}", file=sys.stderr)
        return 3
    return 0
