"""Runs, instances and attempts as the clients return them, and a workflow's declared params:
typed, with states as enums and times as aware datetimes. Each keeps the message it was made
from as `pb`, for the fields this view leaves out.

    run = client.wait(run_id)
    if run.state is RunState.FAILED:
        for instance in client.instances(run.id):
            print(instance.task, instance.state, instance.attempts[-1].exit_code)

The enums' values are the protocol's (`ax.v1.RunState` and `ax.v1.InstanceState`), so a
state compares equal to the generated constant; `str()` gives the name (`"SUCCESS"`).
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ._pb import control_pb2 as control


class RunState(enum.IntEnum):
    UNSPECIFIED = 0
    RUNNING = 1
    SUCCESS = 2
    FAILED = 3
    CANCELLED = 4
    QUEUED = 5

    def __str__(self) -> str:
        return self.name

    @property
    def ended(self) -> bool:
        """SUCCESS, FAILED or CANCELLED: the run will not change state again by itself."""
        return self in (RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED)


class InstanceState(enum.IntEnum):
    UNSPECIFIED = 0
    WAITING = 1
    DISPATCHED = 2
    RUNNING = 3
    SUCCESS = 4
    FAILED = 5
    TIMEOUT = 6
    CANCELLED = 7
    PENDING = 8
    SKIPPED = 9
    UPSTREAM_FAILED = 10

    def __str__(self) -> str:
        return self.name

    @property
    def ended(self) -> bool:
        return self in _ENDED_INSTANCE_STATES


_ENDED_INSTANCE_STATES = frozenset(
    {
        InstanceState.SUCCESS,
        InstanceState.FAILED,
        InstanceState.TIMEOUT,
        InstanceState.CANCELLED,
        InstanceState.SKIPPED,
        InstanceState.UPSTREAM_FAILED,
    }
)


class Trigger(enum.IntEnum):
    """What started a run."""

    UNSPECIFIED = 0
    CRON = 1
    MANUAL = 2
    API = 3
    DEPENDENCY = 4
    BACKFILL = 5
    PARENT = 6

    def __str__(self) -> str:
        return self.name


def _time(ms: int) -> Optional[datetime.datetime]:
    """A protocol time (ms since the epoch, 0 for none) as an aware UTC datetime."""
    if ms == 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000.0, tz=datetime.timezone.utc)


def _run_state(value: int) -> RunState:
    try:
        return RunState(value)
    except ValueError:  # a state added by a newer scheduler
        return RunState.UNSPECIFIED


def _instance_state(value: int) -> InstanceState:
    try:
        return InstanceState(value)
    except ValueError:
        return InstanceState.UNSPECIFIED


@dataclass(frozen=True)
class Run:
    id: int
    workflow: str
    workflow_version: int
    state: RunState
    trigger: Trigger
    logical_time: Optional[datetime.datetime]
    idempotency_key: str
    params: Dict[str, str]
    triggered_by: str
    created_at: Optional[datetime.datetime]
    finished_at: Optional[datetime.datetime]
    # The run's instances by state (`waiting`, `running`, `success`, `failed`, ...; the fields of
    # `ax.v1.InstanceCounts`).
    counts: Dict[str, int]
    parent_run_id: int
    child_run_ids: Tuple[int, ...]
    pb: control.Run

    @staticmethod
    def from_pb(message: control.Run) -> "Run":
        counts = {field.name: int(getattr(message.counts, field.name)) for field in message.counts.DESCRIPTOR.fields}
        return Run(
            id=message.id,
            workflow=message.workflow,
            workflow_version=message.workflow_version,
            state=_run_state(message.state),
            trigger=Trigger(message.trigger) if message.trigger in Trigger._value2member_map_ else Trigger.UNSPECIFIED,
            logical_time=_time(message.logical_time_ms),
            idempotency_key=message.idempotency_key,
            params=dict(message.params),
            triggered_by=message.triggered_by,
            created_at=_time(message.created_at_ms),
            finished_at=_time(message.finished_at_ms),
            counts=counts,
            parent_run_id=message.parent_run_id,
            child_run_ids=tuple(message.child_run_ids),
            pb=message,
        )


@dataclass(frozen=True)
class Attempt:
    attempt: int
    state: InstanceState
    worker_id: str
    dispatched_at: Optional[datetime.datetime]
    started_at: Optional[datetime.datetime]
    finished_at: Optional[datetime.datetime]
    exit_code: Optional[int]
    signal: Optional[int]
    log_lines: int
    message: str
    outputs: Dict[str, str]
    pb: control.Attempt

    @property
    def process_may_run(self) -> bool:
        """The scheduler ended the attempt (cancel, timeout) after its process started, and
        no end of the process was reported yet."""
        return (
            self.state in (InstanceState.CANCELLED, InstanceState.TIMEOUT)
            and self.started_at is not None
            and self.exit_code is None
            and self.signal is None
        )

    @staticmethod
    def from_pb(message: control.Attempt) -> "Attempt":
        return Attempt(
            attempt=message.attempt,
            state=_instance_state(message.state),
            worker_id=message.worker_id,
            dispatched_at=_time(message.dispatched_at_ms),
            started_at=_time(message.started_at_ms),
            finished_at=_time(message.finished_at_ms),
            exit_code=message.exit_code if message.HasField("exit_code") else None,
            signal=message.signal if message.HasField("signal") else None,
            log_lines=message.log_lines,
            message=message.message,
            outputs=dict(message.outputs),
            pb=message,
        )


@dataclass(frozen=True)
class Instance:
    id: int
    run_id: int
    workflow: str
    task: str
    state: InstanceState
    attempt: int
    worker_id: str
    created_at: Optional[datetime.datetime]
    started_at: Optional[datetime.datetime]
    finished_at: Optional[datetime.datetime]
    exit_code: Optional[int]
    # Each attempt, oldest first (empty where the call does not list them).
    attempts: List[Attempt]
    # For an item of a for_each task: its element.
    item: Optional[str]
    pb: control.Instance

    @property
    def outputs(self) -> Dict[str, str]:
        """What the latest attempt passed on."""
        return self.attempts[-1].outputs if self.attempts else {}

    @staticmethod
    def from_pb(message: control.Instance) -> "Instance":
        return Instance(
            id=message.id,
            run_id=message.run_id,
            workflow=message.workflow,
            task=message.task,
            state=_instance_state(message.state),
            attempt=message.attempt,
            worker_id=message.worker_id,
            created_at=_time(message.created_at_ms),
            started_at=_time(message.started_at_ms),
            finished_at=_time(message.finished_at_ms),
            exit_code=message.exit_code if message.HasField("exit_code") else None,
            attempts=[Attempt.from_pb(a) for a in message.attempts],
            item=message.item if message.HasField("item") else None,
            pb=message,
        )


@dataclass(frozen=True)
class WorkflowParam:
    """A param the workflow declares (`params:` in its file, docs/workflow-format.md): a trigger
    that leaves it out gets `default`, a `required` one must be given (not empty), one with
    `choices` takes only those. `default` is None when the param has none (an empty string is a
    default)."""

    name: str
    description: str
    default: Optional[str]
    required: bool
    choices: Tuple[str, ...]
    pb: control.WorkflowParam

    @staticmethod
    def from_pb(message: control.WorkflowParam) -> "WorkflowParam":
        return WorkflowParam(
            name=message.name,
            description=message.description,
            default=message.default_value if message.has_default else None,
            required=message.required,
            choices=tuple(message.choices),
            pb=message,
        )

    @staticmethod
    def of(workflow: control.Workflow) -> List["WorkflowParam"]:
        """The params a workflow (as `get_workflow` returns it) declares, in file order."""
        return [WorkflowParam.from_pb(p) for p in workflow.params]


@dataclass(frozen=True)
class Triggered:
    """What a trigger returned: the run, and whether this call created it (False: an earlier
    call with the same idempotency key did)."""

    run: Run
    created: bool

    @property
    def run_id(self) -> int:
        return self.run.id
