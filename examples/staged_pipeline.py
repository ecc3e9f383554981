"""A staged pipeline (the project's seed 004): every item goes through fetch → transform → publish,
each stage a task that depends on the one before. One item cannot be fetched (a permanent error):
its later stages are cancelled, naming the stage that failed; every other item is published.

    python -m examples.staged_pipeline --dsn postgresql://...   # or $DATABASE_URL
    python -m examples.staged_pipeline --items 5 --bad 3

It migrates the database, enqueues the pipelines, runs two `queueworker worker` processes with
this module's handlers until every stage has ended, and prints each item's stages. Workers never
advance downstream work: the database promotes a stage from `blocked` to `pending` in the
statement that records the success of the stage before it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import psycopg

from queueworker import PermanentError, enqueue_chain, task
from queueworker.migrate import migrate

QUEUE = "pipeline"
HANDLERS = "examples.staged_pipeline"  # this module, by the name a worker imports it with
STAGES = ("fetch", "transform", "publish")
TERMINAL = ("succeeded", "failed", "cancelled")


@task(name="pipeline.fetch")
def fetch(payload, ctx):
    if payload["item"] == payload["bad"]:
        raise PermanentError(f"item {payload['item']} is gone at the source")
    return {"bytes": 1000 + payload["item"]}


@task(name="pipeline.transform")
def transform(payload, ctx):
    return {"records": payload["item"] * 10}


@task(name="pipeline.publish")
def publish(payload, ctx):
    return {"url": f"https://example.com/items/{payload['item']}"}


def enqueue_pipelines(dsn: str, items: int, bad: int) -> dict[int, list[int]]:
    """One chain per item, in one transaction: {item: [fetch id, transform id, publish id]}."""
    with psycopg.connect(dsn) as conn:
        return {item: enqueue_chain(conn, [{"task": f"pipeline.{stage}", "queue": QUEUE,
                                            "payload": {"item": item, "bad": bad}} for stage in STAGES])
                for item in range(1, items + 1)}


def stage_states(dsn: str, ids: list[int]) -> dict[int, tuple[str, str | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, state::text, error ->> 'message' FROM queueworker.tasks WHERE id = ANY(%s)",
                            (ids,)).fetchall()
    return {task_id: (state, message) for task_id, state, message in rows}


def run(dsn: str, items: int, bad: int, timeout: float = 120) -> dict[int, list[tuple[str, str | None]]]:
    migrate(dsn)
    pipelines = enqueue_pipelines(dsn, items, bad)
    ids = [task_id for chain in pipelines.values() for task_id in chain]
    env = {**os.environ, "DATABASE_URL": dsn}
    workers = [subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--handlers", HANDLERS,
                                 "--queue", QUEUE, "--concurrency", "4", "--log-level", "warning"], env=env)
               for _ in range(2)]
    try:
        deadline = time.monotonic() + timeout
        while True:
            states = stage_states(dsn, ids)
            if all(state in TERMINAL for state, _ in states.values()):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the pipelines did not finish within {timeout:g} s")
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(30)
    return {item: [states[task_id] for task_id in chain] for item, chain in pipelines.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.staged_pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL"), help="default: $DATABASE_URL")
    parser.add_argument("--items", type=int, default=5)
    parser.add_argument("--bad", type=int, default=3, help="the item whose fetch fails for good")
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("give --dsn or set DATABASE_URL")
    outcome = run(args.dsn, args.items, args.bad)
    print(f"{'ITEM':<6}" + "".join(f"{stage.upper():<12}" for stage in STAGES))
    for item, stages in outcome.items():
        print(f"{item:<6}" + "".join(f"{state:<12}" for state, _ in stages))
        for stage, (state, message) in zip(STAGES, stages):
            if state != "succeeded" and message:
                print(f"      {stage}: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
