"""A task function's arguments: the context, and its upstreams' values by name or by `upstream()`.

    @tasks.task("load")
    def load(ctx, extract, rows: int = upstream("count", "rows")):
        ...

- The first parameter gets the `TaskContext` when it is named `ctx` or `context`, is annotated
  `TaskContext`, or is the function's only parameter without an `upstream()` default (the
  convention before upstream arguments existed).
- A parameter with an `upstream(TASK, KEY)` default gets output KEY of direct upstream TASK
  (`KEY` "return" by default: the value TASK's function returned).
- Any other parameter is named after a direct upstream task (`-` and `.` in the task's name as
  `_`) and gets the value that task's function returned.

Values are read from the `AX_UPSTREAM_<TASK>_<KEY>` environment the scheduler sets, and
converted by the parameter's annotation: `str` takes the text as it is, `int`, `float` and
`bool` parse it, anything else (or no annotation) reads it as JSON (text that is not JSON stays
text). A missing value or one that does not convert fails the attempt before the function
runs, naming the parameter, the task and the key.
"""

from __future__ import annotations

import inspect
import json
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Tuple

from ax_sdk.outputs import env_name


class ArgumentError(ValueError):
    """A parameter of a task function cannot be given a value."""


@dataclass(frozen=True)
class Upstream:
    """Where a parameter's value comes from: output `key` of direct upstream `task`."""

    task: str
    key: str = "return"


def upstream(task: str, key: str = "return") -> Any:
    """A parameter's default that reads output `key` of direct upstream `task`."""
    return Upstream(task, key)


_CONTEXT_NAMES = ("ctx", "context")


def bind(function: Callable[..., Any], context: Any, environ: Mapping[str, str]) -> Tuple[List[Any], Dict[str, Any]]:
    """The positional and keyword arguments to call `function` with."""
    from ax_sdk.functions import TaskContext

    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        # A builtin or C function: the context, as before.
        return [context], {}
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that does not resolve is no conversion
        hints = {}
    plain = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    args: List[Any] = []
    kwargs: Dict[str, Any] = {}
    for i, parameter in enumerate(plain):
        default = parameter.default
        if i == 0 and not isinstance(default, Upstream) and (
            parameter.name in _CONTEXT_NAMES
            or hints.get(parameter.name) is TaskContext
            or len([p for p in plain if not isinstance(p.default, Upstream)]) == 1
        ):
            value: Any = context
        elif isinstance(default, Upstream):
            value = _read(parameter.name, default, hints.get(parameter.name), environ)
        elif default is not inspect.Parameter.empty and env_name(parameter.name, "return") not in environ:
            # An optional parameter with nothing upstream keeps its default.
            continue
        else:
            value = _read(parameter.name, Upstream(parameter.name), hints.get(parameter.name), environ)
        if parameter.kind == parameter.KEYWORD_ONLY:
            kwargs[parameter.name] = value
        else:
            args.append(value)
    return args, kwargs


def _read(name: str, source: Upstream, annotation: Any, environ: Mapping[str, str]) -> Any:
    text = environ.get(env_name(source.task, source.key))
    what = f"parameter {name}: output {source.key} of task {source.task}"
    if text is None:
        raise ArgumentError(
            f"{what} was not passed on (is {source.task} a direct upstream, and did it "
            f"{'return a value' if source.key == 'return' else 'write ' + source.key}?)"
        )
    try:
        return _convert(text, annotation)
    except (TypeError, ValueError) as error:
        shown = text if len(text) <= 60 else text[:59] + "…"
        raise ArgumentError(f"{what} is {shown!r}, not {_type_name(annotation)}: {error}") from None


def _convert(text: str, annotation: Any) -> Any:
    if annotation is str:
        return text
    if annotation is int:
        return int(text)
    if annotation is float:
        return float(text)
    if annotation is bool:
        value = json.loads(text)
        if not isinstance(value, bool):
            raise ValueError("expected true or false")
        return value
    try:
        return json.loads(text)
    except ValueError:
        if annotation is None or annotation is Any:
            return text
        raise


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation)
