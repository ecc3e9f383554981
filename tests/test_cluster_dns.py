"""The real node's cluster DNS stand-in (tests/cluster/dns.py): which names it answers, and how.

The resolver runs against a real API server in the cluster tier (test_real_node.py and the smoke
tier); these tests pin its name handling and its answers with a stub Services API."""

from __future__ import annotations

from types import SimpleNamespace

from dnslib import QTYPE, RCODE, DNSRecord
from kubernetes.client.rest import ApiException

from tests.cluster.dns import ServiceResolver, service_name, upstream_servers


def test_service_names_are_service_dot_namespace_dot_svc_dot_the_cluster_domain():
    assert service_name("web.shop.svc.cluster.local.") == ("shop", "web")
    assert service_name("WEB.Shop.SVC.cluster.local") == ("shop", "web")
    for other in ("web.shop.svc.cluster.local.shop.svc.cluster.local.", "shop.svc.cluster.local.",
                  "web.shop.pod.cluster.local.", "example.com.", "web.shop.svc.other.domain."):
        assert service_name(other) is None, other


def test_upstream_servers_are_the_hosts_ipv4_name_servers(tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# comment\nsearch example.com\nnameserver 192.0.2.53\nnameserver ::1\n"
                      "nameserver not-an-ip\nnameserver 198.51.100.1\noptions ndots:2\n")
    assert upstream_servers(resolv) == ["192.0.2.53", "198.51.100.1"]
    assert upstream_servers(tmp_path / "missing") == []


class StubServices:
    """read_namespaced_service of a CoreV1Api, from a dict; a missing one is a 404."""

    def __init__(self, services: dict[tuple[str, str], str]):
        self.services = services

    def read_namespaced_service(self, name: str, namespace: str):
        if (namespace, name) not in self.services:
            raise ApiException(status=404)
        return SimpleNamespace(spec=SimpleNamespace(cluster_ip=self.services[namespace, name]))


def ask(resolver: ServiceResolver, name: str, qtype: str = "A") -> DNSRecord:
    return resolver.resolve(DNSRecord.question(name, qtype), handler=None)


def test_a_service_resolves_to_its_cluster_ip_and_an_unknown_one_is_nxdomain():
    resolver = ServiceResolver(StubServices({("shop", "web"): "10.0.0.42"}), upstreams=[])
    answer = ask(resolver, "web.shop.svc.cluster.local")
    assert [str(rr.rdata) for rr in answer.rr] == ["10.0.0.42"] and answer.header.rcode == RCODE.NOERROR
    assert ask(resolver, "db.shop.svc.cluster.local").header.rcode == RCODE.NXDOMAIN
    # A search-path miss inside the cluster domain is answered at once, never sent upstream.
    assert ask(resolver, "web.shop.svc.cluster.local.svc.cluster.local").header.rcode == RCODE.NXDOMAIN


def test_aaaa_for_a_service_is_an_empty_answer_not_nxdomain():
    """A resolver asking A and AAAA together must learn that the name exists."""
    resolver = ServiceResolver(StubServices({("shop", "web"): "10.0.0.42"}), upstreams=[])
    answer = ask(resolver, "web.shop.svc.cluster.local", "AAAA")
    assert answer.header.rcode == RCODE.NOERROR and answer.rr == []
    assert answer.q.qtype == QTYPE.AAAA


def test_other_names_without_a_reachable_upstream_are_servfail():
    resolver = ServiceResolver(StubServices({}), upstreams=[])
    assert ask(resolver, "example.com").header.rcode == RCODE.SERVFAIL


def test_an_api_server_that_fails_is_servfail_not_a_crash():
    class Failing:
        def read_namespaced_service(self, name, namespace):
            raise ConnectionError("API server away")

    assert ask(ServiceResolver(Failing(), upstreams=[]), "web.shop.svc.cluster.local").header.rcode == RCODE.SERVFAIL
