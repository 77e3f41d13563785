"""Workflows defined in Python: a builder that writes the workflow file and that a client applies.

    from ax_sdk import Tasks, Workflow

    tasks = Tasks()

    @tasks.task
    def extract(day: datetime.date) -> list[Row]: ...

    @tasks.task
    def load(extract: list[Row]) -> int: ...

    etl = Workflow("etl", schedule={"cron": "0 2 * * *", "timezone": "Europe/Paris"})
    etl.python(extract, labels={"sdk": "python"})
    etl.python(load, labels={"sdk": "python"})           # upstream: extract, from its parameter
    etl.shell("report", "echo loaded ${tasks.load.outputs.return} rows", upstream="load")

    client.apply(etl)                                     # or: print(etl.to_yaml())

A Python task's command is `ax-python NAME` for the name its function was registered under,
so a task's name and its function's are written once. Its upstreams are those given with
`upstream=`, plus the tasks of the workflow its parameters are named after (a parameter
`extract` reads what task `extract` returned) or read with `upstream("task", "key")`; a
parameter naming no task of the workflow is a param of the run. A task or upstream named
twice, or an upstream that is not a task of the workflow, is refused as it is added.

`to_yaml()` writes the file in the format of docs/workflow-format.md (every string quoted);
the scheduler checks the rest when it is applied (`client.apply(workflow, dry_run=True)` checks
without storing).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Union

from .arguments import Param, Upstream
from .functions import COMMAND, registered_name

TriggerRule = Literal["all_success", "all_done", "one_failed", "one_success", "none_failed", "always"]
Routing = Literal[
    "default", "least_running", "round_robin", "random", "consistent_hash", "failover", "sharded_broadcast"
]


class Task:
    """A task of a `Workflow`; `name` is what other tasks give as their upstream."""

    def __init__(self, name: str, fields: Dict[str, Any]):
        self.name = name
        self.fields = fields

    def __repr__(self) -> str:
        return f"Task({self.name!r})"


class Workflow:
    """A workflow file built in Python. Keyword arguments are the file's top-level fields
    (`schedule`, `concurrency`, `defaults`, `deadline`, ... as mappings and strings, as in
    the file); `tasks`, `on_failure` and `on_success` are added with the methods."""

    def __init__(
        self,
        name: str,
        *,
        app: Optional[str] = None,
        description: Optional[str] = None,
        owner: Optional[str] = None,
        schedule: Optional[Mapping[str, Any]] = None,
        concurrency: Optional[Mapping[str, Any]] = None,
        defaults: Optional[Mapping[str, Any]] = None,
        retention: Optional[str] = None,
        deadline: Optional[str] = None,
        on_deadline: Optional[Literal["alert", "cancel"]] = None,
    ):
        self.name = name
        self.top: Dict[str, Any] = {
            key: value
            for key, value in (
                ("app", app),
                ("description", description),
                ("owner", owner),
                ("schedule", schedule),
                ("concurrency", concurrency),
                ("defaults", defaults),
                ("retention", retention),
                ("deadline", deadline),
                ("on_deadline", on_deadline),
            )
            if value is not None
        }
        self.tasks: List[Task] = []
        self.handlers: Dict[str, List[Task]] = {"on_failure": [], "on_success": []}

    # ------------------------------------------------------------------------------------------
    # Tasks.

    def shell(
        self,
        name: str,
        command: Union[str, Sequence[str]],
        *,
        upstream: Union[None, str, Task, Sequence[Union[str, Task]]] = None,
        handler: Optional[Literal["on_failure", "on_success"]] = None,
        **options: Any,
    ) -> Task:
        """A task running `command`: a shell command line, or a list of words run without a
        shell (`argv`). `options` are the task's other fields (see `python`)."""
        fields: Dict[str, Any] = {}
        if isinstance(command, str):
            fields["command"] = command
        else:
            fields["argv"] = list(command)
        return self._add(name, fields, _names(upstream), handler, options)

    def python(
        self,
        function: Callable[..., Any],
        *,
        name: Optional[str] = None,
        args: Sequence[str] = (),
        upstream: Union[None, str, Task, Sequence[Union[str, Task]]] = None,
        handler: Optional[Literal["on_failure", "on_success"]] = None,
        timeout: Optional[str] = None,
        retries: Optional[int] = None,
        retry_backoff: Optional[str] = None,
        env: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        priority: Optional[int] = None,
        trigger_rule: Optional[TriggerRule] = None,
        condition: Optional[str] = None,
        for_each: Union[None, str, Sequence[Any]] = None,
        concurrency: Optional[int] = None,
        pool: Optional[str] = None,
        routing: Optional[Routing] = None,
        **options: Any,
    ) -> Task:
        """A task running `function` on a Python worker that serves it: the function must be
        registered (`@tasks.task`); the task is named after it unless `name` says otherwise.
        `condition` is the task's `if:`. `args` reach the function as `ctx.args`. Other
        fields of the file go in `options` by their names (`survive_worker_restart=True`)."""
        function_name = registered_name(function)
        if function_name is None:
            raise ValueError(
                f"{getattr(function, '__qualname__', function)!r} is not a registered task function: "
                "register it with @tasks.task first"
            )
        fields: Dict[str, Any] = {"argv": [COMMAND, function_name, *args]}
        named = {
            "timeout": timeout,
            "retries": retries,
            "retry_backoff": retry_backoff,
            "env": env,
            "labels": labels,
            "priority": priority,
            "trigger_rule": trigger_rule,
            "if": condition,
            "for_each": for_each,
            "concurrency": concurrency,
            "pool": pool,
            "routing": routing,
        }
        options = {**{k: v for k, v in named.items() if v is not None}, **options}
        task_name = name or function_name
        upstreams = _names(upstream) + [u for u in self._upstreams_of(function) if u != task_name]
        return self._add(task_name, fields, upstreams, handler, options)

    def _upstreams_of(self, function: Callable[..., Any]) -> List[str]:
        """The tasks a function's parameters read: by `upstream()`, or by a parameter named
        after a task already in the workflow (`-` and `.` as `_`)."""
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):
            return []
        by_parameter_name = {_parameter_name(t.name): t.name for t in self.tasks}
        found = []
        for parameter in parameters:
            default = parameter.default
            if isinstance(default, Upstream):
                found.append(default.task)
            elif isinstance(default, Param):
                continue
            elif parameter.name in by_parameter_name:
                found.append(by_parameter_name[parameter.name])
        return found

    def _add(
        self,
        name: str,
        fields: Dict[str, Any],
        upstreams: List[str],
        handler: Optional[str],
        options: Mapping[str, Any],
    ) -> Task:
        known = {t.name for t in self.tasks} | {t.name for ts in self.handlers.values() for t in ts}
        if name in known:
            raise ValueError(f"workflow {self.name}: task {name} is added twice")
        unique: List[str] = []
        for upstream in upstreams:
            if upstream not in unique:
                unique.append(upstream)
        for upstream in unique:
            if upstream not in {t.name for t in self.tasks}:
                raise ValueError(
                    f"workflow {self.name}: task {name}'s upstream {upstream} is not a task added before it"
                )
        for key in ("name", "command", "argv", "upstream"):
            if key in options:
                raise ValueError(f"workflow {self.name}: task {name}: give {key} as an argument, not an option")
        body: Dict[str, Any] = {"name": name, **fields}
        if unique:
            body["upstream"] = unique if len(unique) > 1 else unique[0]
        body.update(options)
        task = Task(name, body)
        if handler is None:
            self.tasks.append(task)
        elif handler in self.handlers:
            if unique:
                raise ValueError(f"workflow {self.name}: handler {name} cannot have upstreams")
            self.handlers[handler].append(task)
        else:
            raise ValueError(f"handler must be on_failure or on_success, not {handler!r}")
        return task

    # ------------------------------------------------------------------------------------------
    # The file.

    def to_dict(self) -> Dict[str, Any]:
        if not self.tasks:
            raise ValueError(f"workflow {self.name} has no tasks")
        document: Dict[str, Any] = {"name": self.name, **self.top, "tasks": [t.fields for t in self.tasks]}
        for key, handlers in self.handlers.items():
            if handlers:
                document[key] = [t.fields for t in handlers]
        return document

    def to_yaml(self) -> str:
        """The workflow file's text."""
        return _yaml(self.to_dict(), 0) + "\n"


def _names(upstream: Union[None, str, Task, Sequence[Union[str, Task]]]) -> List[str]:
    if upstream is None:
        return []
    if isinstance(upstream, (str, Task)):
        upstream = [upstream]
    return [u.name if isinstance(u, Task) else u for u in upstream]


def _parameter_name(task: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in task)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        # A JSON string is a YAML double-quoted scalar: nothing in it is read as YAML.
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"a {type(value).__name__} cannot be written in a workflow file")


def _yaml(value: Any, indent: int) -> str:
    pad = " " * indent
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        lines = []
        for key, item in value.items():
            label = f"{pad}{_scalar(str(key)) if not _plain_key(str(key)) else key}:"
            if isinstance(item, (Mapping, list, tuple)) and item:
                lines.append(f"{label}\n{_yaml(item, indent + 2)}")
            else:
                lines.append(f"{label} {_yaml(item, 0) if isinstance(item, (Mapping, list, tuple)) else _scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        lines = []
        for item in value:
            if isinstance(item, Mapping) and item:
                body = _yaml(item, indent + 2)
                lines.append(f"{pad}- {body[indent + 2:]}")
            elif isinstance(item, (list, tuple)) and item:
                lines.append(f"{pad}-\n{_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}- {_yaml(item, 0) if isinstance(item, (Mapping, list, tuple)) else _scalar(item)}")
        return "\n".join(lines)
    return pad + _scalar(value)


# Plain keys a YAML parser reads as something else than a string.
_NOT_STRINGS = {"null", "nul", "~", "true", "false", "yes", "no", "on", "off", "y", "n"}


def _plain_key(key: str) -> bool:
    """Whether a key can be written unquoted: a name (letters, digits, `_`, `-`, starting with a
    letter or `_`) that YAML does not read as null or a boolean."""
    return (
        bool(key)
        and (key[0].isalpha() or key[0] == "_")
        and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
        and key.lower() not in _NOT_STRINGS
    )
