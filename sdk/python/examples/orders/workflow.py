"""The orders workflow, defined in Python: `python workflow.py` prints its file,
`python workflow.py --apply` applies it to the scheduler at AX_SERVER."""

from __future__ import annotations

import sys

from ax_sdk import Client, Workflow

from tasks import enrich, extract, total

# The worker that serves these functions: python -m ax_sdk --module tasks.py --label worker=orders
PYTHON_WORKER = {"worker": "orders"}


def orders_workflow() -> Workflow:
    workflow = Workflow(
        "orders-daily",
        description="The day's orders, their exchange rates and the total (Python functions)",
        schedule={"cron": "0 6 * * *", "timezone": "Europe/Paris"},
        defaults={"retries": 1, "timeout": "10m"},
    )
    workflow.python(extract, labels=PYTHON_WORKER)
    workflow.python(enrich, labels=PYTHON_WORKER)  # upstream extract: its parameter says so
    workflow.python(total, labels=PYTHON_WORKER)  # upstreams extract and enrich
    # The report reaches the shell through the environment, where no quote of it is read as
    # shell syntax (a ${tasks...} template is pasted into the command text).
    workflow.shell("publish", 'echo "published: $AX_UPSTREAM_TOTAL_return"', upstream="total")
    return workflow


def main() -> int:
    workflow = orders_workflow()
    if sys.argv[1:] == ["--apply"]:
        with Client.from_env() as client:
            applied = client.apply(workflow)
            print(f"applied {applied.workflow.name} version {applied.workflow.version}")
    else:
        print(workflow.to_yaml(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
