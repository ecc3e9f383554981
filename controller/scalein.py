"""Lease-aware scale-in: price worker pods so the ReplicaSet removes idle ones first.

The ReplicaSet deletes pods with the lowest `controller.kubernetes.io/pod-deletion-cost` first
(among pods equally ready). Costs are written right before replicas are lowered, from the
`workers` table: draining pods cheapest, idle pods next, busy pods dearer with every lease they
hold and, at equal counts, with the age of their oldest lease.
"""

from __future__ import annotations

from collections.abc import Iterable

from .queuedb import WorkerLease

DRAINING_COST = -100
IDLE_COST = 0
PER_LEASE_COST = 1000
MAX_AGE_COST = 999


def deletion_costs(pod_names: Iterable[str], leases: Iterable[WorkerLease]) -> dict[str, int]:
    """A cost per pod; pods without a `workers` row (still starting) count as idle."""
    by_pod: dict[str, int] = {}
    for lease in leases:
        if lease.draining:
            cost = DRAINING_COST
        elif lease.running == 0:
            cost = IDLE_COST
        else:
            cost = PER_LEASE_COST * lease.running + min(int(lease.oldest_lease_age_seconds or 0), MAX_AGE_COST)
        by_pod[lease.pod_name] = max(cost, by_pod.get(lease.pod_name, DRAINING_COST))
    return {pod: by_pod.get(pod, IDLE_COST) for pod in pod_names}
