"""The shop's own tests: queueworker's pytest plugin gives each one a migrated database of its own
(`queueworker_db`), and queueworker.testing checks what was enqueued and runs it."""

import shop
from queueworker import enqueue
from queueworker.testing import assert_enqueued, drain, refute_enqueued


def test_placing_an_order_enqueues_its_receipt(queueworker_db):
    shop.place_order(queueworker_db, 17, "ada@example.com", 4200)

    assert_enqueued(queueworker_db, task="shop.send_receipt", payload={"order": 17}, queue="mail")
    refute_enqueued(queueworker_db, task="shop.send_receipt", payload={"order": 18})


def test_the_receipt_is_sent(queueworker_db):
    shop.SENT.clear()
    shop.place_order(queueworker_db, 17, "ada@example.com", 4200)

    [receipt] = drain(queueworker_db)

    assert receipt.state == "succeeded" and receipt.result == {"sent_to": "ada@example.com"}
    assert shop.SENT == ["ada@example.com"]
    refute_enqueued(queueworker_db, task="shop.send_receipt")


def test_a_bad_address_fails_its_task_for_good(queueworker_db):
    shop.place_order(queueworker_db, 18, "not-an-address", 100)

    [receipt] = drain(queueworker_db, queue="mail")

    assert receipt.state == "failed" and receipt.attempts == 1
    assert "not an email address" in receipt.error["message"]


def test_every_page_of_an_export_runs_in_one_drain(queueworker_db):
    enqueue(queueworker_db, "shop.export_orders", {"page": 1, "pages": 3})

    pages = drain(queueworker_db)

    assert [page.state for page in pages] == ["succeeded"] * 3
    assert pages[-1].result == {"pages": 3}


def test_a_failing_report_is_retried_later_not_now(queueworker_db):
    enqueue(queueworker_db, "shop.nightly_report", queue="reports")

    [report] = drain(queueworker_db)

    assert report.state == "retrying" and report.attempts == 1
    assert_enqueued(queueworker_db, task="shop.nightly_report")  # waiting for its retry
