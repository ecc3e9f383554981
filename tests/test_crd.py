"""The CRD manifest: structural, documented, and in agreement with the controller's defaults."""

from __future__ import annotations

from pathlib import Path

import yaml

from queueworker_controller.spec import QueueWorkerSpec, Scaling

CRD_PATH = Path(__file__).resolve().parent.parent / "crds" / "queueworker.dev_queueworkers.yaml"


def load_crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


def version() -> dict:
    (v1alpha1,) = load_crd()["spec"]["versions"]
    return v1alpha1


def spec_schema() -> dict:
    return version()["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_names():
    crd = load_crd()
    assert crd["metadata"]["name"] == "queueworkers.queueworker.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == \
        ("QueueWorker", "queueworkers", ["qw"], ["queueworker"])
    assert version()["subresources"] == {"status": {}}


def test_every_spec_field_is_described():
    def walk(schema: dict, path: str):
        for name, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{path}.{name} has no description (kubectl explain shows it)"
            walk(prop, f"{path}.{name}")
    walk(spec_schema(), "spec")


def test_schema_defaults_match_the_controller():
    props = spec_schema()["properties"]
    minimal = QueueWorkerSpec.from_dict({"queue": "q", "image": "i", "database": {"secretRef": {"name": "s"}}})
    assert props["concurrency"]["default"] == minimal.concurrency
    assert props["leaseSeconds"]["default"] == minimal.lease_seconds
    assert props["drainSeconds"]["default"] == minimal.drain_seconds
    assert props["metricsPort"]["default"] == minimal.metrics_port
    assert props["database"]["properties"]["secretRef"]["properties"]["key"]["default"] == minimal.secret_key
    scaling = props["scaling"]["properties"]
    defaults = Scaling()
    for attr, key in [("min_replicas", "minReplicas"), ("max_replicas", "maxReplicas"),
                      ("activation_tasks", "activationTasks"), ("polling_interval_seconds", "pollingIntervalSeconds"),
                      ("scale_down_stabilization_seconds", "scaleDownStabilizationSeconds"),
                      ("cooldown_seconds", "cooldownSeconds"), ("paused", "paused"), ("dry_run", "dryRun"),
                      ("throughput_floor", "throughputFloor")]:
        assert scaling[key]["default"] == getattr(defaults, attr), key
    for unset in ("tasksPerReplica", "fallbackReplicas", "maxWaitSeconds", "lookaheadSeconds"):
        assert "default" not in scaling[unset], unset
    rollout = props["rollout"]["properties"]
    assert rollout["strategy"]["default"] == minimal.rollout.strategy == "Drain"
    assert rollout["maxWaitSeconds"]["default"] == minimal.rollout.max_wait_seconds


def test_printer_columns():
    columns = {c["name"]: c["jsonPath"] for c in version()["additionalPrinterColumns"]}
    assert columns == {"Queue": ".spec.queue", "Ready": ".status.queueDepth.ready",
                       "Running": ".status.queueDepth.running", "Desired": ".status.desiredReplicas",
                       "Replicas": ".status.replicas", "Reason": ".status.reason",
                       "Age": ".metadata.creationTimestamp"}


def test_status_declares_conditions_as_a_map_list():
    conditions = version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def rules(schema: dict, path: str = "") -> list[tuple[str, dict]]:
    """Every CEL rule in the schema, with the path of the node that carries it."""
    found = [(path, rule) for rule in schema.get("x-kubernetes-validations", [])]
    for name, prop in schema.get("properties", {}).items():
        found += rules(prop, f"{path}.{name}")
    if "items" in schema:
        found += rules(schema["items"], f"{path}[]")
    return found


def test_the_pod_security_rules_are_the_forbidding_ones_and_guard_only_the_template():
    """The chart's allowPrivilegedTemplates drops the rules with reason FieldValueForbidden: they must
    be the template's pod-security rules, every one of them, and nothing else."""
    every = rules(spec_schema(), "spec")
    forbidding = [(path, rule) for path, rule in every if rule.get("reason") == "FieldValueForbidden"]
    assert len(forbidding) >= 15
    assert all(path.startswith("spec.template.") and rule.get("message") for path, rule in forbidding)
    assert all(rule.get("reason") == "FieldValueForbidden" for path, rule in every if path.startswith("spec.template"))
