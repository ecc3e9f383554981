"""The Helm chart: lint, render with defaults and with every knob, schema errors, and the rendered
objects the console needs; tests/test_chart_cluster.py applies them to the test API server.

helm is built from the Go module proxy (tests/helm_binary.py); where it cannot be built the tests
skip, or fail when QUEUEWORKER_REQUIRE_CLUSTER=1 (CI), as the cluster tier does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import psycopg
import pytest
import yaml
from prometheus_client import REGISTRY

from queueworker._version import __version__
from queueworker.db.migrate import migrate
from queueworker.scaling import resource
from queueworker_controller.leader import ElectionTiming

import queueworker.metrics  # noqa: F401 - registers the worker's metrics
import queueworker_controller.metrics  # noqa: F401 - and the controller's

from tests.chart import CHART, CLUSTER_SCOPED_RESOURCES, CRD_FILE, DASHBOARD, EVERYTHING, ROOT, RULES, Rendered, controller_container, helm, render, run_helm  # noqa: F401 (helm: a fixture)


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_lint_is_clean(helm, tmp_path, values):
    result = run_helm(helm, "lint", "--strict", values=values, tmp_path=tmp_path)
    assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, result.stdout + result.stderr


def test_defaults_render_a_locked_down_leader_and_standby(helm, tmp_path):
    rendered = render(helm, tmp_path)
    assert rendered.kinds() == ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
                                "Role", "RoleBinding", "Service", "ServiceAccount"]
    deployment = rendered.one("Deployment", "-controller")
    assert deployment["spec"]["replicas"] == 2 and "strategy" not in deployment["spec"], "rolling: one stays up"
    pod = deployment["spec"]["template"]["spec"]
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert spread["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = controller_container(rendered)
    assert "command" not in container, "the image's entrypoint (tini) must stay PID 1"
    assert container["args"][0] == "--all-namespaces" and "--metrics-port=8080" in container["args"]
    assert {"--leader-election", "--leader-election-name=rel-queueworker-controller",
            "--leader-election-lease-seconds=8"} <= set(container["args"])
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e} == {
        "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
        "POD_SERVICE_ACCOUNT": "spec.serviceAccountName"}
    election = rendered.one("Role", "-leader-election")
    assert election["metadata"]["namespace"] == "qw-system"
    assert election["rules"] == yaml.safe_load((CHART / "files" / "leader-election-rules.yaml").read_text())
    assert rendered.one("RoleBinding", "-leader-election")["roleRef"]["name"] == election["metadata"]["name"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"].keys() == {"cpu", "memory"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    binding = rendered.one("ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-queueworker-controller",
                                    "namespace": "qw-system"}]
    assert rendered.one("ClusterRole")["rules"] == RULES, "the rules are files/controller-rules.yaml, verbatim"
    assert rendered.one("Service")["spec"]["ports"][0]["port"] == 8080
    assert [h["kind"] for h in rendered.hooks] == ["Pod"]
    assert "NetworkPolicy" not in rendered.kinds()


def test_the_leader_election_defaults_are_the_controllers():
    """values.yaml states the timings the controller defaults to (leader.ElectionTiming, which its
    flags take their defaults from), so leaving them out of the values changes nothing."""
    from queueworker_controller.cli import build_parser  # registers the operator's handlers with kopf

    election = yaml.safe_load((CHART / "values.yaml").read_text())["controller"]["leaderElection"]
    defaults = ElectionTiming()
    assert (election["leaseSeconds"], election["renewDeadlineSeconds"], election["retrySeconds"]) == \
        (defaults.lease_seconds, defaults.renew_deadline_seconds, defaults.retry_seconds)
    flags = build_parser().parse_args([])
    assert (flags.leader_election_lease_seconds, flags.leader_election_renew_deadline_seconds,
            flags.leader_election_retry_seconds) == (defaults.lease_seconds, defaults.renew_deadline_seconds,
                                                     defaults.retry_seconds)


def test_the_crd_is_the_repository_crd_with_the_keep_policy(helm, tmp_path):
    """crds/queueworker.dev_queueworkers.yaml is the single source: the chart reaches it through a
    symlink, and what it renders differs only by the metadata it adds."""
    link = CHART / "files" / CRD_FILE.name
    assert link.is_symlink() and link.resolve() == CRD_FILE.resolve()
    source = yaml.safe_load(CRD_FILE.read_text())
    crd = render(helm, tmp_path).one("CustomResourceDefinition")
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"].pop("labels")["app.kubernetes.io/instance"] == "rel"
    assert crd == source
    no_keep = render(helm, tmp_path, {"crds": {"install": True, "keep": False}}).one("CustomResourceDefinition")
    assert "annotations" not in no_keep["metadata"]
    assert "CustomResourceDefinition" not in render(helm, tmp_path, {"crds": {"install": False, "keep": True}}).kinds()


def test_the_chart_names_the_queueworker_resource_as_the_code_does(helm, tmp_path):
    """The rendered CRD, the controller's rules and the console's name the resource of
    queueworker.scaling.resource, which the controller serves and the console lists."""
    rendered = render(helm, tmp_path, CONSOLE)
    crd = rendered.one("CustomResourceDefinition")
    assert (crd["metadata"]["name"], crd["spec"]["group"], crd["spec"]["names"]["kind"],
            crd["spec"]["names"]["plural"], [v["name"] for v in crd["spec"]["versions"]]) == \
        (resource.CRD_NAME, resource.GROUP, resource.KIND, resource.PLURAL, [resource.VERSION])
    resources = {name for rule in RULES if resource.GROUP in rule["apiGroups"] for name in rule["resources"]}
    assert resources == {resource.PLURAL, f"{resource.PLURAL}/status"}
    (console_rule,) = rendered.one("ClusterRole", "-console")["rules"]
    assert (console_rule["apiGroups"], console_rule["resources"]) == ([resource.GROUP], [resource.PLURAL])


def test_packaged_chart_carries_the_crd_itself(helm, tmp_path):
    """`helm package` follows the symlink, so a chart archive needs no repository around it."""
    subprocess.run([str(helm), "package", str(CHART), "--destination", str(tmp_path)], check=True,
                   capture_output=True)
    (archive,) = tmp_path.glob("queueworker-*.tgz")
    result = subprocess.run([str(helm), "template", "rel", str(archive)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    crd = Rendered(result.stdout).one("CustomResourceDefinition")
    assert crd["spec"] == yaml.safe_load(CRD_FILE.read_text())["spec"]


def test_every_value_is_rendered_where_it_belongs(helm, tmp_path):
    rendered = render(helm, tmp_path, EVERYTHING)
    assert rendered.kinds() == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "ConfigMap",
                                "CustomResourceDefinition", "Deployment", "Deployment", "NetworkPolicy",
                                "PodDisruptionBudget", "Role", "RoleBinding", "RoleBinding", "RoleBinding", "Secret",
                                "Secret", "Service", "Service", "ServiceAccount", "ServiceMonitor"]
    container = controller_container(rendered)
    assert container["image"] == "registry.example.com/queueworker-controller:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"] == ["--namespace=team-a", "--namespace=team-b", "--log-format=plain",
                                 "--leader-election", "--leader-election-name=qw-controller",
                                 "--leader-election-lease-seconds=15", "--leader-election-renew-deadline-seconds=10",
                                 "--leader-election-retry-seconds=2", "--liveness=http://[::]:9081/healthz", "--metrics-port=9090",
                                 "--metrics-address=127.0.0.1", "--allow-privileged-templates", "--verbose",
                                 "--some-flag"]
    assert {"name": "TZ", "value": "UTC"} in container["env"]
    pod_template = rendered.one("Deployment", "qw-controller")["spec"]["template"]
    assert pod_template["metadata"]["labels"]["team"] == "queues"
    assert pod_template["metadata"]["annotations"]["example.com/team"] == "queues"
    pod = pod_template["spec"]
    assert pod["serviceAccountName"] == "qw-operator" and pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] and pod["tolerations"] and pod["affinity"]
    assert rendered.one("ServiceAccount")["metadata"]["annotations"] == {"iam.example.com/role": "qw"}

    # Namespaced scope: RoleBindings in the watched namespaces, cluster-scoped rules alone cluster-wide.
    assert {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in rendered.all("RoleBinding")} == {
        ("team-a", "qw-controller"), ("team-b", "qw-controller"), ("qw-system", "qw-controller-leader-election")}
    assert rendered.one("Deployment", "qw-controller")["spec"]["replicas"] == 3
    cluster_scope = rendered.one("ClusterRole", "-cluster-scope")
    assert cluster_scope["rules"] == [r for r in RULES if CLUSTER_SCOPED_RESOURCES & set(r["resources"])]
    assert rendered.one("ClusterRoleBinding")["roleRef"]["name"] == "qw-controller-cluster-scope"

    monitor = rendered.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0] == {"port": "metrics", "path": "/metrics", "interval": "15s",
                                               "scrapeTimeout": "5s"}
    assert rendered.one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1

    secret = rendered.one("Secret", "-demo-postgres")
    assert secret["stringData"]["url"] == "postgresql://jobs:s3cret@qw-demo-postgres.qw-system.svc:5432/jobs"
    assert rendered.one("Secret", "-demo-postgres-admin")["stringData"] == {"password": "r00t"}
    postgres = rendered.one("Deployment", "-demo-postgres")
    assert "not-for-production" in str(postgres["metadata"]["annotations"])
    (test_pod,) = [h for h in rendered.hooks if h["kind"] == "Pod"]
    assert {e["name"] for e in test_pod["spec"]["containers"][0]["env"]} == {"METRICS_URL", "DATABASE_URL"}
    (job,) = [h for h in rendered.hooks if h["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/queueworker:1.2.3"
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (1, 120)
    assert rendered.one("NetworkPolicy")["spec"]["ingress"][0]["from"] == EVERYTHING["networkPolicy"]["metricsFrom"]
    dashboard = rendered.one("ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["queueworker.json"]) == json.loads(DASHBOARD.read_text())


def test_metrics_off_renders_no_service_and_no_flag(helm, tmp_path):
    rendered = render(helm, tmp_path, {"metrics": {"enabled": False}})
    assert "Service" not in rendered.kinds()
    assert not any(a.startswith("--metrics-port") for a in controller_container(rendered)["args"])


def test_demo_postgres_passwords_are_random_when_unset(helm, tmp_path):
    renders = [render(helm, tmp_path, {"demoPostgres": {"enabled": True}}) for _ in range(2)]
    urls = {r.one("Secret", "-demo-postgres")["stringData"]["url"] for r in renders}
    admin = {r.one("Secret", "-demo-postgres-admin")["stringData"]["password"] for r in renders}
    assert len(urls) == 2 and len(admin) == 2
    app_password = renders[0].one("Secret", "-demo-postgres")["stringData"]["password"]
    assert app_password not in admin, "the app and the superuser share a password"


def test_demo_postgres_gives_the_app_a_role_of_its_own(helm, tmp_path):
    rendered = render(helm, tmp_path, {"demoPostgres": {"enabled": True, "user": "app", "database": "appdb"}})
    (container,) = rendered.one("Deployment", "-demo-postgres")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["POSTGRES_USER"] == "postgres"
    assert env["POSTGRES_PASSWORD"] == {"secretKeyRef": {"name": "rel-queueworker-demo-postgres-admin", "key": "password"}}
    assert (env["APP_USER"], env["APP_DB"]) == ("app", "appdb")
    assert env["APP_PASSWORD"] == {"secretKeyRef": {"name": "rel-queueworker-demo-postgres", "key": "password"}}
    assert "POSTGRES_DB" not in env
    assert "init-app-role.sh" in rendered.one("ConfigMap", "-demo-postgres-init")["data"]
    result = run_helm(helm, "template", "rel", values={"demoPostgres": {"enabled": True, "user": "postgres"}},
                      tmp_path=tmp_path)
    assert result.returncode != 0 and "at '/demoPostgres/user'" in result.stderr


@pytest.mark.integration
def test_the_demo_init_script_makes_a_non_superuser_owner_that_can_migrate(helm, tmp_path, postgres):
    """The ConfigMap's script, run as the image's entrypoint runs it, against a real Postgres."""
    _, admin_dsn = postgres
    script = render(helm, tmp_path, {"demoPostgres": {"enabled": True}}).one(
        "ConfigMap", "-demo-postgres-init")["data"]["init-app-role.sh"]
    (tmp_path / "init.sh").write_text(script)
    user, database = f"app_{uuid.uuid4().hex[:8]}", f"appdb_{uuid.uuid4().hex[:8]}"
    params = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    env = {**os.environ, "POSTGRES_USER": params["user"], "PGHOST": params["host"], "PGPORT": str(params["port"]),
           "PGPASSWORD": params.get("password", ""), "APP_USER": user, "APP_PASSWORD": "app-pass",
           "APP_DB": database}
    result = subprocess.run(["sh", str(tmp_path / "init.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    app_dsn = psycopg.conninfo.make_conninfo(admin_dsn, user=user, password="app-pass", dbname=database)
    try:
        migrate(app_dsn)
        with psycopg.connect(app_dsn) as conn:
            superuser, createrole = conn.execute(
                "SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user").fetchone()
            owner = conn.execute("SELECT nspowner::regrole::text FROM pg_namespace "
                                 "WHERE nspname = 'queueworker'").fetchone()[0]
        assert (superuser, createrole) == (False, False) and owner == user
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{user}"')


def test_allow_privileged_templates_drops_exactly_the_forbidding_rules(helm, tmp_path):
    def without_forbidding_rules(node):
        if isinstance(node, dict):
            kept = {k: without_forbidding_rules(v) for k, v in node.items() if k != "x-kubernetes-validations"}
            rules = [r for r in node.get("x-kubernetes-validations", []) if r.get("reason") != "FieldValueForbidden"]
            return {**kept, **({"x-kubernetes-validations": rules} if rules else {})}
        return [without_forbidding_rules(v) for v in node] if isinstance(node, list) else node
    source = yaml.safe_load(CRD_FILE.read_text())
    assert json.dumps(source).count("FieldValueForbidden") >= 15
    rendered = render(helm, tmp_path, {"allowPrivilegedTemplates": True})
    crd = rendered.one("CustomResourceDefinition")
    crd["metadata"] = source["metadata"]
    assert crd == without_forbidding_rules(source)
    assert "minReplicas must not be greater" in json.dumps(crd)  # the other rules stay
    assert "--allow-privileged-templates" in controller_container(rendered)["args"]
    assert "--allow-privileged-templates" not in controller_container(render(helm, tmp_path))["args"]


def test_migrations_run_as_a_restricted_pre_install_and_pre_upgrade_hook(helm, tmp_path):
    rendered = render(helm, tmp_path, {"migrations": {"enabled": True, "database": {"secretName": "mig", "key": "url"}}})
    (job,) = [h for h in rendered.hooks if h["kind"] == "Job"]
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"queueworker:{__version__}" and container["args"] == ["migrate"]
    assert "command" not in container, "the worker image's entrypoint (tini -- queueworker) stays PID 1"
    assert container["env"] == [{"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "mig", "key": "url"}}}]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    result = run_helm(helm, "template", "rel", values={"migrations": {"enabled": True}}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "migrations.database.secretName is required when migrations.enabled is true" in result.stderr
    assert not [h for h in render(helm, tmp_path).hooks if h["kind"] == "Job"]


def test_network_policy_allows_only_what_the_controller_needs(helm, tmp_path):
    spec = render(helm, tmp_path, {"networkPolicy": {"enabled": True}}).one("NetworkPolicy")["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [], "no metricsFrom: nothing may connect"
    assert spec["egress"] == [
        {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]},
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {"ports": [{"port": 5432, "protocol": "TCP"}]},
    ]
    peers = [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]
    spec = render(helm, tmp_path, {"networkPolicy": {"enabled": True, "metricsFrom": peers,
                                                     "apiServer": {"cidrs": ["192.0.2.1/32"], "ports": [443]}}}
                  ).one("NetworkPolicy")["spec"]
    assert spec["ingress"] == [{"from": peers, "ports": [{"port": "healthz", "protocol": "TCP"},
                                                         {"port": "metrics", "protocol": "TCP"}]}]
    assert spec["egress"][0] == {"ports": [{"port": 443, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "192.0.2.1/32"}}]}
    assert "NetworkPolicy" not in render(helm, tmp_path).kinds()


def test_network_policy_lets_only_the_named_peers_reach_the_console(helm, tmp_path):
    values = {"networkPolicy": {"enabled": True}, "console": {**READ_ONLY_CONSOLE, "enabled": True}}
    rendered = render(helm, tmp_path, values)
    controller, console = rendered.one("NetworkPolicy", "-controller")["spec"], rendered.one("NetworkPolicy", "-console")["spec"]
    assert console["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "console"
    assert console["ingress"] == [], "no consoleFrom: nobody (kubectl port-forward still works)"
    assert console["egress"] == controller["egress"], "the API server, DNS and the databases, as the controller"
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
    values["networkPolicy"]["consoleFrom"] = peers
    console = render(helm, tmp_path, values).one("NetworkPolicy", "-console")["spec"]
    assert console["ingress"] == [{"from": peers, "ports": [{"port": "http", "protocol": "TCP"}]}]
    assert len(render(helm, tmp_path, {"networkPolicy": {"enabled": True}}).all("NetworkPolicy")) == 1


def test_metrics_and_liveness_bind_where_told(helm, tmp_path):
    args = controller_container(render(helm, tmp_path))["args"]
    assert "--metrics-address=0.0.0.0" in args and "--liveness=http://0.0.0.0:8081/healthz" in args
    args = controller_container(render(helm, tmp_path, {"metrics": {"bindAddress": "127.0.0.1"},
                                                        "controller": {"livenessBindAddress": "fd00::1"}}))["args"]
    assert "--metrics-address=127.0.0.1" in args and "--liveness=http://[fd00::1]:8081/healthz" in args


@pytest.mark.parametrize(("values", "message"), [
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    ({"controller": {"replicaCount": 2}}, "at '/controller': additional properties 'replicaCount' not allowed"),
    ({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0': 'Team_A' does not match pattern"),
    ({"metrics": {"port": 70000}}, "at '/metrics/port': maximum: got 70,000, want 65,535"),
    ({"controller": {"logFormat": "xml"}}, "at '/controller/logFormat': value must be one of"),
    ({"crds": {"install": "yes", "keep": True}}, "at '/crds/install': got string, want boolean"),
    ({"image": {"repository": "x", "tag": 1, "pullPolicy": "Always"}}, "at '/image/tag': got number, want string"),
    ({"demoPostgres": {"password": "p@ss/word"}}, "at '/demoPostgres/password'"),
], ids=lambda v: str(v)[:40])
def test_schema_rejects_bad_values_with_a_clear_message(helm, tmp_path, values, message):
    result = run_helm(helm, "template", "rel", values=values, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_several_controllers_need_leader_election(helm, tmp_path):
    result = run_helm(helm, "template", "rel", values={"controller": {"leaderElection": {"enabled": False}}},
                      tmp_path=tmp_path)
    assert result.returncode != 0
    assert "controller.replicas > 1 needs controller.leaderElection.enabled" in result.stderr
    single = render(helm, tmp_path, {"controller": {"replicas": 1, "leaderElection": {"enabled": False}}})
    deployment = single.one("Deployment", "-controller")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}, "never two at once, not even in a rollout"
    assert "--leader-election" not in controller_container(single)["args"]
    assert "Role" not in single.kinds()


def test_an_external_service_account_needs_a_name(helm, tmp_path):
    result = run_helm(helm, "template", "rel", values={"serviceAccount": {"create": False}}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "serviceAccount.name is required when serviceAccount.create is false" in result.stderr


def exported_series() -> dict[str, str]:
    """Every series name the worker and controller export, mapped to its metric family."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
    return {f"{family.name}{suffix}": family.name for family in REGISTRY.collect()
            if family.name.startswith("queueworker_") for suffix in suffixes.get(family.type, [""])}


def test_dashboard_queries_only_exported_metrics_and_shows_every_worker_metric():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    queries = [t["expr"] for p in panels for t in p.get("targets", []) if "expr" in t]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = set(re.findall(r"queueworker_\w+", " ".join(queries)))
    exported = exported_series()
    assert used - exported.keys() == set(), "the dashboard queries series nobody exports"
    worker_families = {f.name for f in REGISTRY.collect()
                       if f.name.startswith("queueworker_") and not f.name.startswith("queueworker_controller_")}
    assert worker_families - {exported[s] for s in used} == set(), "worker metrics missing from the dashboard"


def grafana_sql(raw: str, start: str, end: str) -> str:
    """A panel's SQL with Grafana's PostgreSQL macros expanded as Grafana expands them."""
    raw = re.sub(r"\$__timeGroupAlias\((\w+), \$__interval\)",
                 r'floor(extract(epoch FROM \1) / 60) * 60 AS "time"', raw)
    raw = re.sub(r"\$__timeFilter\((\w+)\)", rf"\1 BETWEEN '{start}' AND '{end}'", raw)
    assert "$" not in raw, f"a macro the test does not expand: {raw}"
    return raw


@pytest.mark.integration
def test_dashboard_run_panels_query_the_runs_as_the_documented_read_only_login(dsn):
    """The runs row reads Postgres through a Grafana data source: each of its queries runs, as a login
    with exactly the grants docs/deploying.md gives it, and shows the runs there are."""
    from queueworker.client.producer import start_run

    with psycopg.connect(dsn, autocommit=True) as conn:
        started = start_run(conn, "nightly", [{"task": "p"}] * 4, on_success={"task": "c"})
        failing = start_run(conn, "failing", [{"task": "p"}], on_failure={"task": "alert"})
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded' WHERE run_id = %s AND run_partition < 2",
                     (started,))
        conn.execute("UPDATE queueworker.tasks SET state = 'failed' WHERE run_id = %s", (failing,))
        grants = re.search(r"```sql\n(CREATE ROLE grafana_runs.*?)```", (ROOT / "docs" / "deploying.md").read_text(),
                           re.S).group(1)
        role = f"grafana_runs_{uuid.uuid4().hex[:8]}"  # roles are per server; tests share one
        conn.execute(grants.replace("grafana_runs", role).replace("DATABASE app", f'DATABASE "{conn.info.dbname}"'))
        conn.execute(f"ALTER ROLE {role} PASSWORD 'dashboard'")
    reader = psycopg.conninfo.make_conninfo(dsn, user=role, password="dashboard")
    dashboard = json.loads(DASHBOARD.read_text())
    sql_panels = {p["title"]: p["targets"][0]["rawSql"] for p in dashboard["panels"]
                  if p.get("datasource", {}).get("type") == "grafana-postgresql-datasource"}
    assert set(sql_panels) == {"Runs in progress", "Runs failed in range", "Run transitions", "Recent runs"}
    results = {}
    with psycopg.connect(reader) as conn:
        for title, raw in sql_panels.items():
            results[title] = conn.execute(grafana_sql(raw, "2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z")).fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT payload FROM queueworker.tasks LIMIT 1")
    assert results["Runs in progress"] == [(1,)]
    assert results["Runs failed in range"] == [(1,)]
    assert sorted((metric, value) for _, metric, value in results["Run transitions"]) == [("failed", 1),
                                                                                          ("started", 2)]
    recent = {row[1]: row[2:8] for row in results["Recent runs"]}
    assert recent == {"nightly": ("running", 2, 0, 0, 4, 50), "failing": ("failed", 0, 1, 0, 1, 0)}


CONSOLE = {"console": {"enabled": True, "allowActions": True, "port": 8443, "allowedHosts": ["console.example"],
                       "secureCookies": True,
                       "database": {"secretName": "console-db", "key": "operator-url"},
                       "auth": {"secretRef": {"name": "console-auth", "key": "token"}}}}


# Every page shows payloads, results and errors: a token is required whenever the console runs.
READ_ONLY_CONSOLE = {"database": {"secretName": "db", "key": "url"},
                     "auth": {"secretRef": {"name": "console-token", "key": "token"}}}


def test_console_is_off_by_default_and_lints_when_on(helm, tmp_path):
    assert not [o for o in render(helm, tmp_path).objects if o["metadata"]["name"].endswith("-console")]
    result = run_helm(helm, "lint", "--strict", values=CONSOLE, tmp_path=tmp_path)
    assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, result.stdout + result.stderr


def test_console_deployment_serves_with_the_mounted_token_and_reads_queueworkers(helm, tmp_path):
    rendered = render(helm, tmp_path, CONSOLE)
    deployment = rendered.one("Deployment", "-console")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"queueworker-controller:{__version__}"  # the controller image has the console
    assert container["command"] == ["/usr/bin/tini", "--", "queueworker"]
    service_name = rendered.one("Service", "-console")["metadata"]["name"]
    namespace = rendered.one("Service", "-console")["metadata"].get("namespace", "default")
    assert container["args"] == ["console", "--host=0.0.0.0", "--port=8443", "--allow-actions",
                                 f"--allowed-host={service_name}", f"--allowed-host={service_name}.{namespace}",
                                 f"--allowed-host={service_name}.{namespace}.svc", "--allowed-host=console.example",
                                 "--secure-cookies"]
    assert container["env"] == [
        {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "console-db", "key": "operator-url"}}},
        {"name": "QUEUEWORKER_CONSOLE_TOKEN_FILE", "value": "/var/run/queueworker-console/token"}]
    (token,) = [v for v in pod["volumes"] if v["name"] == "token"]
    assert token["secret"] == {"secretName": "console-auth", "items": [{"key": "token", "path": "token"}]}
    assert {"name": "token", "mountPath": "/var/run/queueworker-console", "readOnly": True} in container["volumeMounts"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"]
    service = rendered.one("Service", "-console")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8443, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert rendered.one("ClusterRole", "-console")["rules"] == [
        {"apiGroups": ["queueworker.dev"], "resources": ["queueworkers"], "verbs": ["get", "list"]}]
    assert rendered.one("ClusterRoleBinding", "-console")["subjects"][0]["name"] == pod["serviceAccountName"]
    read_only = render(helm, tmp_path, {"console": {**READ_ONLY_CONSOLE, "enabled": True}})
    (container,) = read_only.one("Deployment", "-console")["spec"]["template"]["spec"]["containers"]
    assert "--allow-actions" not in container["args"] and "--secure-cookies" not in container["args"]
    assert container["env"][1] == {"name": "QUEUEWORKER_CONSOLE_TOKEN_FILE", "value": "/var/run/queueworker-console/token"}
    own_image = render(helm, tmp_path, {"console": {**READ_ONLY_CONSOLE, "enabled": True,
                                                    "image": {"repository": "registry.example/app", "tag": "2"}}})
    (container,) = own_image.one("Deployment", "-console")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/app:2"


@pytest.mark.parametrize(("values", "message"), [
    ({"console": {"enabled": True, "allowActions": True, "database": {"secretName": "db", "key": "url"}}},
     "at '/console/auth/secretRef/name': minLength: got 0, want 1"),
    ({"console": {"enabled": True, "database": {"secretName": "db", "key": "url"}}},
     "at '/console/auth/secretRef/name': minLength: got 0, want 1"),
    ({"console": {"enabled": True, "auth": READ_ONLY_CONSOLE["auth"]}},
     "console.database.secretName is required when console.enabled is true"),
    ({"console": {"port": 0}}, "at '/console/port': minimum: got 0, want 1"),
    ({"console": {"auth": {"token": "inline"}}}, "at '/console/auth': additional properties 'token' not allowed"),
], ids=["actions-without-auth", "pages-without-auth", "no-database", "bad-port", "inline-token"])
def test_console_values_are_refused_when_unsafe_or_incomplete(helm, tmp_path, values, message):
    result = run_helm(helm, "template", "rel", values=values, tmp_path=tmp_path)
    assert result.returncode != 0 and message in result.stderr, result.stderr
