"""The cleaner forgets idle keys (migration 023, docs/flow-control.md "Forgetting idle keys"), on a
real Postgres: the state of a key (queueworker.key_state: its bucket, breaker and health) goes once
the key has had no unfinished task and no change to its row for the retention, unless that would
change what a claim decides (a bucket still refilling, a breaker still cooling down); a key with a
task stays however old its row, the operator's settings of a key stay, and the claim after the
deletion finds a new key. A claim racing the deletion, on two connections, never starts more than
the key's bucket allows. Old rows are made by moving their times back as the superuser."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from queueworker import enqueue_many
from queueworker.client import operations
from queueworker.client.producer import TaskSpec
from queueworker.db import statements
from queueworker.db.duties import CLEAN_KEY_STATE, RetentionParams
from queueworker.runtime import cleaner as cleaner_module
from queueworker.runtime.cleaner import Cleaned
from tests.support import WorkerProcess, query, scalar, wait_until
from tests.test_key_breaker import report
from tests.test_key_limits import claim_keys, keyed
from tests.test_retention import DAY, HOUR, clean
from tests.test_roles import installation  # noqa: F401  (the fixture: a login per role of docs/database-roles.sql)

pytestmark = pytest.mark.integration


def age_keys(conn: psycopg.Connection, queue: str, ago: str, keys: list[str] | None = None) -> None:
    """Moves every time of the keys' rows (all of the queue's by default) `ago` back."""
    conn.execute(
        "UPDATE queueworker.key_state SET tokens_at = tokens_at - %(ago)s::interval, "
        "next_token_at = next_token_at - %(ago)s::interval, "
        "breaker_changed_at = breaker_changed_at - %(ago)s::interval, "
        "last_success_at = last_success_at - %(ago)s::interval, last_failure_at = last_failure_at - %(ago)s::interval "
        "WHERE queue = %(queue)s AND (%(keys)s::text[] IS NULL OR key = ANY(%(keys)s::text[]))",
        {"ago": ago, "queue": queue, "keys": keys})


def key_states(dsn: str, queue: str) -> set[str]:
    return {row[0] for row in query(dsn, "SELECT key FROM queueworker.key_state WHERE queue = %s", (queue,))}


def test_idle_keys_go_and_keys_with_a_task_a_young_row_or_a_refilling_bucket_stay(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "src", per_key_rate_per_second=10, per_key_burst=3)
        operations.set_limits(conn, "src", key="configured", max_running=5, weight=2)
        operations.set_limits(conn, "src", key="refilling", rate_per_second=0.000001, burst=1)
        later = datetime.now(timezone.utc) + timedelta(days=3)
        enqueue_many(conn, keyed("src", {"idle": 1, "configured": 1, "refilling": 1, None: 1, "pending": 1,
                                         "running": 1, "retrying": 1, "delayed": 1, "young": 1}))
        assert len(claim_keys(conn, "src")) == 9, "every key's bucket charged"
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() "
                     "WHERE queue = 'src' AND coalesce(key, '') IN ('idle', 'configured', 'refilling', '', 'young')")
        conn.execute("UPDATE queueworker.tasks SET state = 'pending', lease_owner = NULL, leased_until = NULL, "
                     "deadline_at = NULL WHERE queue = 'src' AND key = 'pending'")
        conn.execute("UPDATE queueworker.tasks SET state = 'retrying', run_after = %s, lease_owner = NULL, "
                     "leased_until = NULL, deadline_at = NULL WHERE queue = 'src' AND key = 'retrying'", (later,))
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() "
                     "WHERE queue = 'src' AND key = 'delayed'")
        enqueue_many(conn, [TaskSpec(task="t", queue="src", key="delayed", run_after=later)])
        age_keys(conn, "src", "2 hours", ["idle", "configured", "refilling", "", "pending", "running", "retrying",
                                          "delayed"])
    assert key_states(dsn, "src") == {"idle", "configured", "refilling", "", "pending", "running", "retrying",
                                      "delayed", "young"}

    cleaned = clean(dsn, retention_seconds=HOUR, watermark_retention_seconds=0)

    assert cleaned == Cleaned(key_states=2)
    assert key_states(dsn, "src") == {"refilling", "", "pending", "running", "retrying", "delayed", "young"}, \
        "the idle key and the configured one went; a task of any unfinished state, a young row, a bucket " \
        "still refilling and the tasks without a key kept theirs"
    assert query(dsn, "SELECT key, weight, max_running FROM queueworker.queue_keys WHERE queue = 'src' ORDER BY key") \
        == [("configured", 2.0, 5), ("refilling", None, None)], "the operator's settings stay"
    assert clean(dsn, retention_seconds=HOUR, watermark_retention_seconds=0) == Cleaned(), "nothing left to go"

    # The claim after the deletion: a new key, with a full bucket (3), and no more.
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, keyed("src", {"idle": 5}))
        assert sorted(claim_keys(conn, "src")) == ["idle"] * 3 + ["pending"]
        assert claim_keys(conn, "src") == [], "the bucket the claim charged holds"
    assert scalar(dsn, "SELECT tokens < 1 FROM queueworker.key_state WHERE queue = 'src' AND key = 'idle'")


def test_an_open_breaker_goes_only_once_its_cooldown_is_over_and_its_key_starts_closed(dsn):
    """A key whose breaker opened and whose tasks are gone: its row goes after the retention only
    when the cooldown is over too (it would let its probe through by now); a cooldown longer than
    the retention keeps it open."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "short", failures=1, cooldown_seconds=60, per_key=True)
        operations.set_breaker(conn, "long", failures=1, cooldown_seconds=3 * HOUR, per_key=True)
        for queue in ("short", "long"):
            assert report(conn, queue, {"dead": (False, 1), "fine": (True, 0)}) == {"dead": "open", "fine": "closed"}
            age_keys(conn, queue, "2 hours")

    assert clean(dsn, retention_seconds=HOUR, watermark_retention_seconds=0) == Cleaned(key_states=3)

    assert key_states(dsn, "short") == set()
    assert query(dsn, "SELECT key, breaker_state FROM queueworker.key_state WHERE queue = 'long'") == [
        ("dead", "open")], "its cooldown (3 hours) is not over: the breaker holds"
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, keyed("short", {"dead": 3}) + keyed("long", {"dead": 3}))
        assert claim_keys(conn, "short") == ["dead"] * 3, "a new key: closed, not probed with one task"
        assert claim_keys(conn, "long") == [], "still open"
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_events WHERE queue = 'short' "
                       "AND change = 'key_breaker_half_open'") == 0


def test_a_claim_racing_the_deletion_starts_no_more_than_the_bucket_allows(dsn):
    """A key's tasks are enqueued while the cleaner deletes its (full) bucket, unseen by it; a
    claim reads the row before the deletion commits and charges it after: it waits for the
    deletion's row lock, then writes the bucket it read, less what it took. One more claim takes
    nothing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "race", per_key_rate_per_second=0.001, per_key_burst=2)
        enqueue_many(conn, keyed("race", {"k": 1}))
        assert claim_keys(conn, "race") == ["k"]
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE queue = 'race'")
        age_keys(conn, "race", "2 days")  # refilled at 0.001/s: full again
    with psycopg.connect(dsn) as cleaner, psycopg.connect(dsn, autocommit=True) as claimer:
        deleted = statements.fetch(cleaner, CLEAN_KEY_STATE, RetentionParams(retention_seconds=HOUR, limit=100))
        assert [row.queue for row in deleted] == ["race"], "deleted, not yet committed"
        enqueue_many(claimer, keyed("race", {"k": 5}))
        claimed: list[list[str]] = []
        claiming = threading.Thread(target=lambda: claimed.append(claim_keys(claimer, "race")))
        claiming.start()
        try:
            wait_until(lambda: scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s "
                                           "AND wait_event_type = 'Lock'", (claimer.info.backend_pid,)) == 1,
                       message="the claim to wait for the deletion's row lock")
        finally:
            cleaner.commit()
            claiming.join(30)
        assert claimed == [["k", "k"]], "the bucket it read: full, 2 tokens"
        assert claim_keys(claimer, "race") == [], "no more than the bucket allows"
    assert scalar(dsn, "SELECT floor(tokens) FROM queueworker.key_state WHERE queue = 'race' AND key = 'k'") == 0


def test_each_pass_deletes_in_batches_and_one_with_nothing_to_delete_reads_little(dsn, monkeypatch):
    """At most a batch per statement, repeated until a batch comes back short; a pass that finds
    nothing old reads the same few buffers at 100 keys and at 20,000 (the index of the keys' last
    activity: measured 2026-11-27, 23 and 22 buffers, against 225 at 20,000 without it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "many", failures=5, cooldown_seconds=60, per_key=True)
        report(conn, "many", {f"old-{n}": (True, 0) for n in range(5)})
        age_keys(conn, "many", "2 days")
        deleted = [len(statements.fetch(conn, CLEAN_KEY_STATE, RetentionParams(retention_seconds=DAY, limit=2)))
                   for _ in range(2)]
    assert deleted == [2, 2], "each at most its batch"
    monkeypatch.setattr(cleaner_module, "BATCH", 2)
    assert clean(dsn, retention_seconds=DAY, watermark_retention_seconds=0) == Cleaned(key_states=1)

    def buffers_of_a_pass(conn: psycopg.Connection) -> int:
        """The second of two passes: the first also reads the catalog to plan the function's query."""
        for _ in range(2):
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                "SELECT * FROM queueworker.clean_key_state(3600, 5000)").fetchone()[0][0]["Plan"]
        return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]

    with psycopg.connect(dsn, autocommit=True) as conn:
        report(conn, "many", {f"young-{n}": (True, 0) for n in range(100)})
        few = buffers_of_a_pass(conn)
        for start in range(100, 20_000, 5_000):
            report(conn, "many", {f"young-{n}": (True, 0) for n in range(start, start + 5_000)})
        conn.execute("ANALYZE queueworker.key_state")
        many = buffers_of_a_pass(conn)
    assert many <= few + 10, f"a pass over 20,000 young keys read {many} buffers, over 100 {few}"


def test_charging_buckets_and_reporting_outcomes_write_no_index_entry(dsn):
    """Every claim of a key-limited queue charges the bucket of each key it claims from, and every
    report of outcomes writes each key's health: heap-only (HOT) updates of key_state, which write no
    index entry. The retention's index reads the minute of a key's last activity (migration 024),
    which changes at most once a minute per key: at most one update per key here may not be HOT (a
    minute turning during the test). Version 23's index read the times themselves: none was HOT."""
    keys = ["a", "b", "c", "d"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "hot", per_key_rate_per_second=1000, per_key_burst=1000)
        operations.set_breaker(conn, "hot", failures=5, cooldown_seconds=60, per_key=True)
        enqueue_many(conn, keyed("hot", {key: 20 for key in keys}))
        assert sorted(claim_keys(conn, "hot", limit=4)) == keys  # the keys' rows are made
        report(conn, "hot", {key: (True, 0) for key in keys})  # and updated once

    def updates() -> tuple[int, int]:
        return query(dsn, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                          "WHERE schemaname = 'queueworker' AND relname = 'key_state'")[0]

    wait_until(lambda: updates()[0] >= len(keys), message="the rows' first updates counted")  # at its exit
    before = updates()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(10):
            assert sorted(claim_keys(conn, "hot", limit=4)) == keys
            report(conn, "hot", {key: (True, 0) for key in keys})
        conn.execute("SELECT pg_stat_force_next_flush()")
    wait_until(lambda: updates()[0] - before[0] >= 20 * len(keys), message="the 80 updates counted")
    written, hot = (after - then for after, then in zip(updates(), before))
    assert written == 20 * len(keys) and written - hot <= len(keys), f"{written} updates, {hot} of them HOT"


def test_one_worker_at_a_time_deletes_key_state(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "locked", failures=5, cooldown_seconds=60, per_key=True)
        report(conn, "locked", {"old": (True, 0)})
        age_keys(conn, "locked", "2 days")
    params = RetentionParams(retention_seconds=DAY, limit=100)
    with psycopg.connect(dsn, autocommit=True) as holder, psycopg.connect(dsn, autocommit=True) as conn:
        with holder.transaction():
            holder.execute("SELECT FROM queueworker.duty_locks WHERE duty = 'clean_key_state' FOR NO KEY UPDATE")
            assert statements.fetch(conn, CLEAN_KEY_STATE, params) == []
        assert len(statements.fetch(conn, CLEAN_KEY_STATE, params)) == 1


def test_a_real_worker_forgets_idle_keys_as_the_worker_role_and_no_other_role_may(installation):  # noqa: F811
    admin, login = installation.admin, installation.logins
    installation.install()
    with psycopg.connect(login["operator"], autocommit=True) as conn:
        operations.set_limits(conn, "scrape", per_key_rate_per_second=5, per_key_burst=1)
        operations.set_limits(conn, "scrape", key="kept-setting", max_running=1)
    with psycopg.connect(login["producer"], autocommit=True) as conn:
        enqueue_many(conn, keyed("scrape", {"gone-1": 1, "gone-2": 1, "kept-setting": 1}, task="qw.noop"))
    worker = WorkerProcess(login["worker"], "--queue", "scrape", "--retention-hours", "1",
                           "--cleaner-interval-seconds", "0.2")
    try:
        wait_until(lambda: scalar(admin, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 3,
                   message="the key's tasks")
        wait_until(lambda: scalar(admin, "SELECT count(*) FROM queueworker.key_state "
                                         "WHERE queue = 'scrape' AND last_success_at IS NOT NULL") == 3,
                   message="the keys' health reported")
        assert key_states(admin, "scrape") == {"gone-1", "gone-2", "kept-setting"}
        with psycopg.connect(admin, autocommit=True) as conn:
            age_keys(conn, "scrape", "2 hours")
        wait_until(lambda: "and the state of 3 keys idle for as long" in worker.log(), message="the cleaner's pass")
    finally:
        worker.stop()
    assert key_states(admin, "scrape") == set()
    assert query(admin, "SELECT key FROM queueworker.queue_keys WHERE queue = 'scrape'") == [("kept-setting",)]
    assert "permission denied" not in worker.log()
    for group in ("producer", "controller", "operator"):
        with psycopg.connect(login[group], autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM queueworker.clean_key_state(0, 100)")
