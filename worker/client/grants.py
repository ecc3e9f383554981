"""Queue grants: which queues a producer login may use (docs/security.md, "Queue grants").

A grant gives a database role, and every login that is a member of it, the queues whose names match
a glob (`billing.*`). Until the first grant is made every producer may use every queue, so an
installation with one application needs no set-up; once one exists, a producer login may enqueue
into, read, replace, depend on and start runs over only the queues its grants match. Logins that
run queueworker itself (the schema's owner, and members of queueworker_worker, queueworker_controller
and queueworker_operator) are not bound by grants. Granting and revoking is the operator's.

Each call runs in the caller's transaction (inside a savepoint when one is open), like `enqueue`.
"""

from __future__ import annotations

import re

import psycopg

from ..db import statements
from ..db.grants import GRANT_QUEUE, QUEUE_GRANTS, REVOKE_QUEUE, GrantParams, QueueGrantRow
from ..db.statements import NO_PARAMS

# The database checks the same (migration 016's CHECK and queueworker.grant_queue); checking here first
# gives the Python caller a ValueError before any round trip.
PATTERN = re.compile(r"[A-Za-z0-9_.:*?-]{1,128}")
ROLE_NAME_LIMIT = 63  # Postgres's NAMEDATALEN - 1


def grant_queue(conn: psycopg.Connection, role: str, pattern: str) -> bool:
    """Gives `role` (and its members) the queues matching `pattern`; False if it had that grant."""
    params = _grant(role, pattern)
    with conn.transaction():
        return statements.fetch(conn, GRANT_QUEUE, params)[0].added


def revoke_queue(conn: psycopg.Connection, role: str, pattern: str) -> bool:
    """Removes exactly that grant; False if there was none. A role whose last grant goes is left with
    no queue while other grants exist."""
    params = _grant(role, pattern)
    with conn.transaction():
        return statements.fetch(conn, REVOKE_QUEUE, params)[0].removed


def queue_grants(conn: psycopg.Connection) -> list[QueueGrantRow]:
    """Every grant, by role and pattern."""
    return statements.fetch(conn, QUEUE_GRANTS, NO_PARAMS)


def _grant(role: str, pattern: str) -> GrantParams:
    if not isinstance(role, str) or not 1 <= len(role) <= ROLE_NAME_LIMIT or "\x00" in role:
        raise ValueError(f"a role name is 1 to {ROLE_NAME_LIMIT} characters, not {role!r:.80}")
    if not isinstance(pattern, str) or not PATTERN.fullmatch(pattern):
        raise ValueError(f"a queue pattern is 1 to 128 of letters, digits, _.:- and the wildcards * and ?, "
                         f"not {pattern!r:.140}")
    return GrantParams(role=role, pattern=pattern)
