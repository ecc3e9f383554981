// What the Node peers' harnesses share: a clock with sub-millisecond resolution, and the producer
// loop the benchmark drives over stdin (bench/systems.py, `subprocess_producer`).
import { createInterface } from "node:readline";

// Wall-clock seconds with microseconds: Date.now() counts whole milliseconds, which would take
// half a millisecond on average off every latency measured with it.
export function nowSeconds() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

// Each line on stdin is a count: enqueue that many `record` tasks through `enqueue(count)`, each
// stamped with nowSeconds() just before the call, then answer "ok". "ready" once connected; the
// loop ends when stdin closes.
export async function serveProducer(enqueue) {
  process.stdout.write("ready\n");
  for await (const line of createInterface({ input: process.stdin })) {
    await enqueue(Number(line));
    process.stdout.write("ok\n");
  }
}
