"""Task functions of the tests, registered on a Tasks registry the test worker serves."""

import sys

from ax_sdk import Tasks, upstream

tasks = Tasks()


@tasks.task("greet")
def greet(ctx):
    print(f"hello {ctx.args[0]} from {ctx.params['who']}")
    print(f"run {ctx.run_id} task {ctx.task} attempt {ctx.attempt} of {ctx.workflow}")
    print(f"instance {ctx.instance_id} env {ctx.env['GREETING_ENV']}")


@tasks.task("exit_with")
def exit_with(ctx):
    print(f"exiting with {ctx.args[0]}")
    sys.exit(int(ctx.args[0]))


@tasks.task("boom")
def boom(ctx):
    print("about to raise")
    raise ValueError(f"boom: {ctx.params['who']} is not welcome")


@tasks.task()
def quits():
    """Takes no context; sys.exit decides."""
    print("quitting", file=sys.stderr)
    sys.exit(7)


@tasks.task("sleeper")
def sleeper(ctx):
    """Writes its pid where its first argument says, then sleeps until killed."""
    import os
    import time

    with open(ctx.args[0], "w") as pid_file:
        pid_file.write(str(os.getpid()))
    print("sleeping")
    time.sleep(300)


@tasks.task("count_rows")
def count_rows(ctx):
    """Returns its outputs: a dict, one output per key."""
    return {"rows": 3, "names": ["a", "b"], "note": "two\nlines"}


@tasks.task("use_rows")
def use_rows(ctx):
    """Reads the outputs of its upstream `count`."""
    print(f"rows={ctx.output('count', 'rows')} names={ctx.output_json('count', 'names')}")
    print(ctx.output("count", "note"))
    return {"doubled": ctx.output_json("count", "rows") * 2}


@tasks.task("use_typed")
def use_typed(rows: int = upstream("count", "rows"), names: list = upstream("count", "names")):
    """Takes its upstream's outputs as typed arguments; returns a list (the output `return`)."""
    print(f"typed rows+1={rows + 1} names={names}")
    return [rows, *names]


@tasks.task("by_name")
def by_name(ctx, typed, missing: str = "default"):
    """Takes what its upstream `typed` returned, by the upstream's name."""
    print(f"from typed: {typed} ({type(typed).__name__}), missing={missing}, task {ctx.task}")


@tasks.task("slow_to_stop")
def slow_to_stop(ctx):
    """On a cancel, takes 0.3 s to clean up (within the test worker's kill grace of 1 s), then
    writes where its first argument says."""
    import time

    from ax_sdk import Cancelled

    print("working", flush=True)
    try:
        time.sleep(300)
    except Cancelled:
        print("cancelled: cleaning up", flush=True)
        time.sleep(0.3)
        with open(ctx.args[0], "w") as done:
            done.write("cleaned up")
        raise


@tasks.task("typed_params")
def typed_params(n: int, flag: bool, window: dict, names: list[str], note: str = "none") -> dict:
    """Params arrive typed; the return value is the outputs."""
    print(f"n+1={n + 1} flag={flag!r} window={window} names={names} note={note}")
    return {"n_squared": n * n, "flag": not flag}


@tasks.task("async_fetch")
async def async_fetch(n: int) -> list:
    import asyncio

    await asyncio.sleep(0.05)
    print(f"fetched {n}")
    return list(range(n))
