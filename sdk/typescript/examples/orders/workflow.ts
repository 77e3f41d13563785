/**
 * The orders workflow, defined in TypeScript: `node dist/examples/orders/workflow.js` prints its
 * file, `... --apply` applies it to the scheduler at AX_SERVER.
 */

import { Client, isMain, Workflow } from "ax-sdk";

import { enrich, extract, total } from "./tasks.js";

/** The worker that serves these functions: npx ax-node-worker --module dist/examples/orders/tasks.js --label worker=orders */
const NODE_WORKER = { worker: "orders" };

export function ordersWorkflow(): Workflow {
  const workflow = new Workflow("orders-daily-ts", {
    description: "The day's orders, their exchange rates and the total (TypeScript functions)",
    schedule: { cron: "0 6 * * *", timezone: "Europe/Paris" },
    defaults: { retries: 1, timeout: "10m" },
  });
  workflow.task(extract, { labels: NODE_WORKER });
  workflow.task(enrich, { labels: NODE_WORKER }); // upstream extract: its inputs say so
  workflow.task(total, { labels: NODE_WORKER }); // upstreams extract and enrich
  // The report reaches the shell through the environment, where no quote of it is read as shell
  // syntax (a ${tasks...} template is pasted into the command text).
  workflow.shell("publish", 'echo "published: $AX_UPSTREAM_TOTAL_return"', { upstream: "total" });
  return workflow;
}

if (isMain(import.meta.url)) {
  const workflow = ordersWorkflow();
  if (process.argv[2] === "--apply") {
    const client = Client.fromEnv();
    const applied = await client.apply(workflow);
    console.log(`applied ${applied.workflow?.name} version ${applied.workflow?.version}`);
    client.close();
  } else {
    process.stdout.write(workflow.toYaml());
  }
}
