"""The task functions of the orders example, served by a Python worker:

    python -m ax_sdk --module tasks.py --label worker=orders

`extract` reads the day's orders (here: made up from the day, so the example needs nothing),
`enrich` fetches exchange rates concurrently (an async function), `total` sums them in the
report's currency. Each takes its upstreams' return values and the run's params as typed
arguments; what each returns is passed on to the next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum

from ax_sdk import Cancelled, Tasks

tasks = Tasks()


class Currency(enum.Enum):
    EUR = "EUR"
    USD = "USD"
    CNY = "CNY"


@dataclasses.dataclass
class Order:
    id: str
    amount: float
    currency: Currency


@dataclasses.dataclass
class Report:
    day: datetime.date
    orders: int
    total: float
    currency: Currency


RATES_TO_EUR = {Currency.EUR: 1.0, Currency.USD: 0.92, Currency.CNY: 0.13}


@tasks.task
def extract(day: datetime.date, limit: int = 5) -> list[Order]:
    """The day's orders: `day` and `limit` are the run's params."""
    currencies = list(Currency)
    orders = [
        Order(f"{day:%Y%m%d}-{n}", float(100 + 10 * n), currencies[n % len(currencies)]) for n in range(limit)
    ]
    print(f"extracted {len(orders)} orders for {day}")
    return orders


@tasks.task
async def enrich(extract: list[Order]) -> dict[str, float]:
    """The exchange rate of each order's currency, fetched concurrently."""

    async def rate(currency: Currency) -> tuple[str, float]:
        await asyncio.sleep(0.05)  # a call to a rates service
        return currency.value, RATES_TO_EUR[currency]

    try:
        found = await asyncio.gather(*(rate(c) for c in {order.currency for order in extract}))
    except Cancelled:
        print("cancelled while fetching rates")
        raise
    print(f"fetched {len(found)} rates")
    return dict(sorted(found))


@tasks.task
def total(extract: list[Order], enrich: dict[str, float], day: datetime.date, currency: Currency = Currency.EUR) -> Report:
    """The day's total in the report's currency (the run's param `currency`)."""
    in_eur = sum(order.amount * enrich[order.currency.value] for order in extract)
    amount = round(in_eur / RATES_TO_EUR[currency], 2)
    print(f"{len(extract)} orders on {day}: {amount} {currency.value}")
    return Report(day, len(extract), amount, currency)
