// graphile-worker harness for the benchmark: `install` (migrations), `work` (one worker process) or
// `produce` (its client API, WorkerUtils.addJob/addJobs, driven over stdin: see produce.mjs).
// Batching on (localQueue = concurrency, batched completion), its documented fast configuration.
import { makeWorkerUtils, run, runMigrations } from "graphile-worker";
import { appendFileSync } from "node:fs";
import { nowSeconds, serveProducer } from "./produce.mjs";

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
    if (latFile) appendFileSync(latFile, `${(nowSeconds() - payload.t) * 1000}\n`);
  },
};

if (process.argv[2] === "install") {
  await runMigrations({ preset });
} else if (process.argv[2] === "produce") {
  const utils = await makeWorkerUtils({ connectionString });
  await serveProducer(async (count) => {
    if (count === 1) await utils.addJob("record", { t: nowSeconds() });
    else await utils.addJobs(Array.from({ length: count }, () => ({ identifier: "record", payload: { t: nowSeconds() } })));
  });
  await utils.release();
} else {
  const runner = await run({ preset, taskList, noHandleSignals: false });
  await runner.promise;
}
