// Enqueues queueworker tasks from Node with the `pg` package, through the SQL producer API
// (docs/producers.md): one task with queueworker.enqueue, two more with queueworker.enqueue_many,
// in one transaction. With --wait it then reads each back with queueworker.task_status until it
// has finished, as a producer that needs the result would.
//
//     DATABASE_URL=postgresql://billing_app@db/app node enqueue.js --wait
"use strict";

const { Client } = require("pg");

const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

async function waitFor(client, id, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await client.query(
      "SELECT state, attempts, result, error FROM queueworker.task_status($1)", [id]);
    if (rows.length === 0) throw new Error(`no task ${id}`);
    if (FINISHED.has(rows[0].state)) return rows[0];
    if (Date.now() > deadline) throw new Error(`task ${id} is still ${rows[0].state}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

async function main() {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    await client.query("BEGIN");
    // Named arguments are TaskSpec's fields; a JS object is sent as JSON.
    const one = await client.query(
      `SELECT queueworker.enqueue('emails.send_welcome', $1, queue => 'emails', priority => 5,
                                  key => 'tenant-7', dedupe_key => 'welcome-42') AS id`,
      [{ user_id: 42 }]);
    const many = await client.query("SELECT queueworker.enqueue_many($1) AS ids", [JSON.stringify([
      { task: "emails.send_welcome", queue: "emails", payload: { user_id: 43 } },
      { task: "emails.send_welcome", queue: "emails", payload: { user_id: 44 }, delay: 0.5, max_attempts: 3 },
    ])]);
    await client.query("COMMIT");  // the workers are woken when the tasks commit
    const ids = [one.rows[0].id, ...many.rows[0].ids];  // bigint arrives as a string
    console.log(`enqueued ${ids.join(" ")}`);
    if (process.argv.includes("--wait")) {
      for (const id of ids) {
        const status = await waitFor(client, id, 60000);
        console.log(`${id} ${status.state} ${JSON.stringify(status.result)}`);
      }
    }
  } finally {
    await client.end();
  }
}

main().catch((error) => {
  // pg's errors carry the SQLSTATE: 22023 a refused argument, 42501 a queue this login may not use.
  console.error(`enqueue failed: ${error.message}${error.code ? ` (SQLSTATE ${error.code})` : ""}`);
  process.exit(1);
});
