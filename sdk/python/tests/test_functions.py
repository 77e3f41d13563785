"""How a task function is called and how it ends, in the child runner (`python -m ax_sdk._fnrun`)
as the worker starts it: arguments from params and upstreams converted by annotation, async
functions, return values as outputs, exit codes, and a cancel raising `Cancelled` once."""

import dataclasses
import datetime
import enum
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Dict, List, Literal, Optional, Tuple

import pytest

from ax_sdk import TaskContext, functions, outputs, param, upstream
from ax_sdk.arguments import ArgumentError, bind
from ax_sdk.convert import ConversionError, coerce, from_text, to_json


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Window:
    start: datetime.date
    days: int = 1
    tags: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Batch:
    window: Window
    color: Color
    weights: Dict[str, float]


def test_text_converts_to_the_annotation():
    assert from_text("3", int) == 3
    assert from_text("3", str) == "3"
    assert from_text("Lyon", None) == "Lyon"
    assert from_text("true", bool) is True
    assert from_text("2.5", float) == 2.5
    assert from_text("[1, 2]", List[int]) == [1, 2]
    assert from_text("[1, 2]", list[int]) == [1, 2]
    assert from_text("[1, \"a\"]", Tuple[int, str]) == (1, "a")
    assert from_text("[3, 1]", set[int]) == {1, 3}
    assert from_text("null", Optional[int]) is None
    assert from_text("4", int | None) == 4
    assert from_text("blue", Color) is Color.BLUE
    assert from_text("RED", Color) is Color.RED
    assert from_text("fast", Literal["fast", "slow"]) == "fast"
    assert from_text("2026-03-08", datetime.date) == datetime.date(2026, 3, 8)
    assert from_text("2026-03-08T04:00:00+01:00", datetime.datetime).utcoffset() == datetime.timedelta(hours=1)
    batch = from_text(
        json.dumps({"window": {"start": "2026-01-31", "tags": ["a"]}, "color": "red", "weights": {"x": 1}}),
        Batch,
    )
    assert batch == Batch(Window(datetime.date(2026, 1, 31), 1, ["a"]), Color.RED, {"x": 1.0})


def test_a_value_that_does_not_fit_names_what_was_expected():
    cases = [
        ("many", int, "expected an integer"),
        ('"yes"', bool, "expected true or false"),
        ("green", Color, "expected Color ('red', 'blue'), got \"green\""),
        ("[1, \"x\"]", List[int], "item 1: expected an integer"),
        ('{"start": "2026-01-31", "size": 3}', Window, "Window has no field size"),
        ('{"days": 3}', Window, "Window needs field start"),
        ('{"window": {"start": "soon"}, "color": "red", "weights": {}}', Batch, "Batch.window: Window.start: expected a date"),
        ("medium", Literal["fast", "slow"], "expected one of 'fast', 'slow'"),
    ]
    for text, annotation, message in cases:
        with pytest.raises(ConversionError) as refused:
            from_text(text, annotation)
        assert message in str(refused.value), (text, str(refused.value))


def test_pydantic_models_convert_when_pydantic_is_installed():
    pydantic = pytest.importorskip("pydantic", reason="pydantic is not installed in this interpreter")

    class Row(pydantic.BaseModel):
        id: int
        name: str

    assert coerce({"id": "7", "name": "x"}, Row) == Row(id=7, name="x")
    with pytest.raises(ConversionError, match="Row"):
        coerce({"id": "seven"}, Row)
    assert json.loads(to_json(Row(id=1, name="y"))) == {"id": 1, "name": "y"}


def test_return_values_become_json_outputs():
    window = Window(datetime.date(2026, 1, 31), 2, ["a"])
    assert outputs.from_return(window) == {"return": '{"start": "2026-01-31", "days": 2, "tags": ["a"]}'}
    assert outputs.from_return({"color": Color.RED, "n": 3, "s": "text"}) == {
        "return": '{"color": "red", "n": 3, "s": "text"}',
        "color": '"red"',
        "n": "3",
        "s": "text",
    }
    assert outputs.from_return(256) == {"return": "256"}
    assert outputs.from_return(False) == {"return": "false"}
    with pytest.raises(TypeError, match="a value of type object cannot be written as JSON"):
        outputs.from_return(object())


def _with_params(ctx: TaskContext, n: int, flag: bool, window: Window, region: str = param("region", "eu")):
    return n, flag, window, region


def _param_and_upstream(extract: List[int], n: int = param("count")):
    return extract, n


def _single_typed(n: int):
    return n


def test_params_bind_by_name_and_by_param_converted_by_annotation():
    env = {
        "AX_PARAM_n": "3",
        "AX_PARAM_flag": "true",
        "AX_PARAM_window": '{"start": "2026-02-01", "days": 7}',
    }
    ctx = object()
    args, kwargs = bind(_with_params, ctx, env)
    assert args == [ctx, 3, True, Window(datetime.date(2026, 2, 1), 7), "eu"] and kwargs == {}
    args, _ = bind(_with_params, ctx, {**env, "AX_PARAM_region": "us"})
    assert args[-1] == "us"
    # An upstream of the parameter's name comes first; param() reads a param of another name.
    upstreams = {"AX_UPSTREAM_EXTRACT_return": "[1, 2]", "AX_PARAM_count": "9", "AX_PARAM_extract": "[0]"}
    assert bind(_param_and_upstream, ctx, upstreams) == ([[1, 2], 9], {})
    # An annotated single parameter is a param, not the context.
    assert bind(_single_typed, ctx, {"AX_PARAM_n": "4"}) == ([4], {})
    with pytest.raises(ArgumentError, match="parameter n: the run has no param count"):
        bind(_param_and_upstream, ctx, {"AX_UPSTREAM_EXTRACT_return": "[1]"})
    with pytest.raises(ArgumentError, match="parameter n: param n is 'three', not int: expected an integer"):
        bind(_with_params, ctx, {**env, "AX_PARAM_n": "three"})


def test_the_context_reads_a_param_as_a_type():
    ctx = TaskContext.from_environ([], {"AX_PARAM_n": "5", "AX_PARAM_day": "2026-03-08"})
    assert ctx.param("n") == "5"
    assert ctx.param("n", int) == 5
    assert ctx.param("day", datetime.date) == datetime.date(2026, 3, 8)
    assert ctx.param("missing", int, 0) == 0
    with pytest.raises(KeyError, match="the run has no param missing"):
        ctx.param("missing")
    with pytest.raises(ValueError, match="param day is '2026-03-08', not int"):
        ctx.param("day", int)


def _run_function(tmp_path, source: str, name: str, env=None, *, cancel_after: Optional[float] = None):
    """Runs function `name` of a script holding `source` as the worker does; (process, outputs)."""
    script = tmp_path / f"fn_{name}.py"
    script.write_text(textwrap.dedent(source))
    output = tmp_path / f"{name}.out"
    output.write_text("")
    ref = functions.FunctionRef(name=name, module="__main__", qualname=name, file=str(script))
    child_env = dict(os.environ)
    child_env[functions.SPEC_ENV] = json.dumps(functions.child_spec(ref, []))
    child_env["AX_OUTPUT"] = str(output)
    child_env.update(env or {})
    process = subprocess.Popen(
        [sys.executable, "-m", "ax_sdk._fnrun"],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    if cancel_after is not None:
        ready = process.stdout.readline()
        assert ready == "ready\n", ready + process.stderr.read()
        time.sleep(cancel_after)
        # The worker signals the group, twice when two nodes cancel: one Cancelled is raised.
        os.killpg(process.pid, signal.SIGTERM)
        time.sleep(0.2)
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # it ended before the second
    stdout, stderr = process.communicate(timeout=60)
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return done, outputs.parse(output.read_bytes())


def test_an_async_function_runs_and_its_return_value_is_its_output(tmp_path):
    done, passed = _run_function(
        tmp_path,
        """
        import asyncio
        async def fetch(n: int) -> dict:
            await asyncio.sleep(0.01)
            print("fetched", n)
            return {"rows": n * 2, "source": "api"}
        """,
        "fetch",
        {"AX_PARAM_n": "21"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fetched 21\n"
    assert "never awaited" not in done.stderr
    assert passed == {"return": '{"rows": 42, "source": "api"}', "rows": "42", "source": "api"}


def test_an_int_return_is_an_output_not_an_exit_code(tmp_path):
    done, passed = _run_function(tmp_path, "def count():\n    return 256\n", "count")
    assert done.returncode == 0, done.stderr
    assert passed == {"return": "256"}
    done, passed = _run_function(tmp_path, "def nothing():\n    return None\n", "nothing")
    assert (done.returncode, passed) == (0, {})


def test_exit_codes_come_from_sys_exit_and_exceptions(tmp_path):
    done, _ = _run_function(tmp_path, "import sys\ndef code():\n    sys.exit(3)\n", "code")
    assert done.returncode == 3
    done, _ = _run_function(tmp_path, "import sys\ndef big():\n    sys.exit(256)\n", "big")
    assert done.returncode == 1
    assert "sys.exit(256) is outside 0..255" in done.stderr
    done, _ = _run_function(tmp_path, "def boom():\n    raise RuntimeError('no rows')\n", "boom")
    assert done.returncode == 1
    assert "RuntimeError: no rows" in done.stderr


def test_a_cancel_raises_cancelled_once_and_finally_runs(tmp_path):
    done, _ = _run_function(
        tmp_path,
        """
        import time
        from ax_sdk import Cancelled
        def long():
            print("ready", flush=True)
            try:
                time.sleep(30)
            except Cancelled:
                print("cancelled")
                time.sleep(0.5)  # a second SIGTERM arrives during the clean-up and changes nothing
                raise
            finally:
                print("cleaned up")
        """,
        "long",
        cancel_after=0.2,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "cancelled\ncleaned up\n", done.stderr
    assert "stopped by SIGTERM" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_cancel_cancels_an_async_function(tmp_path):
    done, _ = _run_function(
        tmp_path,
        """
        import asyncio
        from ax_sdk import Cancelled
        async def waits():
            print("ready", flush=True)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                print("cancelled")
                raise
            finally:
                print("cleaned up")
        """,
        "waits",
        cancel_after=0.2,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "cancelled\ncleaned up\n", done.stderr


def test_a_function_that_swallows_the_cancel_still_ends_cancelled(tmp_path):
    done, passed = _run_function(
        tmp_path,
        """
        from ax_sdk import Cancelled
        import time
        def stubborn():
            print("ready", flush=True)
            try:
                time.sleep(30)
            except BaseException:
                pass
            return {"done": 1}
        """,
        "stubborn",
        cancel_after=0.1,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert passed == {}


def _two_optional(ctx, a: int = 1, b: int = 2):
    return a, b


def test_a_skipped_optional_parameter_leaves_the_next_ones_in_place():
    ctx = object()
    args, kwargs = bind(_two_optional, ctx, {"AX_PARAM_b": "5"})
    assert _two_optional(*args, **kwargs) == (1, 5)
    assert (args, kwargs) == ([ctx], {"b": 5})


def test_text_stays_text_where_the_annotation_takes_a_string():
    class Code(enum.Enum):
        ONE = "1"
        X = "x"

    assert from_text("1.10", Optional[str]) == "1.10"
    assert from_text('"quoted"', Optional[str]) == '"quoted"'
    assert from_text("null", Optional[str]) is None
    assert from_text("3", int | str) == 3
    assert from_text("abc", int | str) == "abc"
    assert from_text("1", Literal["1", "2"]) == "1"
    assert from_text("1", Code) is Code.ONE
    with pytest.raises(ConversionError, match="expected one of 1"):
        from_text("true", Literal[1])


def test_params_go_bare_when_their_json_is_a_string():
    from ax_sdk.client import encode_params

    assert encode_params({"day": datetime.date(2026, 1, 31), "color": Color.RED, "n": 3, "s": "x", "l": ["a"]}) == {
        "day": "2026-01-31",
        "color": "red",
        "n": "3",
        "s": "x",
        "l": '["a"]',
    }
    # And they read back typed.
    assert from_text("2026-01-31", datetime.date) == datetime.date(2026, 1, 31)
    assert from_text("red", Color) is Color.RED


def _unresolvable(ctx, window: "NotImportedAtRunTime"):  # noqa: F821 - the point of the test
    return window


def test_an_annotation_that_does_not_resolve_is_named_when_its_value_is_converted():
    with pytest.raises(ArgumentError, match="the annotation 'NotImportedAtRunTime' does not resolve"):
        bind(_unresolvable, object(), {"AX_PARAM_window": "{}"})


def test_the_builder_quotes_keys_yaml_would_read_as_something_else():
    from ax_sdk import Workflow

    workflow = Workflow("keys")
    workflow.shell("t", "true", env={"null": "a", "ON": "b", "1x": "c", "plain_key-2": "d"})
    text = workflow.to_yaml()
    for line in ('"null": "a"', '"ON": "b"', '"1x": "c"', 'plain_key-2: "d"'):
        assert line in text, text
