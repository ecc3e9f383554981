"""Prometheus metrics of the controller, labelled by QueueWorker (namespace, name)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

OBJECT = ("namespace", "name")

desired_replicas = Gauge("queueworker_controller_desired_replicas", "Replicas the last decision asked for", OBJECT)
replicas = Gauge("queueworker_controller_replicas", "spec.replicas of the worker Deployment", OBJECT)
queue_depth = Gauge("queueworker_controller_queue_depth", "Tasks by state as last read (ready and retrying capped)",
                    (*OBJECT, "state"))
queue_keys = Gauge("queueworker_controller_queue_keys", "Per-key limits: keys with tasks ready, and those of them "
                   "held (paused or behind an open breaker), as last read; one series per state, never per key",
                   (*OBJECT, "state"))
key_slots = Gauge("queueworker_controller_key_slots", "Per-key limits: the tasks the keys let run at once, as last "
                  "read (absent while they bound nothing)", OBJECT)
decisions = Counter("queueworker_controller_decisions_total", "Scaling decisions by reason", (*OBJECT, "reason"))
scales = Counter("queueworker_controller_scale_total", "Replica changes applied", (*OBJECT, "direction"))
errors = Counter("queueworker_controller_errors_total", "Ticks that could not read or act, by reason",
                 (*OBJECT, "reason"))
tick_seconds = Histogram("queueworker_controller_tick_duration_seconds", "Duration of one scaling tick",
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
databases = Gauge("queueworker_controller_databases", "Databases with an open pool and listener (in use by a "
                  "QueueWorker)")
leader = Gauge("queueworker_controller_leader", "1 while this replica holds the leader election Lease (and acts)")

# Every metric labelled per QueueWorker, with the label names that follow (namespace, name).
PER_OBJECT: tuple[tuple[MetricWrapperBase, tuple[str, ...]], ...] = (
    (desired_replicas, ()), (replicas, ()), (queue_depth, ("state",)), (queue_keys, ("state",)), (key_slots, ()),
    (decisions, ("reason",)),
    (scales, ("direction",)), (errors, ("reason",)),
)


def forget(namespace: str, name: str) -> None:
    """Drops every series of a deleted QueueWorker, whatever its other labels (reasons, states)."""
    for metric, extra in PER_OBJECT:
        label_sets = {tuple(sample.labels[label] for label in extra)
                      for family in metric.collect() for sample in family.samples
                      if sample.labels.get("namespace") == namespace and sample.labels.get("name") == name}
        for values in label_sets:
            metric.remove(namespace, name, *values)
