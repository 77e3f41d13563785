"""The ax Python SDK: a control-API client (blocking and asyncio), a worker that runs Python
functions as tasks, and a workflow builder, all built from ax's gRPC contract.

    from ax_sdk import Client, Worker, Workflow

The generated messages are `ax_sdk.pb.control`, `ax_sdk.pb.worker` and `ax_sdk.pb.types`.
"""

from . import pb
from .aio import AsyncClient
from .arguments import ArgumentError, param, upstream
from .client import AxError, Client
from .connection import ConfigError, Credentials
from .functions import Cancelled, TaskContext, Tasks
from .runs import Attempt, Instance, InstanceState, Run, RunState, Trigger, Triggered, WorkflowParam
from .version import __version__
from .worker import Worker, WorkerRefused
from .workflow import Task, Workflow

__all__ = [
    "__version__",
    "ArgumentError",
    "AsyncClient",
    "Attempt",
    "AxError",
    "Cancelled",
    "Client",
    "ConfigError",
    "Credentials",
    "Instance",
    "InstanceState",
    "Run",
    "RunState",
    "Task",
    "TaskContext",
    "Tasks",
    "Trigger",
    "Triggered",
    "Worker",
    "WorkerRefused",
    "Workflow",
    "WorkflowParam",
    "param",
    "pb",
    "upstream",
]
