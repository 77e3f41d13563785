"""The child process of a Python-function task: imports the function, calls it, exits.

The worker starts `python -m ax_sdk._fnrun` with the function's location in the environment
variable AX_SDK_FUNCTION (see `functions.child_spec`), in a process group of its own; this
module's exit status is the attempt's exit code.
"""

import importlib
import importlib.util
import json
import os
import sys
import traceback

from ax_sdk.arguments import ArgumentError, bind
from ax_sdk.functions import SPEC_ENV, TaskContext
from ax_sdk.outputs import from_return, render


def _load(spec):
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


def _exit_code(result):
    if result is None or result is True:
        return 0
    if result is False:
        return 1
    if isinstance(result, int):
        return result & 0xFF if result >= 0 else 1
    return _pass_on(result)


def _pass_on(result):
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


def main():
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, errors="replace")
    raw = os.environ.pop(SPEC_ENV, None)
    if raw is None:
        print(f"ax_sdk._fnrun: {SPEC_ENV} is not set; the worker starts this module", file=sys.stderr)
        return 2
    spec = json.loads(raw)
    sys.path[:] = spec["sys_path"]
    try:
        function = _load(spec)
    except BaseException:
        traceback.print_exc()
        print(f"ax-python: cannot load task function {spec['name']!r} ({spec['module']}.{spec['qualname']})", file=sys.stderr)
        return 1
    context = TaskContext.from_environ(spec["args"], os.environ)
    try:
        args, kwargs = bind(function, context, os.environ)
    except ArgumentError as error:
        print(f"ax-python: {spec['name']}: {error}", file=sys.stderr)
        return 1
    try:
        result = function(*args, **kwargs)
    except SystemExit as exit:
        code = exit.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return _exit_code(result)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
