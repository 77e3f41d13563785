/**
 * The task functions of the orders example, served by a TypeScript worker:
 *
 *     npx ax-node-worker --module dist/examples/orders/tasks.js --label worker=orders
 *
 * `extract` reads the day's orders (here: made up from the day, so the example needs nothing),
 * `enrich` fetches exchange rates concurrently, `total` sums them in the report's currency. Each
 * takes its upstreams' return values and the run's params as typed inputs; what each returns is
 * passed on to the next.
 */

import { setTimeout as sleep } from "node:timers/promises";

import { param, t, Tasks, upstream } from "ax-sdk";

export const tasks = new Tasks(import.meta.url);

export const CURRENCIES = ["EUR", "USD", "CNY"] as const;
export type Currency = (typeof CURRENCIES)[number];

export interface Order {
  id: string;
  amount: number;
  currency: Currency;
}

export interface Report {
  day: string;
  orders: number;
  total: number;
  currency: Currency;
}

const RATES_TO_EUR: Record<Currency, number> = { EUR: 1.0, USD: 0.92, CNY: 0.13 };

/** The day's orders: `day` and `limit` are the run's params. */
export const extract = tasks.task("extract", {
  inputs: { day: t.date(), limit: param("limit", t.integer(), 5) },
  async run({ day, limit }): Promise<Order[]> {
    const stamp = day.toISOString().slice(0, 10);
    const orders = Array.from({ length: limit }, (_, n) => ({
      id: `${stamp.replaceAll("-", "")}-${n}`,
      amount: 100 + 10 * n,
      currency: CURRENCIES[n % CURRENCIES.length]!,
    }));
    console.log(`extracted ${orders.length} orders for ${stamp}`);
    return orders;
  },
});

/** The exchange rate of each order's currency, fetched concurrently; a cancel aborts the fetches. */
export const enrich = tasks.task("enrich", {
  inputs: { extract: upstream(extract) },
  async run({ extract }, ctx): Promise<Record<string, number>> {
    const rate = async (currency: Currency): Promise<[string, number]> => {
      await sleep(50, undefined, { signal: ctx.signal }); // a call to a rates service
      return [currency, RATES_TO_EUR[currency]];
    };
    try {
      const found = await Promise.all([...new Set(extract.map((order) => order.currency))].map(rate));
      console.log(`fetched ${found.length} rates`);
      return Object.fromEntries(found.sort(([a], [b]) => a.localeCompare(b)));
    } catch (error) {
      if (ctx.signal.aborted) console.log("cancelled while fetching rates");
      throw error;
    }
  },
});

/** The day's total in the report's currency (the run's param `currency`). */
export const total = tasks.task("total", {
  inputs: {
    extract: upstream(extract),
    enrich: upstream(enrich),
    day: t.date(),
    currency: param("currency", t.literal(...CURRENCIES), "EUR"),
  },
  run({ extract, enrich, day, currency }): Report {
    const inEur = extract.reduce((sum, order) => sum + order.amount * enrich[order.currency]!, 0);
    const amount = Math.round((inEur / RATES_TO_EUR[currency]) * 100) / 100;
    const stamp = day.toISOString().slice(0, 10);
    console.log(`${extract.length} orders on ${stamp}: ${amount} ${currency}`);
    return { day: stamp, orders: extract.length, total: amount, currency };
  },
});
