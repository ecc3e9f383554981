"""A small shop's background work and the code that enqueues it: the application whose own test
suite (test_shop.py) shows queueworker.testing (docs/testing-tasks.md)."""

from __future__ import annotations

import psycopg

from queueworker import Continue, PermanentError, RetryAfter, enqueue, task

SENT: list[str] = []  # the receipts "sent": a real application would call its mail service here
EXPORTED: list[int] = []  # the pages "exported"


def place_order(conn: psycopg.Connection, order_id: int, email: str, total_cents: int) -> int:
    """What the web request does: record the order (left out here) and enqueue its receipt."""
    return enqueue(conn, "shop.send_receipt", {"order": order_id, "email": email, "total_cents": total_cents},
                   queue="mail", key=email)


@task(name="shop.send_receipt")
def send_receipt(payload, ctx):
    if "@" not in payload["email"]:
        raise PermanentError(f"not an email address: {payload['email']}")
    SENT.append(payload["email"])
    return {"sent_to": payload["email"]}


@task(name="shop.export_orders")
def export_orders(payload, ctx):
    """Exports the orders a page at a time; each page is a task of its own (Continue), due at once."""
    EXPORTED.append(payload["page"])
    if payload["page"] < payload["pages"]:
        return Continue({**payload, "page": payload["page"] + 1})
    return {"pages": payload["page"]}


@task(name="shop.nightly_report")
def nightly_report(payload, ctx):
    raise RetryAfter(3600, "the report service is down: try again in an hour")
