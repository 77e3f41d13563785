"""A task function's arguments: the context, the run's params and its upstreams' values.

    @tasks.task("load")
    def load(ctx: TaskContext, extract: list[Row], day: datetime.date,
             rows: int = upstream("count", "rows"), region: str = param("region", "eu")) -> Report:
        ...

- The first parameter gets the `TaskContext` when it is named `ctx` or `context`, is annotated
  `TaskContext`, or is the function's only parameter, unannotated, and named after no param
  or upstream (the convention before typed arguments existed).
- A parameter with an `upstream(TASK, KEY)` default gets output KEY of direct upstream TASK
  (`KEY` "return" by default: the value TASK's function returned).
- A parameter with a `param(NAME, default)` default gets the run's param NAME.
- Any other parameter gets the value of the direct upstream task it is named after (`-` and
  `.` in the task's name as `_`) when that task passed one on, else the run's param of its
  name, else its own default.

Values are read from the environment the scheduler sets (`AX_UPSTREAM_<TASK>_<KEY>`,
`AX_PARAM_<name>`) and converted by the parameter's annotation (`convert.from_text`: JSON
into ints, bools, lists, dicts, enums, dataclasses, pydantic models, ...). A missing value or
one that does not convert fails the attempt before the function runs, naming the parameter,
where its value comes from and what was wrong.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Tuple

from ax_sdk.convert import ConversionError, from_text, type_name
from ax_sdk.outputs import env_name


class ArgumentError(ValueError):
    """A parameter of a task function cannot be given a value."""


@dataclass(frozen=True)
class Upstream:
    """Where a parameter's value comes from: output `key` of direct upstream `task`."""

    task: str
    key: str = "return"


_NO_DEFAULT: Any = object()


@dataclass(frozen=True)
class Param:
    """Where a parameter's value comes from: the run's param `name` (`default` without it)."""

    name: str
    default: Any = _NO_DEFAULT


def upstream(task: str, key: str = "return") -> Any:
    """A parameter's default that reads output `key` of direct upstream `task`."""
    return Upstream(task, key)


def param(name: str, default: Any = _NO_DEFAULT) -> Any:
    """A parameter's default that reads the run's param `name`, or `default` when the run has
    none (without `default`, a run without it fails the attempt)."""
    return Param(name, default)


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
    except Exception:  # one annotation that does not resolve: each is resolved on its own below
        hints = None
    plain = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    args: List[Any] = []
    kwargs: Dict[str, Any] = {}
    # Once an optional parameter keeps its default, the ones after it go by keyword, so no
    # value lands in the wrong place.
    skipped = False
    for i, parameter in enumerate(plain):
        default = parameter.default
        name = parameter.name
        annotation = hints.get(name) if hints is not None else _annotation(function, parameter)
        if i == 0 and _takes_context(parameter, annotation, plain, environ, TaskContext):
            value: Any = context
        elif isinstance(default, Upstream):
            value = _read_upstream(name, default, annotation, environ)
        elif isinstance(default, Param):
            found = _read_param(name, default.name, annotation, environ)
            if found is _NO_DEFAULT:
                if default.default is _NO_DEFAULT:
                    raise ArgumentError(f"parameter {name}: the run has no param {default.name}")
                found = default.default
            value = found
        elif env_name(name, "return") in environ:
            value = _read_upstream(name, Upstream(name), annotation, environ)
        elif param_env_name(name) in environ:
            value = _read_param(name, name, annotation, environ)
        elif default is not inspect.Parameter.empty:
            # An optional parameter with nothing upstream and no param keeps its default.
            skipped = True
            continue
        else:
            raise ArgumentError(
                f"parameter {name}: no direct upstream task {name} passed on a value and the run "
                f"has no param {name} (name an upstream task or a param, or read another with "
                f"upstream(TASK, KEY) or param(NAME))"
            )
        if parameter.kind == parameter.KEYWORD_ONLY or (skipped and parameter.kind == parameter.POSITIONAL_OR_KEYWORD):
            kwargs[name] = value
        elif skipped:
            raise ArgumentError(
                f"parameter {name} is positional-only and follows an optional parameter that keeps "
                "its default: it cannot be given a value"
            )
        else:
            args.append(value)
    return args, kwargs


@dataclass(frozen=True)
class _Unresolved:
    """An annotation that does not resolve at run time; converting to it is an error."""

    text: str
    error: str


def _annotation(function: Callable[..., Any], parameter: inspect.Parameter) -> Any:
    """A parameter's annotation, resolved on its own (another one of the function's did not)."""
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return None
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, getattr(function, "__globals__", {}))  # the function's own text
    except Exception as error:
        return _Unresolved(annotation, f"{type(error).__name__}: {error}")


def param_env_name(name: str) -> str:
    """`AX_PARAM_<name>`, the param's name as the trigger gave it."""
    return f"AX_PARAM_{name}"


def _takes_context(parameter: Any, annotation: Any, plain: List[Any], environ: Mapping[str, str], context_type: Any) -> bool:
    if isinstance(parameter.default, (Upstream, Param)):
        return False
    if parameter.name in _CONTEXT_NAMES or annotation is context_type:
        return True
    if isinstance(annotation, _Unresolved) and annotation.text.rsplit(".", 1)[-1] == "TaskContext":
        return True
    unmarked = [p for p in plain if not isinstance(p.default, (Upstream, Param))]
    return (
        len(unmarked) == 1
        and parameter.annotation is inspect.Parameter.empty
        and env_name(parameter.name, "return") not in environ
        and param_env_name(parameter.name) not in environ
    )


def _read_upstream(name: str, source: Upstream, annotation: Any, environ: Mapping[str, str]) -> Any:
    text = environ.get(env_name(source.task, source.key))
    what = f"parameter {name}: output {source.key} of task {source.task}"
    if text is None:
        raise ArgumentError(
            f"{what} was not passed on (is {source.task} a direct upstream, and did it "
            f"{'return a value' if source.key == 'return' else 'write ' + source.key}?)"
        )
    return _convert(what, text, annotation)


def _read_param(name: str, param_name: str, annotation: Any, environ: Mapping[str, str]) -> Any:
    text = environ.get(param_env_name(param_name))
    if text is None:
        return _NO_DEFAULT
    return _convert(f"parameter {name}: param {param_name}", text, annotation)


def _convert(what: str, text: str, annotation: Any) -> Any:
    if isinstance(annotation, _Unresolved):
        raise ArgumentError(
            f"{what}: the annotation {annotation.text!r} does not resolve in the function's module "
            f"({annotation.error}); import what it names at run time, not only under TYPE_CHECKING"
        )
    try:
        return from_text(text, annotation)
    except ConversionError as error:
        shown = text if len(text) <= 60 else text[:59] + "…"
        raise ArgumentError(f"{what} is {shown!r}, not {type_name(annotation)}: {error}") from None
