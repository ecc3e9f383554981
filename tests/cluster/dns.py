"""The real node's cluster DNS: a stand-in for CoreDNS's `kubernetes` plugin, as far as pods here need it.

`python -m tests.cluster.dns --kubeconfig K --address IP --state-dir DIR` answers, on IP:53 (UDP and
TCP), the names Kubernetes gives Services: `SERVICE.NAMESPACE.svc.cluster.local` is the Service's
ClusterIP, or for a headless Service the addresses of its ready endpoints. Every other name is passed
to this machine's own resolvers (the ones in /etc/resolv.conf), so pods resolve what the host does.

Each question reads the Service from the API server, so an answer is never staler than the Service
itself (pods here ask a few questions a second at most). AAAA questions for a Service get an empty
answer (this cluster is IPv4 only), which tells a resolver the name exists. Only A and AAAA are served:
pods here need nothing else (no SRV, no PTR).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time
from pathlib import Path

from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer
from kubernetes import client, config
from kubernetes.client.rest import ApiException

CLUSTER_DOMAIN = "cluster.local"
TTL = 5
UPSTREAM_TIMEOUT = 3.0


def service_name(qname: str, domain: str = CLUSTER_DOMAIN) -> tuple[str, str] | None:
    """(namespace, service) for `service.namespace.svc.<domain>.`, None for any other name."""
    labels = qname.rstrip(".").lower().split(".")
    suffix = ["svc", *domain.split(".")]
    if len(labels) != 2 + len(suffix) or labels[2:] != suffix:
        return None
    return labels[1], labels[0]


def upstream_servers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The host's name servers, IPv4 and not loopback-only stubs we cannot reach from here."""
    servers = []
    for line in resolv_conf.read_text().splitlines() if resolv_conf.exists() else []:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                if ipaddress.ip_address(fields[1]).version == 4:
                    servers.append(fields[1])
            except ValueError:
                continue
    return servers


class ServiceResolver(BaseResolver):
    def __init__(self, core: client.CoreV1Api, upstreams: list[str]):
        self.core = core
        self.upstreams = upstreams

    def addresses(self, namespace: str, name: str) -> list[str] | None:
        """The Service's ClusterIP (or its ready endpoints' addresses, headless); None if there is none."""
        try:
            service = self.core.read_namespaced_service(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        if service.spec.cluster_ip and service.spec.cluster_ip != "None":
            return [service.spec.cluster_ip]
        slices = client.DiscoveryV1Api(self.core.api_client).list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={name}")
        return sorted({address for piece in slices.items for endpoint in piece.endpoints or []
                       if endpoint.conditions is None or endpoint.conditions.ready is not False
                       for address in endpoint.addresses})

    def resolve(self, request: DNSRecord, handler) -> DNSRecord:
        reply = request.reply()
        question = request.q
        wanted = service_name(str(question.qname))
        if wanted is None:
            if str(question.qname).rstrip(".").lower().endswith(CLUSTER_DOMAIN):
                reply.header.rcode = RCODE.NXDOMAIN  # a search-path miss: answer at once, never upstream
                return reply
            return self.forward(request)
        try:
            addresses = self.addresses(*wanted)
        except Exception as e:  # noqa: BLE001 - the API server is away: say so, do not die
            print(f"lookup of {question.qname} failed: {e}", file=sys.stderr, flush=True)
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif question.qtype == QTYPE.A:
            for address in addresses:
                reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=TTL))
        return reply

    def forward(self, request: DNSRecord) -> DNSRecord:
        for server in self.upstreams:
            try:
                return DNSRecord.parse(request.send(server, 53, timeout=UPSTREAM_TIMEOUT))
            except Exception:  # noqa: BLE001 - try the next server
                continue
        reply = request.reply()
        reply.header.rcode = RCODE.SERVFAIL
        return reply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.dns", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--address", required=True, help="the IP to serve on (port 53)")
    parser.add_argument("--state-dir", required=True, help="the cluster's; names this process as its own")
    args = parser.parse_args(argv)
    core = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
    resolver = ServiceResolver(core, [s for s in upstream_servers() if s != args.address])
    quiet = DNSLogger("-recv,-send,-request,-reply,-truncated,-data", prefix=False)  # errors only
    servers = [DNSServer(resolver, address=args.address, port=53, tcp=tcp, logger=quiet) for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    print(f"serving {CLUSTER_DOMAIN} on {args.address}:53 for the cluster in {args.state_dir}", flush=True)
    while all(server.isAlive() for server in servers):
        time.sleep(1)
    return 1


if __name__ == "__main__":
    sys.exit(main())
