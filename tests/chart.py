"""The harness of the chart's tests: helm (built from the Go module proxy, tests/go_tools.py), the
chart rendered with given values, and the values that change everything (tests/test_chart.py,
tests/test_chart_cluster.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml


from tests.cluster.binaries import BinariesUnavailable
from tests.cluster.fixtures import unavailable
from tests.go_tools import HELM, ensure

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "queueworker"
CRD_FILE = ROOT / "crds" / "queueworker.dev_queueworkers.yaml"
RULES = yaml.safe_load((CHART / "files" / "controller-rules.yaml").read_text())
DASHBOARD = CHART / "dashboards" / "queueworker.json"
CLUSTER_SCOPED_RESOURCES = {"customresourcedefinitions", "namespaces"}
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
FIELD_MANAGER = "queueworker-chart-test"

# Every value that changes what is rendered, set away from its default.
EVERYTHING: dict[str, Any] = {
    "image": {"repository": "registry.example.com/queueworker-controller", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "fullnameOverride": "qw",
    "watchNamespaces": ["team-a", "team-b"],
    "allowPrivilegedTemplates": True,
    "crds": {"install": True, "keep": False},
    "serviceAccount": {"create": True, "name": "qw-operator", "annotations": {"iam.example.com/role": "qw"}},
    "controller": {
        "replicas": 3, "leaderElection": {"enabled": True, "leaseSeconds": 15, "renewDeadlineSeconds": 10,
                                          "retrySeconds": 2},
        "logFormat": "plain", "verbose": True, "extraArgs": ["--some-flag"],
        "extraEnv": [{"name": "TZ", "value": "UTC"}], "livenessPort": 9081, "livenessBindAddress": "::",
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}},
        "podAnnotations": {"example.com/team": "queues"}, "podLabels": {"team": "queues"},
        "priorityClassName": "system-cluster-critical", "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    },
    "metrics": {"port": 9090, "bindAddress": "127.0.0.1",
                "service": {"type": "ClusterIP", "annotations": {"prometheus.io/scrape": "true"}},
                "serviceMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "5s",
                                   "labels": {"release": "prometheus"}}},
    "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": "monitoring"}}}],
                      "apiServer": {"cidrs": ["10.0.0.1/32"], "ports": [6443]}, "dns": False,
                      "databaseEgress": [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
                                          "ports": [{"port": 5432, "protocol": "TCP"}]}]},
    "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
    "migrations": {"enabled": True, "image": {"repository": "registry.example.com/queueworker", "tag": "1.2.3",
                                              "pullPolicy": "Always"},
                   "database": {"secretName": "migrator-db", "key": "admin-url"}, "backoffLimit": 1,
                   "activeDeadlineSeconds": 120},
    "demoPostgres": {"enabled": True, "password": "s3cret", "adminPassword": "r00t", "database": "jobs",
                     "user": "jobs"},
    "grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": "1"}, "annotations": {"folder": "queues"}},
}


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return ensure(HELM)
    except BinariesUnavailable as exc:
        unavailable(f"helm unavailable: {exc}")


def run_helm(helm: Path, *args: str, values: dict | None = None, tmp_path: Path | None = None
             ) -> subprocess.CompletedProcess:
    extra: list[str] = []
    if values is not None:
        assert tmp_path is not None
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        extra = ["--values", str(values_file)]
    return subprocess.run([str(helm), *args, str(CHART), *extra], capture_output=True, text=True, timeout=120)


class Rendered:
    """The objects `helm template` printed, by kind and name; hooks (the helm test pod) apart."""

    def __init__(self, text: str):
        docs = [d for d in yaml.safe_load_all(text) if d]
        self.hooks = [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]
        self.objects = [d for d in docs if d not in self.hooks]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def all(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict:
        (found,) = [o for o in self.all(kind) if o["metadata"]["name"].endswith(name_suffix)]
        return found


def render(helm: Path, tmp_path: Path, values: dict | None = None, release: str = "rel",
           namespace: str = "qw-system") -> Rendered:
    result = run_helm(helm, "template", release, "--namespace", namespace, values=values or {}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    return Rendered(result.stdout)


def controller_container(rendered: Rendered) -> dict:
    deployment = rendered.one("Deployment", "-controller")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


