"""The ax Python SDK: a control-API client and a worker, both built from ax's gRPC contract.

    from ax_sdk import Client, Worker

The generated messages are `ax_sdk.pb.control`, `ax_sdk.pb.worker` and `ax_sdk.pb.types`.
"""

from . import pb
from .arguments import upstream
from .client import AxError, Client
from .connection import ConfigError, Credentials
from .functions import TaskContext, Tasks
from .version import __version__
from .worker import Worker

__all__ = ["__version__", "AxError", "Client", "ConfigError", "Credentials", "TaskContext", "Tasks", "Worker", "pb", "upstream"]
