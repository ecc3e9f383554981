"""Demo data for the console's tests and screenshots, made through queueworker's own statements:
tasks enqueued, claimed by a registered worker, finished as succeeded or failed, a run, a paused
queue, and tasks with hostile payloads."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

from queueworker import enqueue, jsonvalue
from queueworker.client.operations import pause, set_limits
from queueworker.client.producer import start_run
from queueworker.db import statements
from queueworker.db.lease import (
    CLAIM, COMPLETE_FAILED, COMPLETE_SUCCEEDED, HEARTBEAT, ClaimedRow, ClaimParams, CompleteFailedParams,
    CompleteSucceededParams, HeartbeatParams)

# A payload nested deeper than Python's json module reads (Postgres stores it happily).
DEEP_NESTING = 5000


@dataclass
class Demo:
    worker: uuid.UUID
    succeeded: list[int]
    failed: list[int]
    running: list[int]
    pending: list[int]
    keyed: int             # a pending task with the dedupe key "invoice-2026-11"
    hostile: int           # markup, control characters and a long string in its payload
    huge: int              # a payload far above what a page shows
    deep: int              # nested deeper than Python can read
    run_id: int


def _claim(conn: psycopg.Connection, worker: uuid.UUID, queue: str, limit: int) -> list[ClaimedRow]:
    return statements.fetch(conn, CLAIM, ClaimParams(queue=queue, limit=limit, worker=worker, lease_seconds=300,
                                                     timeout_seconds=600))


def register_worker(conn: psycopg.Connection, worker: uuid.UUID, queues: list[str], pod: str) -> None:
    statements.fetch(conn, HEARTBEAT, HeartbeatParams(
        worker=worker, hostname=pod, pod_name=pod, pod_namespace="jobs", pid=7, queues=queues, concurrency=8,
        running=0, draining=False, version="0.1.0", lease_seconds=300, ids=[], tokens=[], progresses=[]))


def fill(dsn: str) -> Demo:
    worker = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_worker(conn, worker, ["emails", "reports"], "emails-worker-7c9f4-2xkqp")
        register_worker(conn, uuid.uuid4(), ["billing"], "billing-worker-5d8b6-9wz4r")
        for n in range(12):
            enqueue(conn, "send_welcome_email", {"user_id": 1000 + n, "template": "welcome-v2"}, queue="emails")
        succeeded = []
        for claimed in _claim(conn, worker, "emails", 8):
            succeeded += [row.id for row in statements.fetch(conn, COMPLETE_SUCCEEDED, CompleteSucceededParams(
                ids=[claimed.id], tokens=[claimed.lease_token],
                results=[jsonvalue.encode({"message_id": f"<{claimed.id}@mail.example.com>"})]))]
        failed = []
        for claimed in _claim(conn, worker, "emails", 2):
            failed += [row.id for row in statements.fetch(conn, COMPLETE_FAILED, CompleteFailedParams(
                ids=[claimed.id], tokens=[claimed.lease_token], retryables=[False], backoffs=[0.0],
                errors=[jsonvalue.encode({"type": "SMTPRecipientsRefused", "message": "550 mailbox unavailable",
                                          "retryable": False})]))]
        for n in range(4):
            enqueue(conn, "render_report", {"report": "monthly-revenue", "month": f"2026-{n + 7:02d}"},
                    queue="reports")
        running = [c.id for c in _claim(conn, worker, "reports", 2)]
        conn.execute("UPDATE queueworker.tasks SET progress = %s WHERE id = %s",
                     (Jsonb({"done": 40, "total": 120, "message": "pages"}), running[0]))
        pending = [enqueue(conn, "charge_card", {"invoice": f"INV-{n:05d}", "amount_cents": 1999 + n},
                           queue="billing") for n in range(3)]
        keyed = enqueue(conn, "charge_card", {"invoice": "INV-2026-11"}, queue="billing", dedupe_key="invoice-2026-11")
        pause(conn, "billing")
        set_limits(conn, "reports", rate_per_second=5, max_running=4)
        hostile = enqueue(conn, "odd_payload", {"html": "<script>alert('x')</script><b>bold</b>",
                                                "control": "bell\x07 escape\x1b[31m", "quote": "\"';--"},
                          queue="emails")
        huge = enqueue(conn, "big_payload", {"blob": "x" * 300_000}, queue="emails")
        deep = conn.execute("INSERT INTO queueworker.tasks (queue, task, payload) VALUES "
                            "('emails', 'deep_payload', (repeat('[', %s) || repeat(']', %s))::jsonb) RETURNING id",
                            (DEEP_NESTING, DEEP_NESTING)).fetchone()[0]
        run_id = start_run(conn, "nightly-export", [
            {"task": "export_partition", "payload": {"shard": n}, "queue": "reports"} for n in range(3)])
    return Demo(worker, succeeded, failed, running, pending, keyed, hostile, huge, deep, run_id)
