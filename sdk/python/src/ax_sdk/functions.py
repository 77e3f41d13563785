"""Python functions as tasks: the registry, the workflow convention and what a function gets.

A workflow task selects a registered function by its command, with no change to the scheduler:

    command: ax-python NAME [ARG ...]        # words split as a shell would (shlex)
    argv: [ax-python, NAME, ARG, ...]        # or the argv form

A Python worker that has NAME registered runs the function; on any other worker the command
fails to start (`ax-python: not found`), so route such tasks to Python workers with a label
(`labels: {sdk: python}` on the task, `--label sdk=python` on the worker).

The function runs in a child process of its own (a fresh interpreter that imports the
function's module), in a process group of its own like a shell task, so a cancel or a timeout
kills it and whatever it started; what it prints on stdout and stderr are the attempt's log
lines. An `async def` function runs in an event loop of its own (`asyncio.run`).

What it takes (`arguments.bind`): the `TaskContext` (params, env, args, ids, its upstreams'
outputs), the run's params and its upstreams' return values, by name or by `param()` /
`upstream()`, each converted to the parameter's annotation (`convert`).

How it ends: returning None succeeds with no outputs; returning anything else succeeds and
the value becomes its outputs (`outputs.from_return`: the output `return` as JSON, and a
dict's keys each as an output too), which the tasks below it take as arguments; an exception
prints its traceback to stderr and fails the attempt (exit code 1); `sys.exit(n)` exits with n.
A cancel or a timeout raises `Cancelled` in the function (once), so its `finally` blocks run;
an async function's task is cancelled instead (`asyncio.CancelledError`, which `Cancelled`
extends). The process then ends by SIGTERM.

Functions must be importable by their module and qualified name, as with multiprocessing's
spawn: defined at the top level of a module (or of the worker's main script, which the child
loads under another name, so its `if __name__ == "__main__":` block does not run again).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, ParamSpec, Sequence, Tuple, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# The first word of a command (or argv[0]) that selects a registered function.
COMMAND = "ax-python"

# The environment variable the child runner reads its function from (JSON).
SPEC_ENV = "AX_SDK_FUNCTION"


class Cancelled(asyncio.CancelledError):
    """Raised in a task function when its attempt is cancelled or timed out (SIGTERM): a
    BaseException, so `except Exception` does not swallow it and `finally` blocks run. Catch it
    only to clean up, then let it go on: the attempt ends cancelled whatever the function does."""


@dataclass(frozen=True)
class TaskContext:
    """What a task function is told about its attempt."""

    args: Tuple[str, ...]
    params: Mapping[str, str]
    env: Mapping[str, str]
    run_id: int
    instance_id: int
    attempt: int
    workflow: str
    task: str
    logical_time: str
    shard_index: Optional[int] = None
    shard_total: Optional[int] = None

    @overload
    def param(self, name: str) -> str: ...
    @overload
    def param(self, name: str, as_type: "type[T]") -> T: ...
    @overload
    def param(self, name: str, as_type: "type[T]", default: T) -> T: ...

    def param(self, name: str, as_type: Any = str, default: Any = ...) -> Any:
        """The run's param `name` converted to `as_type` (`convert.from_text`); `default` when
        the run has none (without one, a KeyError names the param)."""
        from ax_sdk.convert import ConversionError, from_text, type_name

        text = self.params.get(name)
        if text is None:
            if default is ...:
                raise KeyError(f"the run has no param {name}")
            return default
        try:
            return from_text(text, as_type)
        except ConversionError as error:
            raise ValueError(f"param {name} is {text!r}, not {type_name(as_type)}: {error}") from None

    def output(self, task: str, key: str, default: Optional[str] = None) -> Optional[str]:
        """The output `key` a direct upstream `task` passed on, as text (`default` when it
        passed on none)."""
        from ax_sdk.outputs import env_name

        return self.env.get(env_name(task, key), default)

    def output_json(self, task: str, key: str = "return") -> Any:
        """An upstream's output read back as JSON: what its function returned (`key`
        "return"), or one key of the dict it returned."""
        text = self.output(task, key)
        if text is None:
            raise KeyError(f"task {task} passed on no output {key}")
        return json.loads(text)

    @staticmethod
    def from_environ(args: Sequence[str], environ: Mapping[str, str]) -> "TaskContext":
        def number(name: str) -> int:
            try:
                return int(environ.get(name, "0"))
            except ValueError:
                return 0

        shard_total = environ.get("AX_SHARD_TOTAL")
        return TaskContext(
            args=tuple(args),
            params={k[len("AX_PARAM_"):]: v for k, v in environ.items() if k.startswith("AX_PARAM_")},
            env=dict(environ),
            run_id=number("AX_RUN_ID"),
            instance_id=number("AX_INSTANCE_ID"),
            attempt=number("AX_ATTEMPT"),
            workflow=environ.get("AX_WORKFLOW", ""),
            task=environ.get("AX_TASK", ""),
            logical_time=environ.get("AX_LOGICAL_TIME", ""),
            shard_index=number("AX_SHARD_INDEX") if shard_total else None,
            shard_total=number("AX_SHARD_TOTAL") if shard_total else None,
        )


@dataclass(frozen=True)
class FunctionRef:
    """Where the child finds a registered function."""

    name: str
    module: str
    qualname: str
    # The module's file when it is the main script (it cannot be imported by name then).
    file: Optional[str]


class Tasks:
    """A registry of task functions: `@tasks.task("name")`. A `Worker` has one of its own and
    takes more with `Worker(..., tasks=[...])`."""

    def __init__(self) -> None:
        self._functions: Dict[str, FunctionRef] = {}

    @overload
    def task(self, name: Callable[P, R]) -> Callable[P, R]: ...
    @overload
    def task(self, name: Optional[str] = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def task(self, name: Any = None) -> Any:
        """Registers the decorated function under `name` (its own name by default) and returns
        it unchanged, signature and all: `@tasks.task` or `@tasks.task("name")`."""
        if callable(name):
            self.add(name)
            return name

        def register(function: Callable[P, R]) -> Callable[P, R]:
            self.add(function, name)
            return function

        return register

    def add(self, function: Callable[..., Any], name: Optional[str] = None) -> None:
        name = name or function.__name__
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"task function name {name!r} must be non-empty and without whitespace")
        qualname = getattr(function, "__qualname__", "")
        module = getattr(function, "__module__", None)
        if not module or "<locals>" in qualname or "<lambda>" in qualname:
            raise ValueError(
                f"task function {name!r} ({qualname or function!r}) must be defined at the top level "
                "of a module: the child process imports it by module and name"
            )
        file = None
        if module == "__main__":
            file = getattr(sys.modules.get("__main__"), "__file__", None)
            if file is None:
                raise ValueError(f"task function {name!r} is defined in an interactive session; put it in a module")
            file = os.path.abspath(file)
        existing = self._functions.get(name)
        ref = FunctionRef(name=name, module=module, qualname=qualname, file=file)
        if existing is not None and existing != ref:
            raise ValueError(f"task function name {name!r} is already registered for {existing.module}.{existing.qualname}")
        self._functions[name] = ref
        try:
            setattr(function, _NAME_ATTRIBUTE, name)
        except (AttributeError, TypeError):  # a builtin takes no attributes; the builder asks for a name
            pass

    def get(self, name: str) -> Optional[FunctionRef]:
        return self._functions.get(name)

    def names(self) -> List[str]:
        return sorted(self._functions)

    def merge(self, other: "Tasks") -> None:
        for ref in other._functions.values():
            existing = self._functions.get(ref.name)
            if existing is not None and existing != ref:
                raise ValueError(f"task function name {ref.name!r} is registered twice")
            self._functions[ref.name] = ref


# Where a registered function keeps the name it is registered under, for the workflow builder.
_NAME_ATTRIBUTE = "__ax_task_name__"


def registered_name(function: Callable[..., Any]) -> Optional[str]:
    """The name `function` is registered under as a task function, or None."""
    name = getattr(function, _NAME_ATTRIBUTE, None)
    return name if isinstance(name, str) else None


def function_call(command: str, argv: Sequence[str]) -> Optional[Tuple[str, List[str]]]:
    """(name, args) when a dispatch selects a Python function, else None. Raises ValueError for a
    selection without a name or with unbalanced quotes."""
    if argv:
        if argv[0] != COMMAND:
            return None
        words = list(argv)
    else:
        stripped = command.strip()
        if stripped != COMMAND and not stripped.startswith(COMMAND + " ") and not stripped.startswith(COMMAND + "\t"):
            return None
        try:
            words = shlex.split(stripped)
        except ValueError as error:
            raise ValueError(f"cannot split the command {command!r}: {error}") from None
    if len(words) < 2:
        raise ValueError(f"{COMMAND} needs a function name: {COMMAND} NAME [ARG ...]")
    return words[1], words[2:]


def child_spec(ref: FunctionRef, args: Sequence[str]) -> Dict[str, object]:
    """The JSON the child runner gets: the function and the parent's import path."""
    return {
        "name": ref.name,
        "module": ref.module,
        "qualname": ref.qualname,
        "file": ref.file,
        "args": list(args),
        "sys_path": [p if p else os.getcwd() for p in sys.path],
    }
