"""The CRD manifest: structural, documented, and in agreement with the controller's defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from queueworker.scaling import resource
from queueworker.scaling.resource import QueueDepthField, StatusField
from queueworker.names import QUEUE_PATTERN
from queueworker_controller.spec import (
    DEFAULT_SCALE_TARGET_API_VERSION, SHUTDOWN_HEADROOM_SECONDS, SHUTDOWN_MARGIN_SECONDS, QueueWorkerSpec, Scaling,
)

CRD_PATH = Path(__file__).resolve().parent.parent / "crds" / "queueworker.dev_queueworkers.yaml"
# The chart's copy: a symlink to CRD_PATH (tests/test_chart.py checks it renders as it is).
CHART_CRD_PATH = CRD_PATH.parent.parent / "charts" / "queueworker" / "files" / CRD_PATH.name


def load_crd(path: Path = CRD_PATH) -> dict:
    return yaml.safe_load(path.read_text())


def version() -> dict:
    (v1alpha1,) = load_crd()["spec"]["versions"]
    return v1alpha1


def spec_schema() -> dict:
    return version()["schema"]["openAPIV3Schema"]["properties"]["spec"]


def names_of(fields: type) -> set[str]:
    """The field names a class of queueworker.scaling.resource lists."""
    return {value for key, value in vars(fields).items() if key.isupper()}


@pytest.mark.parametrize("path", [CRD_PATH, CHART_CRD_PATH], ids=["crds", "chart"])
def test_names(path):
    crd = load_crd(path)
    assert crd["metadata"]["name"] == "queueworkers.queueworker.dev" == resource.CRD_NAME
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == \
        ("QueueWorker", "queueworkers", ["qw"], ["queueworker"])
    assert (crd["spec"]["group"], names["kind"], names["plural"], names["singular"], names["shortNames"],
            names["categories"]) == (resource.GROUP, resource.KIND, resource.PLURAL, resource.SINGULAR,
                                     list(resource.SHORT_NAMES), list(resource.CATEGORIES))
    (served,) = crd["spec"]["versions"]
    assert (served["name"], served["served"], served["storage"]) == (resource.VERSION, True, True)
    assert served["subresources"] == {"status": {}}


@pytest.mark.parametrize("path", [CRD_PATH, CHART_CRD_PATH], ids=["crds", "chart"])
def test_the_status_schema_declares_the_fields_the_controller_writes_and_the_console_reads(path):
    """queueworker.scaling.resource names them for both; kopf keeps its own state under `kopf`."""
    (served,) = load_crd(path)["spec"]["versions"]
    status = served["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(status) - {"kopf"} == names_of(StatusField)
    assert set(status[StatusField.QUEUE_DEPTH]["properties"]) == names_of(QueueDepthField)


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
    target = props["scaleTargetRef"]["properties"]
    assert target["apiVersion"]["default"] == DEFAULT_SCALE_TARGET_API_VERSION
    assert QueueWorkerSpec.from_dict({"queue": "q", "database": {"secretRef": {"name": "s"}}, "scaleTargetRef": {
        "kind": "Deployment", "name": "mine"}}).scale_target.api_version == DEFAULT_SCALE_TARGET_API_VERSION


def test_queue_names_are_the_workers_and_the_described_grace_period_the_controllers():
    """The CRD's queue pattern and length are the worker's QUEUE_PATTERN, written as the API server
    wants it (an unbounded pattern and a maxLength); the grace period and the shutdown budget the
    descriptions promise are the ones the controller renders."""
    props = spec_schema()["properties"]
    queue = props["queue"]
    assert queue["pattern"].replace("]*$", "]{0,%d}$" % (queue["maxLength"] - 1)) == QUEUE_PATTERN
    assert queue["minLength"] == 1
    assert f"drainSeconds + {SHUTDOWN_MARGIN_SECONDS}" in props["drainSeconds"]["description"]
    grace = props["template"]["properties"]["spec"]["properties"]["terminationGracePeriodSeconds"]["description"]
    assert f"less {SHUTDOWN_HEADROOM_SECONDS} s" in " ".join(grace.split())
    assert f"Defaults to drainSeconds + {SHUTDOWN_MARGIN_SECONDS}." in grace


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


EXAMPLES = CRD_PATH.parent.parent / "examples"


def schema_errors(value: Any, schema: dict, path: str = "") -> list[str]:
    """What the API server's structural checks would refuse in `value`: types, required fields,
    unknown fields (refused by `kubectl apply`'s strict field validation), enums and bounds. The CEL
    rules are left to the cluster tier, where a real API server evaluates them."""
    if schema.get("x-kubernetes-int-or-string"):
        return [] if isinstance(value, int | str) and not isinstance(value, bool) else [f"{path}: not int or string"]
    kind = schema.get("type")
    python = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": int | float}
    if kind and (not isinstance(value, python[kind]) or (kind in ("integer", "number") and isinstance(value, bool))):
        return [f"{path}: {value!r} is not {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: {value!r} below {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{path}: {value!r} above {schema['maximum']}")
    if kind == "object":
        properties = schema.get("properties", {})
        errors += [f"{path}.{name}: required" for name in schema.get("required", []) if name not in value]
        for name, item in value.items():
            if name in properties:
                errors += schema_errors(item, properties[name], f"{path}.{name}")
            elif "additionalProperties" in schema:
                errors += schema_errors(item, schema["additionalProperties"], f"{path}.{name}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{name}: unknown field")
    if kind == "array":
        for index, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{index}]")
    return errors


def test_the_example_queueworker_conforms_to_the_crd_and_names_the_example_secret():
    queueworker = yaml.safe_load((EXAMPLES / "queueworker.yaml").read_text())
    secret = yaml.safe_load((EXAMPLES / "database-secret.yaml").read_text())
    assert (queueworker["apiVersion"], queueworker["kind"]) == (f"queueworker.dev/{version()['name']}", "QueueWorker")
    assert schema_errors(queueworker["spec"], spec_schema(), "spec") == []
    spec = QueueWorkerSpec.from_dict(queueworker["spec"])  # what the controller makes of it
    assert (spec.queue, spec.scaling.max_replicas) == ("emails", 20)
    assert (secret["apiVersion"], secret["kind"]) == ("v1", "Secret")
    assert secret["metadata"]["name"] == queueworker["spec"]["database"]["secretRef"]["name"]
    url = secret["stringData"][queueworker["spec"]["database"]["secretRef"]["key"]]
    assert url.startswith("postgresql://REPLACE-USER:REPLACE-PASSWORD@") and ".invalid:" in url


def test_the_schema_check_refuses_what_the_api_server_refuses():
    """The check above can fail: an unknown field, a wrong type, a missing required field."""
    schema = spec_schema()
    good = yaml.safe_load((EXAMPLES / "queueworker.yaml").read_text())["spec"]
    assert schema_errors({**good, "replicas": 3}, schema, "spec") == ["spec.replicas: unknown field"]
    assert schema_errors({**good, "concurrency": "10"}, schema, "spec") == ["spec.concurrency: '10' is not integer"]
    assert schema_errors({**good, "scaling": {"maxReplicas": True}}, schema, "spec") == \
        ["spec.scaling.maxReplicas: True is not integer"]
    assert schema_errors({**good, "concurrency": 0}, schema, "spec") == ["spec.concurrency: 0 below 1"]
    assert "spec.queue: required" in schema_errors({k: v for k, v in good.items() if k != "queue"}, schema, "spec")
