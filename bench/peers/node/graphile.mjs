// graphile-worker harness for the benchmark: `install` (migrations) or `work` (one worker process).
// Batching on (localQueue = concurrency, batched completion), its documented fast configuration.
import { run, runMigrations } from "graphile-worker";
import { appendFileSync } from "node:fs";

const args = Object.fromEntries(process.argv.slice(3).flatMap((a, i, all) =>
  a.startsWith("--") ? [[a.slice(2), all[i + 1]]] : []));
const connectionString = args.dsn;
const concurrency = Number(args.concurrency || 100);
const latFile = process.env.BENCH_LAT_FILE ? `${process.env.BENCH_LAT_FILE}.${process.pid}` : null;

const preset = {
  worker: {
    connectionString, concurrentJobs: concurrency, maxPoolSize: concurrency + 2,
    localQueue: { size: concurrency }, completeJobBatchDelay: 1, failJobBatchDelay: 1,
    pollInterval: 2000,
  },
};
const taskList = {
  noop: async () => {},
  record: async (payload) => {
    if (latFile) appendFileSync(latFile, `${(Date.now() / 1000 - payload.t) * 1000}\n`);
  },
};

if (process.argv[2] === "install") {
  await runMigrations({ preset });
} else {
  const runner = await run({ preset, taskList, noHandleSignals: false });
  await runner.promise;
}
