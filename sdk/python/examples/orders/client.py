"""Triggers the orders workflow for a day and waits for it, with the blocking client or, with
`--async`, the asyncio one: `python client.py 2026-01-31 [--async]` (scheduler at AX_SERVER)."""

from __future__ import annotations

import asyncio
import datetime
import sys

from ax_sdk import AsyncClient, Client, Run, RunState

from workflow import orders_workflow


def report(run: Run, outputs: dict[str, str]) -> int:
    print(f"run {run.id} {run.state}: {outputs.get('return', 'no report')}")
    return 0 if run.state is RunState.SUCCESS else 1


def blocking(day: datetime.date) -> int:
    with Client.from_env() as client:
        client.apply(orders_workflow())
        triggered = client.trigger("orders-daily", {"day": day, "limit": 4, "currency": "USD"}, idempotency_key=f"orders-{day}")
        run = client.wait(triggered.run_id, timeout=300)
        total = next(i for i in client.instances(run.id) if i.task == "total")
        return report(run, total.outputs)


async def concurrent(day: datetime.date) -> int:
    async with AsyncClient.from_env() as client:
        await client.apply(orders_workflow())
        triggered = await client.trigger("orders-daily", {"day": day, "limit": 4, "currency": "CNY"})
        run = await client.wait(triggered.run_id, timeout=300)
        total = next(i for i in await client.instances(run.id) if i.task == "total")
        return report(run, total.outputs)


def main() -> int:
    day = datetime.date.fromisoformat(sys.argv[1]) if len(sys.argv) > 1 else datetime.date.today()
    if "--async" in sys.argv[2:]:
        return asyncio.run(concurrent(day))
    return blocking(day)


if __name__ == "__main__":
    sys.exit(main())
