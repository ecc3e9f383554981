"""The console's Scaling page against the test cluster's API server: it lists every QueueWorker with
the status the controller writes (replicas, desired, the last decision, conditions)."""

from __future__ import annotations

import re

import pytest
from kubernetes import client
from starlette.testclient import TestClient

from queueworker.console import ConsoleConfig, create_app
from queueworker.scaling.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def test_scaling_page_shows_each_queueworkers_last_decision(control_plane, crd, cluster_namespace, dsn):
    with control_plane.api_client() as api:
        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(GROUP, VERSION, cluster_namespace, PLURAL, {
            "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "mailer"},
            "spec": {"queue": "emails", "image": "worker:1", "database": {"secretRef": {"name": "db"}}}})
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, cluster_namespace, PLURAL, "mailer", {"status": {
            "replicas": 3, "desiredReplicas": 5, "readyReplicas": 2, "reason": "ScaledUp",
            "message": "<b>ready</b> 42 tasks need 5 replicas", "queueDepth": {"ready": 42, "running": 6},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Polled"},
                           {"type": "Active", "status": "True", "reason": "Backlog"}]}})
    config = ConsoleConfig(dsn, kubeconfig=str(control_plane.kubeconfig), allowed_hosts=frozenset({"testserver"}))
    with TestClient(create_app(config)) as c:
        page = c.get("/scaling").text
    row = page[page.index(f"{cluster_namespace}/mailer"):]
    row = row[:row.index("</tr>")]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)  # after the QueueWorker's own cell
    assert cells[:4] == ["emails", "3", "5", "2"]
    assert "<strong>ScaledUp</strong> &lt;b&gt;ready&lt;/b&gt; 42 tasks need 5 replicas" in row
    assert "ready=42 running=6" in row and "Ready=True (Polled)" in row and "Active=True (Backlog)" in row
