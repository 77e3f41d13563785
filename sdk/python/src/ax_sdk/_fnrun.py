"""The child process of a Python-function task: imports the function, calls it, exits.

The worker starts `python -m ax_sdk._fnrun` with the function's location in the environment
variable AX_SDK_FUNCTION (see `functions.child_spec`), in a process group of its own; this
module's exit status is the attempt's exit code.
"""

import asyncio
import importlib
import importlib.util
import inspect
import io
import json
import os
import signal
import sys
import traceback
from types import FrameType
from typing import Any, Awaitable, Dict, Optional

from ax_sdk.arguments import ArgumentError, bind
from ax_sdk.functions import SPEC_ENV, Cancelled, TaskContext
from ax_sdk.outputs import from_return, render


def _load(spec: Dict[str, Any]) -> Any:
    if spec.get("file"):
        # The worker's main script, loaded under another name so its __main__ block stays idle.
        module_spec = importlib.util.spec_from_file_location("__ax_task_main__", spec["file"])
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {spec['file']}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules["__ax_task_main__"] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(spec["module"])
    target = module
    for part in spec["qualname"].split("."):
        target = getattr(target, part)
    return target


def _pass_on(result: Any) -> int:
    """Writes a returned value to $AX_OUTPUT, for the tasks below; 1 when it cannot be."""
    path = os.environ.get("AX_OUTPUT")
    if not path:
        print("ax-python: the function returned a value, but $AX_OUTPUT is not set (a worker "
              "without outputs); the value is dropped", file=sys.stderr)
        return 0
    try:
        text = render(from_return(result))
    except (TypeError, ValueError) as error:
        print(f"ax-python: the function's return value cannot become outputs: {error}", file=sys.stderr)
        return 1
    with open(path, "a", encoding="utf-8") as file:
        file.write(text)
    return 0


def main() -> int:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, errors="replace")
    raw = os.environ.pop(SPEC_ENV, None)
    if raw is None:
        print(f"ax_sdk._fnrun: {SPEC_ENV} is not set; the worker starts this module", file=sys.stderr)
        return 2
    spec = json.loads(raw)
    sys.path[:] = spec["sys_path"]
    stop = _Stop()
    try:
        function = _load(spec)
    except BaseException:
        if stop.signalled:
            return stop.exit()
        traceback.print_exc()
        print(f"ax-python: cannot load task function {spec['name']!r} ({spec['module']}.{spec['qualname']})", file=sys.stderr)
        return 1
    try:
        context = TaskContext.from_environ(spec["args"], os.environ)
        args, kwargs = bind(function, context, os.environ)
    except ArgumentError as error:
        print(f"ax-python: {spec['name']}: {error}", file=sys.stderr)
        return 1
    except Cancelled:
        return stop.exit()
    try:
        if inspect.iscoroutinefunction(function):
            result = _run_async(function(*args, **kwargs), stop)
        else:
            result = function(*args, **kwargs)
            if inspect.isawaitable(result):
                result = _run_async(result, stop)
    except SystemExit as exit:
        stop.quiet()
        if stop.signalled:
            return stop.exit()
        return _exit_status(exit.code)
    except BaseException as error:
        stop.quiet()
        if stop.signalled:
            if not isinstance(error, (Cancelled, asyncio.CancelledError)):
                traceback.print_exc()
            return stop.exit()
        traceback.print_exc()
        return 1
    stop.quiet()
    if stop.signalled:
        return stop.exit()
    if result is None:
        return 0
    code = _pass_on(result)
    # A SIGTERM while the outputs were written: the attempt is stopped all the same.
    return stop.exit() if stop.signalled else code


class _Stop:
    """SIGTERM (a cancel or a timeout) raises `Cancelled` in the function, once: its `finally`
    blocks and context managers run before the process ends; a second SIGTERM changes nothing
    (the worker's SIGKILL follows its grace). The process then ends by SIGTERM itself, so the
    attempt's end says what stopped it."""

    def __init__(self) -> None:
        self.signalled = False
        self._task: "asyncio.Task[Any] | None" = None
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, _signum: int, _frame: Optional[FrameType]) -> None:
        if self.signalled:
            return
        self.signalled = True
        if self._task is not None:
            self._task.cancel("ax: the attempt is stopped (SIGTERM: a cancel or a timeout)")
            return
        raise Cancelled("the attempt is stopped (SIGTERM: a cancel or a timeout)")

    def quiet(self) -> None:
        """The function is over: a SIGTERM from now on is noted, not raised, so writing its
        outputs is never cut half-way; the process then ends by SIGTERM as after a cancel."""
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, _signum: int, _frame: Optional[FrameType]) -> None:
        self.signalled = True

    def watch(self, task: "asyncio.Task[Any]") -> None:
        """An async function is stopped by cancelling its task, as asyncio code expects."""
        self._task = task
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._on_sigterm, signal.SIGTERM, None)

    def exit(self) -> int:
        print("ax-python: stopped by SIGTERM (a cancel or a timeout)", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return 128 + signal.SIGTERM


def _run_async(awaitable: Awaitable[Any], stop: _Stop) -> Any:
    async def supervised() -> Any:
        task = asyncio.ensure_future(awaitable)
        stop.watch(task)
        return await task

    return asyncio.run(supervised())


def _exit_status(code: object) -> int:
    """The exit code of `sys.exit(code)`: an int in 0..255 as it is, None 0, anything else 1."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        if 0 <= code <= 255:
            return code
        print(f"ax-python: sys.exit({code}) is outside 0..255; the exit code is 1", file=sys.stderr)
        return 1
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
