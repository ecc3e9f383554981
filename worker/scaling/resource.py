"""The QueueWorker custom resource: its identity and the status fields the controller writes.

Defined once, here, for both sides: the controller (queueworker_controller) serves the resource and
writes its status; the console (queueworker.console.cluster) lists QueueWorkers and shows their
last decisions. The controller depends on this package, never the reverse, so the definitions live
on this side. crds/queueworker.dev_queueworkers.yaml (and the chart, which renders that file)
declares the same names: tests/test_crd.py and tests/test_chart.py hold them to this module.
"""

from __future__ import annotations

GROUP = "queueworker.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "QueueWorker"
PLURAL = "queueworkers"
SINGULAR = "queueworker"
SHORT_NAMES = ("qw",)
CATEGORIES = ("queueworker",)
CRD_NAME = f"{PLURAL}.{GROUP}"


class StatusField:
    """The fields of `status`."""

    OBSERVED_GENERATION = "observedGeneration"
    DEPLOYMENT = "deployment"  # the owned worker Deployment's name
    SCALE_TARGET = "scaleTarget"  # Kind/name of a scaleTargetRef, instead of `deployment`
    REPLICAS = "replicas"
    DESIRED_REPLICAS = "desiredReplicas"
    READY_REPLICAS = "readyReplicas"
    TASKS_PER_REPLICA = "tasksPerReplica"
    QUEUE_DEPTH = "queueDepth"  # an object: QueueDepthField
    LAST_SCALE_TIME = "lastScaleTime"
    LAST_ACTIVE_TIME = "lastActiveTime"
    LAST_POLL_TIME = "lastPollTime"
    REASON = "reason"
    MESSAGE = "message"
    RECOMMENDATIONS = "recommendations"  # a list of {time, replicas}
    CONDITIONS = "conditions"


class QueueDepthField:
    """The fields of `status.queueDepth`."""

    READY = "ready"
    RUNNING = "running"
    RETRYING = "retrying"
    BLOCKED = "blocked"
    DUE_SOON = "dueSoon"
    OLDEST_READY_AGE_SECONDS = "oldestReadyAgeSeconds"
    FINISH_RATE = "finishRate"  # with throughputFloor only
    RECENT_TASK_SECONDS = "recentTaskSeconds"  # with throughputFloor only
    KEY_SLOTS = "keySlots"  # with per-key limits only, when they bound what the keys may run
    KEYS_READY = "keysReady"  # with per-key limits only
    KEYS_HELD = "keysHeld"  # with per-key limits only
    CONNECTION_BUDGET = "connectionBudget"  # the connections this QueueWorker's workers may hold, when read

