// pg-boss harness for the benchmark: `install`, `preload --count N`, `work` (one worker process) or
// `produce` (its client API, send/insert, driven over stdin: see produce.mjs).
// Queues `noop` and `record` with NOTIFY on; `localConcurrency` workers fetching `batchSize` each.
import { PgBoss } from "pg-boss";
import { appendFileSync } from "node:fs";
import { nowSeconds, serveProducer } from "./produce.mjs";

const args = Object.fromEntries(process.argv.slice(3).flatMap((a, i, all) =>
  a.startsWith("--") ? [[a.slice(2), all[i + 1]]] : []));
const latFile = process.env.BENCH_LAT_FILE ? `${process.env.BENCH_LAT_FILE}.${process.pid}` : null;
const cmd = process.argv[2];
// A producer is a client only: no maintenance, no schedules (pg-boss's documented options for that).
const producerOnly = cmd === "produce" ? { supervise: false, schedule: false } : {};
const boss = new PgBoss({ connectionString: args.dsn, max: 12, useListenNotify: true, ...producerOnly });
boss.on("error", (err) => console.error(err));
await boss.start();
if (cmd === "install") {
  for (const name of ["noop", "record"]) await boss.createQueue(name, { notify: true });
  await boss.stop({ graceful: false });
} else if (cmd === "preload") {
  const n = Number(args.count);
  for (let i = 0; i < n; i += 10000) {
    await boss.insert("noop", Array.from({ length: Math.min(10000, n - i) }, () => ({ data: {} })));
  }
  await boss.stop({ graceful: false });
} else if (cmd === "produce") {
  await serveProducer(async (count) => {
    if (count === 1) await boss.send("record", { t: nowSeconds() });
    else await boss.insert("record", Array.from({ length: count }, () => ({ data: { t: nowSeconds() } })));
  });
  await boss.stop({ graceful: false });
} else {
  const concurrency = Number(args.concurrency || 100);
  const batchSize = 10;
  const opts = { batchSize, localConcurrency: Math.max(1, Math.floor(concurrency / batchSize)),
                 burstWhenBatchFull: true, pollingIntervalSeconds: 2 };
  await boss.work("noop", opts, async (jobs) => {});
  await boss.work("record", opts, async (jobs) => {
    const now = nowSeconds();
    if (latFile) appendFileSync(latFile, jobs.map((j) => `${(now - j.data.t) * 1000}\n`).join(""));
  });
  const stop = async () => { await boss.stop({ graceful: true, timeout: 5000 }); process.exit(0); };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
