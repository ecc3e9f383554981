"""The database's connection budget, shared by the QueueWorkers whose workers use one database.

Each depth read brings the server's side (queueworker.db.depth: max_connections less the reserved
slots, and the client backends of other roles, counted by role). What one QueueWorker's workers
may hold is that, less the controller's own connections to the database and what the other
QueueWorkers on it hold now: their current replicas, or the replicas they just decided on if
more. The shares are taken in turn: a tick works out its budget (`with_budget`), decides, and
records what it holds (`hold`) with no await between, so of QueueWorkers whose reads return
together the first takes its share and the next sees it taken. docs/controller.md, "The
database's connection budget", says why.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace

from queueworker.scaling.policy import QueueDepth

from .queuedb import CONTROLLER_CONNECTIONS


class ConnectionShares:
    """The connections each QueueWorker's workers hold, per database (connection URL)."""

    def __init__(self) -> None:
        self._held: dict[str, dict[Hashable, int]] = {}  # dsn -> owner -> connections
        self._totals: dict[str, int] = {}  # dsn -> the sum of its owners' connections
        self._dsn_of: dict[Hashable, str] = {}

    def with_budget(self, dsn: str, owner: Hashable, depth: QueueDepth, max_connections: int | None) -> QueueDepth:
        """`depth` with the connections `owner`'s workers may hold: the server's limit less the other
        roles' connections, the controller's own and the other QueueWorkers' on `dsn`, at most
        `max_connections` (spec.database.maxConnections). The workers `owner` runs now are left
        out: they are what the budget is for."""
        if depth.connection_limit is None:
            return depth
        others = self._totals.get(dsn, 0) - self._held.get(dsn, {}).get(owner, 0)
        budget = depth.connection_limit - depth.other_role_connections - CONTROLLER_CONNECTIONS - others
        if max_connections is not None:
            budget = min(budget, max_connections)
        return replace(depth, connection_budget=max(0, budget))

    def hold(self, dsn: str, owner: Hashable, connections: int) -> None:
        """`owner`'s workers hold (or are about to hold) `connections` of `dsn`'s; whatever it held
        elsewhere is forgotten."""
        if self._dsn_of.get(owner) != dsn:
            self.release(owner)
            self._dsn_of[owner] = dsn
        held = self._held.setdefault(dsn, {})
        self._totals[dsn] = self._totals.get(dsn, 0) - held.get(owner, 0) + connections
        held[owner] = connections

    def release(self, owner: Hashable) -> None:
        """`owner` is gone, or reads no database now."""
        dsn = self._dsn_of.pop(owner, None)
        if dsn is None:
            return
        self._totals[dsn] -= self._held[dsn].pop(owner)
        if not self._held[dsn]:
            del self._held[dsn], self._totals[dsn]
