"""Per-key limits and per-key pause (docs/flow-control.md, migration 021): the defaults of every key
and a key's own settings are stored, audited and refused when bad; the claim of a key-limited queue
holds each key's cap and bucket exactly, and a held key loses its turn to the next key; a key's
pause stops only its tasks, and its tasks take their place in line anew when it ends; a worker of
the previous version claims nothing from a key-limited queue; and four real worker processes, one
of them killed and Postgres restarted under them, never exceed a key's cap or bucket."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import psycopg
import pytest

from queueworker import enqueue_many
from queueworker.client import operations
from queueworker.client.producer import TaskSpec
from queueworker.db import statements
from queueworker.db.flow import LIMITED_QUEUES, LimitedQueuesParams
from queueworker.db.lease import (
    CLAIM_FAIR, CLAIM_KEYS, CLAIM_LIMITED, CLAIM_LIMITED_FAIR, LOCK_KEYS, LOCK_QUEUE, ClaimParams, KeyClaimParams,
    LockQueueParams)
from queueworker.db.statements import Bound, Statement
from tests.support import FAST_LEASES, WorkerProcess, query, scalar, wait_until, worker_id_of
from tests.test_flow_control import most_beyond_the_rate, race_two_claims

pytestmark = pytest.mark.integration

HANDLERS = ("--handlers", "tests.flow_handlers")
# CLAIM_LIMITED_FAIR as a worker of schema version 20 runs it.
CLAIM_LIMITED_FAIR_V20 = (Path(__file__).parent / "fixtures" / "claim_limited_fair_v20.sql").read_text()


def params(queue: str, limit: int) -> ClaimParams:
    return ClaimParams(queue=queue, limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60)


def key_params(queue: str, limit: int) -> KeyClaimParams:
    """CLAIM_KEYS's parameters, for a worker that holds back no key itself."""
    return KeyClaimParams(queue=queue, limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60,
                          held_keys=[])


def claim_keys(conn: psycopg.Connection, queue: str, limit: int = 100) -> list[str]:
    """One claim of a key-limited queue as a worker makes it (LOCK_KEYS, then CLAIM_KEYS, in one
    transaction): the keys of the tasks claimed ('-' for none), in claim order."""
    with conn.transaction():
        statements.execute(conn, LOCK_KEYS, LockQueueParams(queue=queue))
        return [row.key or "-" for row in statements.fetch(conn, CLAIM_KEYS, key_params(queue, limit))]


def claim_with(conn: psycopg.Connection, statement: Statement, queue: str, limit: int = 100) -> list[int]:
    with conn.transaction():
        statements.execute(conn, LOCK_QUEUE, LockQueueParams(queue=queue))
        return [row.id for row in statements.fetch(conn, statement, params(queue, limit))]


def keyed(queue: str, counts: dict[str | None, int], task: str = "t", payload: dict | None = None) -> list[TaskSpec]:
    """Tasks of each key in turn (None: without a key), as many as `counts` says."""
    return [TaskSpec(task=task, queue=queue, key=key, payload=payload or {})
            for key, count in counts.items() for _ in range(count)]


def finish(dsn: str, queue: str, key: str | None) -> None:
    """Ends the running tasks of a key by hand (as their worker would)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE queue = %s "
                     "AND key IS NOT DISTINCT FROM %s AND state = 'running'", (queue, key))


def events(dsn: str, queue: str) -> list[tuple[str, dict]]:
    return query(dsn, "SELECT change, detail FROM queueworker.queue_events WHERE queue = %s ORDER BY id", (queue,))


# -- settings -------------------------------------------------------------------------------------

def test_per_key_settings_are_stored_audited_shown_and_make_the_queue_keyed(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [TaskSpec(task="t", queue="shop")] * 3)  # a backlog without keys
        row = operations.set_limits(conn, "shop", per_key_rate_per_second=2.5, per_key_max_running=4)
        assert (row.key_rate_per_second, row.key_burst, row.key_max_running, row.key_limited, row.limited) == (
            2.5, 3, 4, True, True)
        key = operations.set_limits(conn, "shop", key="tenant-1", rate_per_second=10, max_running=1, weight=2)
        assert (key.rate_per_second, key.burst, key.max_running, key.weight) == (10, 10, 1, 2)
        assert operations.pause(conn, "shop", key="tenant-2", seconds=600).paused
        assert operations.resume(conn, "shop", key="tenant-2") is not None
        assert operations.resume(conn, "shop", key="tenant-2") is None, "not paused any more"
        cleared = operations.set_limits(conn, "shop", key="tenant-1")
        assert cleared.max_running == 1, "the settings it had"
        assert operations.set_limits(conn, "shop", key="tenant-1") is None
        keys_left = operations.key_settings(conn, "shop")
    assert keys_left == []
    assert scalar(dsn, "SELECT keyed FROM queueworker.queues WHERE name = 'shop'"), "key-limited: keyed"
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks_active WHERE queue = 'shop' AND fair_tag IS NULL") == 0, \
        "its backlog tagged, in the statement that made it key-limited"
    changes = events(dsn, "shop")
    assert [change for change, _ in changes] == ["limits", "keyed", "key_limits", "key_paused", "key_resumed",
                                                 "key_cleared"], changes
    assert changes[0][1] == {"key_rate_per_second": 2.5, "key_burst": 3, "key_max_running": 4,
                             "breaker_state": "closed", "consecutive_failures": 0}
    assert changes[2][1] == {"key": "tenant-1", "weight": 2, "rate_per_second": 10, "burst": 10, "max_running": 1}
    shown = subprocess.run([sys.executable, "-m", "queueworker.cli", "status", "--queue", "shop", "--dsn", dsn],
                           capture_output=True, text=True, timeout=60)
    assert "per key: rate 2.5/s (burst 3), at most 4 running" in shown.stdout, shown.stdout + shown.stderr


BAD_SETTINGS = [
    (dict(per_key_rate_per_second=math.nan), "per_key_rate_per_second"),
    (dict(per_key_rate_per_second=math.inf), "per_key_rate_per_second"),
    (dict(per_key_rate_per_second=0), "per_key_rate_per_second"),
    (dict(per_key_rate_per_second=-1), "per_key_rate_per_second"),
    (dict(per_key_rate_per_second=2e6), "per_key_rate_per_second"),
    (dict(per_key_rate_per_second=True), "per_key_rate_per_second"),
    (dict(per_key_burst=5), "per_key_burst needs a rate"),
    (dict(per_key_rate_per_second=5, per_key_burst=0), "per_key_burst"),
    (dict(per_key_max_running=0), "per_key_max_running"),
    (dict(per_key_max_running=2.5), "per_key_max_running"),
    (dict(per_key_max_running=10**7), "per_key_max_running"),
    (dict(key="k", rate_per_second=math.nan), "rate_per_second"),
    (dict(key="k", burst=3), "burst needs a rate"),
    (dict(key="k", max_running=-3), "max_running"),
    (dict(key="k", weight=math.inf), "weight"),
    (dict(key="k", per_key_max_running=3), "without a key"),
    (dict(key="a\x00b", max_running=3), "the key"),
    (dict(key="a\nb", max_running=3), "the key"),
    (dict(key="", max_running=3), "the key"),
    (dict(key="k" * 257, max_running=3), "the key"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS, ids=[str(n) for n in range(len(BAD_SETTINGS))])
def test_bad_per_key_settings_are_refused_and_change_nothing(dsn, settings, message):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(ValueError, match=message) as refused:
            operations.set_limits(conn, "q", **settings)
        for bad_key in ("a\x00b", "a\x1bb"):
            with pytest.raises(ValueError, match="the key"):
                operations.pause(conn, "q", key=bad_key)
        with pytest.raises(ValueError, match="pause for"):
            operations.pause(conn, "q", key="k", seconds=math.nan)
    assert "\n" not in str(refused.value) and "\x00" not in str(refused.value)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_events") == 0
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queues") == 0
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_keys") == 0


@pytest.mark.parametrize("args", [
    ["--per-key-rate", "nan/s"], ["--per-key-rate", "0/s"], ["--per-key-burst", "3"],
    ["--per-key-concurrency", "0"], ["--key", "a\x1b[31mb", "--concurrency", "2"], ["--key", "k"],
    ["--key", "k", "--per-key-concurrency", "2"], ["--key", "k", "--rate", "inf/s"]])
def test_the_cli_refuses_bad_per_key_settings_in_one_line(dsn, args):
    done = subprocess.run([sys.executable, "-m", "queueworker.cli", "limit", "q", *args, "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert len(done.stderr.strip().splitlines()) == 1 and "\x1b" not in done.stderr, done.stderr
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_events") == 0


def test_the_cli_sets_pauses_and_resumes_a_key(dsn):
    def qw(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "queueworker.cli", *args, "--dsn", dsn],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    assert "per key: rate 5/s (burst 5), at most 2 running" in qw(
        "limit", "cli", "--per-key-rate", "300/m", "--per-key-concurrency", "2")
    assert "rate 1/s (burst 4), at most 1 running; weight 2" in qw(
        "limit", "cli", "--key", "k", "--rate", "1/s", "--burst", "4", "--concurrency", "1", "--weight", "2")
    assert "paused until" in qw("pause", "cli", "--key", "k", "--for", "10m")
    assert "paused" not in qw("resume", "cli", "--key", "k")
    assert "it had no settings" not in qw("limit", "cli", "--key", "k", "--clear")
    assert [change for change, _ in events(dsn, "cli")] == ["limits", "keyed", "key_limits", "key_paused",
                                                            "key_resumed", "key_cleared"]


# -- the claim ------------------------------------------------------------------------------------

def test_the_claim_holds_each_keys_cap_and_a_held_key_loses_its_turn(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "capped", per_key_max_running=2)
        enqueue_many(conn, keyed("capped", {"big": 50}))
        enqueue_many(conn, keyed("capped", {"small": 3, None: 3}))
        operations.set_limits(conn, "capped", key="solo", max_running=1)
        enqueue_many(conn, keyed("capped", {"solo": 3}))
        assert Counter(claim_keys(conn, "capped")) == {"big": 2, "small": 2, "-": 2, "solo": 1}
        assert claim_keys(conn, "capped") == [], "every key at its cap: nothing, however many wait"
        finish(dsn, "capped", "big")
        # The line starts with big's tasks, and big is at its cap again after two: the claim passes
        # over the rest of them to the next keys' (none here: they are all held), never beyond.
        assert claim_keys(conn, "capped") == ["big", "big"]
        finish(dsn, "capped", "small")
        finish(dsn, "capped", None)
        assert Counter(claim_keys(conn, "capped", 10)) == {"small": 1, "-": 1}, "what they have left"
    running = dict(query(dsn, "SELECT coalesce(key, '-'), count(*) FROM queueworker.tasks WHERE queue = 'capped' "
                              "AND state = 'running' GROUP BY 1"))
    assert running == {"big": 2, "solo": 1, "small": 1, "-": 1}


def test_a_paused_or_rate_limited_key_loses_its_turn_to_the_next_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, keyed("turns", {"first": 100}))  # at the head of the line
        enqueue_many(conn, keyed("turns", {"second": 5}))
        operations.pause(conn, "turns", key="first")
        assert claim_keys(conn, "turns", 3) == ["second"] * 3, "paused: its tasks are passed over"
        operations.resume(conn, "turns", key="first")
        operations.set_limits(conn, "turns", per_key_rate_per_second=0.001, per_key_burst=2)
        assert Counter(claim_keys(conn, "turns", 10)) == {"first": 2, "second": 2}, "each key's burst, no more"
        assert claim_keys(conn, "turns", 10) == [], "both out of tokens for the next 1000 s"
        enqueue_many(conn, keyed("turns", {"third": 1}))
        assert claim_keys(conn, "turns", 10) == ["third"], "a new key is not held by the others' buckets"
    tokens = dict(query(dsn, "SELECT key, tokens FROM queueworker.key_state WHERE queue = 'turns'"))
    assert {key: math.floor(left) for key, left in tokens.items()} == {"first": 0, "second": 0, "third": 1}


def test_a_resumed_key_takes_its_place_in_line_anew(dsn):
    """While a key is paused the other keys go on; when it is resumed, its tasks queue behind the
    others' current turn instead of all coming first (their old tags were the smallest)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, keyed("back", {"paused": 10}))
        enqueue_many(conn, keyed("back", {"a": 10, "b": 10}))
        operations.pause(conn, "back", key="paused")
        assert len(claim_keys(conn, "back", 10)) == 10
        operations.resume(conn, "back", key="paused")
        order = claim_keys(conn, "back", 9)
    assert Counter(order) == {"paused": 3, "a": 3, "b": 3}, order


def test_a_task_claimed_while_its_key_is_resumed_keeps_the_tag_its_cap_counts(dsn):
    """The resume reads the key's waiting tasks, then clears their tags to give new ones; a task a
    claim took in between (here the claim holds it, the resume waits for it) must keep its tag:
    the running tasks of a key are counted by it, and a cleared one would let a key exceed its cap."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "resumed", per_key_max_running=1)
        taken, *_ = enqueue_many(conn, keyed("resumed", {"k": 3}))
        operations.pause(conn, "resumed", key="k")
    with psycopg.connect(dsn) as claimer:
        claimer.execute("UPDATE queueworker.tasks_active SET state = 'running', fair_tag = -fair_tag, "
                        "lease_owner = gen_random_uuid(), leased_until = now() + interval '1 minute', "
                        "deadline_at = now() + interval '1 minute', started_at = now() WHERE id = %s",
                        (taken,))  # as a claim does, its transaction still open
        resumer = threading.Thread(target=lambda: operations.resume(psycopg.connect(dsn, autocommit=True),
                                                                    "resumed", key="k"))
        resumer.start()
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                       "AND datname = current_database()"), message="the resume to wait")
        claimer.commit()
        resumer.join(30)
    assert scalar(dsn, "SELECT fair_tag < 0 FROM queueworker.tasks WHERE id = %s", (taken,)), "still counted"
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert claim_keys(conn, "resumed") == [], "k is at its cap"


def test_a_claim_that_waited_for_the_queue_counts_the_keys_claimed_before_it(dsn):
    """As for the queue's own cap (tests/test_flow_control.py): B's claim waits for A's lock, and
    once A commits, B must see A's tasks of each key, since CLAIM_KEYS runs after LOCK_KEYS."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "race", per_key_max_running=2, per_key_rate_per_second=100, per_key_burst=3)
        enqueue_many(conn, keyed("race", {"a": 10, "b": 10}))
    claim = key_params("race", 10)
    assert race_two_claims(dsn, Bound(LOCK_KEYS, LockQueueParams(queue="race")), CLAIM_KEYS, claim) == (4, 0)


def test_a_worker_of_the_previous_version_claims_nothing_from_a_key_limited_queue(dsn):
    """A worker not yet upgraded reads `limited` and `keyed` and runs the CLAIM_LIMITED_FAIR it knows
    (kept in tests/fixtures as it was), or CLAIM_LIMITED if it has not heard the queue is keyed yet:
    neither takes anything while the queue is key-limited, and both work again once it is not."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "rolling", per_key_max_running=1)
        enqueue_many(conn, keyed("rolling", {"a": 5, "b": 5}))
        old = Statement("lease.claim_limited_fair_v20", CLAIM_LIMITED_FAIR_V20, ClaimParams, CLAIM_LIMITED.row)
        for statement in (old, CLAIM_LIMITED, CLAIM_LIMITED_FAIR, CLAIM_FAIR):
            assert claim_with(conn, statement, "rolling") == [], statement.name
        assert scalar(dsn, "SELECT count(*) FROM queueworker.task_events WHERE to_state = 'running'") == 0
        assert Counter(claim_keys(conn, "rolling")) == {"a": 1, "b": 1}
        operations.set_limits(conn, "rolling", max_running=3)  # limited, no longer key-limited
        assert len(claim_with(conn, old, "rolling")) == 1, "the cap of 3 less the 2 running"


def test_a_worker_comes_back_when_the_fastest_keys_next_token_is_due(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "tokens", per_key_rate_per_second=2)
        operations.set_limits(conn, "tokens", key="fast", rate_per_second=8)
        row, = statements.fetch(conn, LIMITED_QUEUES, LimitedQueuesParams(queues=["tokens"]))
    assert (row.key_limited, row.fastest_key_rate) == (True, 8)


def claim_keys_buffers(conn: psycopg.Connection, queue: str) -> int:
    """Shared buffers (hit + read) a claim of 10 tasks of a key-limited queue touches, from EXPLAIN
    (ANALYZE, BUFFERS), in a transaction rolled back so that each measure claims from the same rows."""
    with conn.transaction(force_rollback=True):
        statements.execute(conn, LOCK_KEYS, LockQueueParams(queue=queue))
        plan, = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_KEYS.text,
                             key_params(queue, 10).__dict__).fetchone()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def test_the_key_limited_claim_costs_the_same_at_a_hundred_keys_and_at_ten_thousand(dsn):
    """10,000 tasks in 100 keys of 100 or in 10,000 keys of 1, every key with a setting of its own
    and a bucket charged before: the claim reads about the same buffers (the head of the line and
    one probe per key met there), where one that read every key's settings or bucket would read
    a hundred times more."""
    measured = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for keys in (100, 10_000):
            queue = f"keys-{keys}"
            operations.set_limits(conn, queue, per_key_rate_per_second=1e6, per_key_burst=1_000_000,
                                  per_key_max_running=1_000_000)
            enqueue_many(conn, [TaskSpec(task="t", queue=queue, key=f"k{n % keys}") for n in range(10_000)])
            conn.execute("INSERT INTO queueworker.queue_keys (queue, key, weight) "
                         "SELECT %s, 'k' || n, 1 FROM generate_series(0, %s - 1) AS n", (queue, keys))
            conn.execute("INSERT INTO queueworker.key_state (queue, key, tokens, tokens_at) "
                         "SELECT %s, 'k' || n, 1000, now() FROM generate_series(0, %s - 1) AS n", (queue, keys))
            conn.execute("VACUUM ANALYZE queueworker.tasks_active, queueworker.queue_keys, queueworker.key_state")
            claim_keys_buffers(conn, queue)  # warm
            measured[keys] = min(claim_keys_buffers(conn, queue) for _ in range(3))
    print(f"buffers of the key-limited claim of 10 tasks: {measured}")
    assert measured[10_000] <= 2 * measured[100] + 50, measured


def test_a_workers_settings_refresh_finds_the_fastest_key_rate_in_one_probe(dsn):
    """LIMITED_QUEUES, which every worker of a key-limited queue runs every few seconds, reads about
    the same buffers whether 100 or 10,000 keys have a rate of their own, and finds the fastest."""
    measured = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for keys in (100, 10_000):
            queue = f"rates-{keys}"
            operations.set_limits(conn, queue, per_key_max_running=5)
            conn.execute("INSERT INTO queueworker.queue_keys (queue, key, weight, rate_per_second, burst) "
                         "SELECT %s, 'k' || n, 1, 1 + n %% 50, 10 FROM generate_series(1, %s) AS n", (queue, keys))
            conn.execute("VACUUM ANALYZE queueworker.queue_keys")
            params = LimitedQueuesParams(queues=[queue])
            (row,) = statements.fetch(conn, LIMITED_QUEUES, params)
            assert row.fastest_key_rate == 50.0
            plan, = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + LIMITED_QUEUES.text,
                                 params.__dict__).fetchone()
            top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
            measured[keys] = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    print(f"buffers of a settings refresh: {measured}")
    assert measured[10_000] <= 2 * measured[100] + 10, measured


def test_a_claim_whose_keys_are_all_at_their_cap_reads_the_head_of_the_line_not_the_backlog(dsn):
    """Every key of the queue at its cap (1 running each): the claim finds nothing to take, and it
    reads about the same buffers behind 2,000 waiting tasks and behind 20,000. Its safety net for
    untagged tasks looked for them among all the queue's waiting tasks when the tagged ones it read
    were all held: a scan of the whole backlog at every claim while the caps bind."""
    measured = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for tasks in (2_000, 20_000):
            queue = f"capped-{tasks}"
            operations.set_limits(conn, queue, per_key_max_running=1)
            enqueue_many(conn, [TaskSpec(task="t", queue=queue, key=f"k{n % 10}") for n in range(tasks)])
            conn.execute("VACUUM ANALYZE queueworker.tasks_active")
            assert sorted(claim_keys(conn, queue)) == [f"k{n}" for n in range(10)]
            claim_keys_buffers(conn, queue)  # warm
            measured[tasks] = min(claim_keys_buffers(conn, queue) for _ in range(3))
            assert claim_keys(conn, queue) == []
    print(f"buffers of a key-limited claim with every key at its cap: {measured}")
    assert measured[20_000] <= 2 * measured[2_000] + 50, measured


# -- real workers -----------------------------------------------------------------------------

def most_running_per_key(lines: list[str], stopped_at: float) -> dict[str, int]:
    """The most handlers of each key that ran at once, from the handlers' log; a handler whose
    worker was killed (a start without an end before its task started again, or at all) ran until
    the kill."""
    edges: dict[str, list[tuple[float, int]]] = defaultdict(list)
    open_runs: dict[str, str] = {}  # task id -> key, of the handlers started and not ended
    for line in lines:
        at, step, task_id, key = line.split()
        if int(step) == 1 and task_id in open_runs:
            edges[key].append((stopped_at, -1))
        edges[key].append((float(at), int(step)))
        if int(step) == 1:
            open_runs[task_id] = key
        else:
            del open_runs[task_id]
    for key in open_runs.values():
        edges[key].append((stopped_at, -1))
    most = {}
    for key, steps in edges.items():
        running = peak = 0
        for _, step in sorted(steps):  # ends before starts at one instant
            running += step
            peak = max(peak, running)
        most[key] = peak
    return most


def stop_one_holding_a_task(dsn: str, workers: list[WorkerProcess]) -> WorkerProcess:
    """Stops one of the worker processes (SIGSTOP) at a moment it holds a running task, and returns
    it: a kill then leaves that task to be rescued. Whichever holds one: the keys' caps and buckets,
    not the workers, bound how many tasks run, so an idle worker may lose every claim to busier ones
    (a claim of theirs follows each task they finish) while the others drain the queue."""
    owners = {worker_id_of(dsn, worker.pid): worker for worker in workers}

    def holder() -> str | None:
        return scalar(dsn, "SELECT lease_owner::text FROM queueworker.tasks WHERE state = 'running' "
                           "AND lease_owner::text = ANY(%s) LIMIT 1", (list(owners),))
    while True:
        owner = wait_until(holder, timeout=60, message="a worker to hold a task")
        worker = owners[owner]
        worker.signal(signal.SIGSTOP)
        if scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running' AND lease_owner::text = %s",
                  (owner,)):
            return worker
        worker.signal(signal.SIGCONT)


def test_four_workers_never_exceed_a_keys_cap_or_bucket_through_a_kill_and_a_postgres_restart(
        dsn, local_postgres, tmp_path):
    """Four worker processes of ten slots each, six keys (one of them the tasks without a key),
    each key capped at 2 running and 8 starts a second with a burst of 2, one key allowed 1 running
    of its own. One worker is SIGKILLed mid-run and Postgres restarted mid-run; every task ends,
    and, from the audit trail, no key ever started more than its bucket allows in any window, and,
    from the handlers' log, no key ever had more handlers running than its cap."""
    log, hold = tmp_path / "handlers.log", 0.15
    rate, burst, per_key = 8, 2, 40
    keys = {"k1": per_key, "k2": per_key, "k3": per_key, "k4": per_key, "solo": per_key, None: per_key}
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "metered", per_key_rate_per_second=rate, per_key_burst=burst,
                              per_key_max_running=2)
        operations.set_limits(conn, "metered", key="solo", rate_per_second=rate, burst=burst, max_running=1)
        ids = enqueue_many(conn, keyed("metered", keys, task="flow.keyed_hold",
                                       payload={"seconds": hold, "log": str(log)}))
    workers = [WorkerProcess(dsn, "--queue", "metered", "--concurrency", "10", *FAST_LEASES, *HANDLERS)
               for _ in range(4)]

    def succeeded() -> int:
        return scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE queue = 'metered' AND state = 'succeeded'")
    try:
        wait_until(lambda: succeeded() >= 40, timeout=60, message="progress before the kill")
        victim = stop_one_holding_a_task(dsn, workers)
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        killed_at = time.time()
        wait_until(lambda: succeeded() >= 100, timeout=60, message="progress before the restart")
        local_postgres.restart()
        wait_until(lambda: succeeded() == len(ids), timeout=180, message="every task to succeed")
    finally:
        for worker in workers:
            worker.stop()
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE rescues > 0") > 0, "the killed worker's, rescued"
    most = most_running_per_key(log.read_text().splitlines(), killed_at)
    print(f"most handlers running at once per key: {most}")
    assert most["solo"] <= 1 and all(peak <= 2 for peak in most.values()), most
    assert max(most.values()) == 2, "the cap is reached: it is what held the keys"
    for key in ("k1", "k2", "k3", "k4", "solo", "-"):
        times = [at for at, in query(dsn, """
            SELECT extract(epoch FROM e.at)::float8 FROM queueworker.task_events e JOIN queueworker.tasks t
            ON t.id = e.task_id WHERE t.queue = 'metered' AND coalesce(t.key, '-') = %s AND e.to_state = 'running'
            ORDER BY e.at""", (key,))]
        assert len(times) >= per_key
        beyond = most_beyond_the_rate(times, rate)
        print(f"key {key}: {len(times)} starts, at most {beyond:.2f} beyond {rate}/s in any window")
        # As for the queue's bucket: less than one whole task of slack (a claim's time is its
        # transaction's start, a little before it took the queue's lock).
        assert beyond < burst + 1, (key, beyond)


def test_pausing_a_key_holds_only_its_tasks_with_real_workers_and_a_timed_pause_ends_by_itself(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.pause(conn, "held", key="stopped")
        ids = enqueue_many(conn, keyed("held", {"stopped": 20, "going": 20, None: 20}, task="qw.noop"))
    workers = [WorkerProcess(dsn, "--queue", "held", "--concurrency", "5") for _ in range(2)]

    def done(key: str | None) -> int:
        return scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE queue = 'held' AND state = 'succeeded' "
                           "AND key IS NOT DISTINCT FROM %s", (key,))
    try:
        wait_until(lambda: done("going") == 20 and done(None) == 20, timeout=60, message="the other keys' tasks")
        assert done("stopped") == 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            operations.pause(conn, "held", key="stopped", seconds=0.5)
        wait_until(lambda: done("stopped") == 20, timeout=60, message="the key's tasks once its pause ended")
    finally:
        for worker in workers:
            worker.stop()
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == len(ids)
    assert [change for change, _ in events(dsn, "held")][-2:] == ["key_paused", "key_resumed"]
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_keys") == 0, "the pause, ended by a claim, is gone"
