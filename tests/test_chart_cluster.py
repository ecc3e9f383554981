"""The Helm chart against the test API server: the rendered objects applied server-side, the
migrations hook Job, the chart's test pod, install, upgrade and uninstall.

helm is built from the Go module proxy (tests/helm_binary.py); where it cannot be built the tests
skip, or fail when QUEUEWORKER_REQUIRE_CLUSTER=1 (CI), as the cluster tier does.
"""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest
from kubernetes import client, dynamic


from tests.chart import CHART, EVERYTHING, FIELD_MANAGER, RESTRICTED, helm, render  # noqa: F401 (helm: a fixture)


# --- against the real API server ---------------------------------------------------------------------------

def apply(dyn: dynamic.DynamicClient, obj: dict, namespace: str | None = None, dry_run: bool = False) -> Any:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kwargs = {"dry_run": "All"} if dry_run else {}
    return resource.server_side_apply(body=obj, name=obj["metadata"]["name"],
                                      namespace=obj["metadata"].get("namespace", namespace) if resource.namespaced
                                      else None, field_manager=FIELD_MANAGER, force_conflicts=True, **kwargs)


def service_account_can(api: client.ApiClient, account: str, namespace: str | None, verb: str,
                        resource: str, group: str = "") -> bool:
    review = client.AuthorizationV1Api(api).create_subject_access_review({"spec": {
        "user": f"system:serviceaccount:{account}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{account.split(':')[0]}"],
        "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource, "group": group}}})
    return bool(review.status.allowed)


@pytest.mark.cluster
def test_rendered_chart_is_accepted_by_the_api_server(helm, tmp_path, control_plane, cluster_namespace):
    """Everything rendered with every value set is applied server-side, in a namespace that enforces
    Pod Security "restricted" (so the controller's and the demo database's pods must pass it to be
    created); the RBAC it creates grants the controller its rules in the watched namespaces only; a
    sample QueueWorker pointing at the demo Postgres Secret passes the CRD's validation."""
    watched = [control_plane.create_namespace("watched"), control_plane.create_namespace("watched")]
    # The ServiceMonitor's CRD (prometheus-operator) is not installed here: it is checked by rendering only.
    # The CRD keeps its pod-security rules: other tests share it.
    values = {**EVERYTHING, "watchNamespaces": watched, "fullnameOverride": cluster_namespace,
              "crds": {"install": True, "keep": True}, "allowPrivilegedTemplates": False}
    rendered = render(helm, tmp_path, values, release=cluster_namespace, namespace=cluster_namespace)
    with control_plane.api_client() as api:
        client.CoreV1Api(api).patch_namespace(cluster_namespace, {"metadata": {"labels": RESTRICTED}})
        dyn = dynamic.DynamicClient(api)
        crd = rendered.one("CustomResourceDefinition")
        apply(dyn, crd)  # identical to crds/: harmless to other tests sharing the control plane
        extensions = client.ApiextensionsV1Api(api)
        control_plane.wait_for(lambda: any(
            c.type == "Established" and c.status == "True"
            for c in extensions.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []),
            message="CRD Established")
        for obj in rendered.objects:
            if obj["kind"] in ("CustomResourceDefinition", "ServiceMonitor"):
                continue
            applied = apply(dyn, obj, cluster_namespace)
            assert applied.metadata.name == obj["metadata"]["name"]

        core = client.CoreV1Api(api)
        for deployment in rendered.all("Deployment"):
            selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
            control_plane.wait_for(lambda: core.list_namespaced_pod(cluster_namespace, label_selector=selector).items,
                                   timeout=30, message=f"a pod of {deployment['metadata']['name']} admitted")

        account = f"{cluster_namespace}:qw-operator"
        for namespace in watched:
            assert service_account_can(api, account, namespace, "patch", "queueworkers", "queueworker.dev")
            assert service_account_can(api, account, namespace, "create", "deployments", "apps")
            assert service_account_can(api, account, namespace, "patch", "deployments/scale", "apps")
            assert service_account_can(api, account, namespace, "get", "secrets")
        for namespace in ("default", cluster_namespace):  # namespaced really means namespaced
            assert not service_account_can(api, account, namespace, "patch", "queueworkers", "queueworker.dev")
            assert not service_account_can(api, account, namespace, "create", "deployments", "apps")
            assert not service_account_can(api, account, namespace, "get", "secrets")
            assert not service_account_can(api, account, namespace, "list", "pods")
        assert service_account_can(api, account, cluster_namespace, "update", "leases", "coordination.k8s.io")
        for namespace in watched:  # the Lease lives in the release namespace only
            assert not service_account_can(api, account, namespace, "update", "leases", "coordination.k8s.io")
        assert not service_account_can(api, account, None, "get", "secrets")
        assert not service_account_can(api, account, None, "create", "deployments", "apps")
        assert service_account_can(api, account, None, "watch", "customresourcedefinitions",
                                   "apiextensions.k8s.io")

        sample = {"apiVersion": "queueworker.dev/v1alpha1", "kind": "QueueWorker",
                  "metadata": {"name": "sample", "namespace": watched[0]},
                  "spec": {"queue": "jobs", "image": "queueworker:dev",
                           "database": {"secretRef": {"name": f"{cluster_namespace}-demo-postgres"}},
                           "scaling": {"minReplicas": 0, "maxReplicas": 5}}}
        accepted = apply(dyn, sample, dry_run=True)
        assert accepted.spec.concurrency == 10, "defaults from the CRD schema were applied"


@pytest.mark.cluster
@pytest.mark.integration
def test_the_console_reads_queueworkers_in_the_watched_namespaces_only(helm, tmp_path, control_plane, crd,
                                                                      cluster_namespace, dsn):
    """With watchNamespaces the console's identity may list QueueWorkers in those namespaces and
    nowhere else, and the console (given the same namespaces, as the chart's Deployment is) shows
    theirs; asked to list cluster-wide, it says it may not."""
    from queueworker.console import ConsoleConfig, create_app
    from starlette.testclient import TestClient
    from tests.controller_cluster import create_queueworker, write_service_account_kubeconfig

    watched, unwatched = control_plane.create_namespace("watched"), control_plane.create_namespace("unwatched")
    values = {"console": {"enabled": True, "database": {"secretName": "db", "key": "url"},
                          "auth": {"secretRef": {"name": "console-token", "key": "token"}}},
              "watchNamespaces": [watched], "fullnameOverride": cluster_namespace}
    rendered = render(helm, tmp_path, values, release=cluster_namespace, namespace=cluster_namespace)
    (console,) = rendered.one("Deployment", "-console")["spec"]["template"]["spec"]["containers"]
    assert f"--namespace={watched}" in console["args"]
    spec = {"queue": "jobs", "image": "worker:1", "database": {"secretRef": {"name": "db"}}}
    with control_plane.api_client() as api:
        dyn = dynamic.DynamicClient(api)
        for obj in rendered.objects:
            if obj["metadata"]["name"].endswith("-console") and obj["kind"] in (
                    "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding"):
                apply(dyn, obj, cluster_namespace)
        for namespace in (watched, unwatched):
            create_queueworker(api, namespace, "mailer", spec)
        account = f"{cluster_namespace}:{cluster_namespace}-console"
        assert service_account_can(api, account, watched, "list", "queueworkers", "queueworker.dev")
        assert not service_account_can(api, account, unwatched, "list", "queueworkers", "queueworker.dev")
        assert not service_account_can(api, account, None, "list", "queueworkers", "queueworker.dev")
    kubeconfig = str(write_service_account_kubeconfig(control_plane, cluster_namespace, f"{cluster_namespace}-console",
                                                      tmp_path / "console-kubeconfig"))
    with TestClient(create_app(ConsoleConfig(dsn, kubeconfig=kubeconfig, namespaces=(watched,),
                                              allowed_hosts=frozenset({"testserver"})))) as c:
        page = c.get("/scaling").text
    assert f"{watched}/mailer" in page and f"{unwatched}/mailer" not in page
    with TestClient(create_app(ConsoleConfig(dsn, kubeconfig=kubeconfig, allowed_hosts=frozenset({"testserver"})))) as c:
        assert "cannot list QueueWorkers: HTTP 403" in c.get("/scaling").text


@pytest.mark.cluster
def test_the_migrations_hook_job_migrates_a_real_database_under_pod_security_restricted(
        helm, tmp_path, control_plane, cluster_namespace, blank_dsn):
    """The hook Job, created as Helm creates it, in a namespace that enforces "restricted": the
    job controller's pod is admitted, the process kubelet runs the worker image's entrypoint with
    `migrate`, and the schema is there afterwards."""
    values = {"fullnameOverride": cluster_namespace, "crds": {"install": False, "keep": True},
              "migrations": {"enabled": True, "database": {"secretName": "migrator", "key": "url"}}}
    (job,) = [h for h in render(helm, tmp_path, values, release=cluster_namespace,
                                namespace=cluster_namespace).hooks if h["kind"] == "Job"]
    with control_plane.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        core.patch_namespace(cluster_namespace, {"metadata": {"labels": RESTRICTED}})
        core.create_namespaced_secret(cluster_namespace, {"metadata": {"name": "migrator"},
                                                          "stringData": {"url": blank_dsn}})
        apply(dynamic.DynamicClient(api), job, cluster_namespace)
        name = job["metadata"]["name"]
        status = control_plane.wait_for(
            lambda: (lambda s: s if (s.succeeded or s.failed) else None)(
                batch.read_namespaced_job_status(name, cluster_namespace).status),
            timeout=90, message="the migration Job to finish")
        pods = core.list_namespaced_pod(cluster_namespace, label_selector=f"job-name={name}").items
    logs = "\n".join(control_plane.pod_log(cluster_namespace, p.metadata.name) for p in pods)
    assert status.succeeded == 1, logs
    with psycopg.connect(blank_dsn) as conn:
        assert conn.execute("SELECT max(version) FROM queueworker.schema_migrations").fetchone()[0] >= 2


@pytest.mark.cluster
def test_helm_test_pod_checks_the_demo_database(helm, tmp_path, control_plane, cluster_namespace, dsn):
    """The `helm test` hook, run by the process kubelet, with the demo Secret pointing at a real Postgres."""
    values = {"fullnameOverride": cluster_namespace, "crds": {"install": False, "keep": True},
              "metrics": {"enabled": False}, "demoPostgres": {"enabled": True}}
    rendered = render(helm, tmp_path, values, release=cluster_namespace, namespace=cluster_namespace)
    secret = rendered.one("Secret", "-demo-postgres")
    secret["stringData"]["url"] = dsn  # the Service's DNS name does not resolve here
    (test_pod,) = rendered.hooks
    name = test_pod["metadata"]["name"]
    with control_plane.api_client() as api:
        dyn = dynamic.DynamicClient(api)
        apply(dyn, secret)
        apply(dyn, test_pod)
        core = client.CoreV1Api(api)

        def finished_phase() -> str | None:
            phase = core.read_namespaced_pod(name, cluster_namespace).status.phase
            return phase if phase in ("Succeeded", "Failed") else None

        phase = control_plane.wait_for(finished_phase, timeout=60, message="the helm test pod to finish")
    log = control_plane.pod_log(cluster_namespace, name)
    assert phase == "Succeeded", log
    assert "schema at version" in log and "(no live workers)" in log, log  # migrate, then status


@pytest.mark.cluster
def test_install_upgrade_uninstall_keeps_the_crd(helm, control_plane, cluster_namespace):
    """The documented lifecycle with a real `helm`: a CRD that exists already is adopted (the docs'
    recipe), upgrade applies a change, uninstall removes the release's objects but keeps the CRD."""
    release, crd_name = cluster_namespace, "queueworkers.queueworker.dev"

    def helm_run(*args: str) -> str:
        result = subprocess.run([str(helm), *args, "--namespace", cluster_namespace, "--kubeconfig",
                                 str(control_plane.kubeconfig)], capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    with control_plane.api_client() as api:
        extensions, apps = client.ApiextensionsV1Api(api), client.AppsV1Api(api)
        try:
            extensions.patch_custom_resource_definition(crd_name, {"metadata": {
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {"meta.helm.sh/release-name": release,
                                "meta.helm.sh/release-namespace": cluster_namespace}}})
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        common = ["--set", f"fullnameOverride={release}"]
        notes = helm_run("install", release, str(CHART), *common, "--wait", "--timeout", "90s")
        assert "The CRD is kept on `helm uninstall`" in notes
        assert "ALL NAMESPACES: the controller may read every Secret" in notes, "all-namespaces installs are told"
        deployment = f"{release}-controller"
        assert "--verbose" not in apps.read_namespaced_deployment(deployment, cluster_namespace).spec.template.spec \
            .containers[0].args

        helm_run("upgrade", release, str(CHART), *common, "--set", "controller.verbose=true")
        assert "--verbose" in apps.read_namespaced_deployment(deployment, cluster_namespace).spec.template.spec \
            .containers[0].args

        helm_run("uninstall", release, "--wait", "--timeout", "90s")
        assert not apps.list_namespaced_deployment(cluster_namespace).items
        roles = client.RbacAuthorizationV1Api(api).list_cluster_role().items
        assert not [r for r in roles if r.metadata.name.startswith(release)]
        crd = extensions.read_custom_resource_definition(crd_name)
        assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"


