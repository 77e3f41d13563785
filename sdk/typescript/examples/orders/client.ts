/**
 * Triggers the orders workflow for a day and waits for it (scheduler at AX_SERVER):
 *
 *     node dist/examples/orders/client.js 2026-01-31 [CURRENCY]
 *
 * prints `run ID STATE: REPORT` and exits 0 when the run succeeded.
 */

import { Client } from "ax-sdk";

import { type Currency, type Report } from "./tasks.js";
import { ordersWorkflow } from "./workflow.js";

const day = process.argv[2] ?? new Date().toISOString().slice(0, 10);
const currency = (process.argv[3] ?? "USD") as Currency;

const client = Client.fromEnv();
try {
  await client.apply(ordersWorkflow());
  // Strings go as they are, numbers as JSON: `limit` reaches `extract` as the integer 4.
  const { run } = await client.trigger(
    "orders-daily-ts",
    { day, limit: 4, currency },
    { idempotencyKey: `orders-${day}-${currency}` },
  );
  const ended = await client.wait(run.id, { timeoutMs: 300_000 });
  const totalTask = (await client.instances(ended.id)).find((instance) => instance.task === "total");
  const report = totalTask?.outputs.return;
  const parsed = report === undefined ? undefined : (JSON.parse(report) as Report);
  console.log(`run ${ended.id} ${ended.state}: ${parsed ? JSON.stringify(parsed) : "no report"}`);
  process.exitCode = ended.state === "SUCCESS" ? 0 : 1;
} finally {
  client.close();
}
