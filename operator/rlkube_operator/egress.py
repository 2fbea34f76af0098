"""The run's egress NetworkPolicy: where a run's pods may connect to (`--egress-policy`, the
chart's `networkPolicy.egress`, on by default).

On, a run's pods reach only DNS, their own run's pods, the CIDRs the admin lists for every run
(the object store's endpoints, on its ports) and those the run itself asks for in
`spec.network.egress` (a judge's or teacher's external `base_urls`, a model hub), each of which
must be one the admin allows (`guardrails.allowedEgress`, checked at admission and by the
operator). Never the clouds' instance metadata services (node credentials on most clouds:
`METADATA_ADDRESSES`, and link-local as a whole), cut out of every CIDR that contains them
(`ipBlock.except`). It needs a network plugin that enforces egress rules. Off (the operator
without `--egress-policy`), a run's pods may dial anything.
"""

import ipaddress

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlkube_operator.names import RunRef
from rlkube_operator.schema import K8sModel

LINK_LOCAL = ipaddress.ip_network("169.254.0.0/16")
"""Cut whole from any wider CIDR: the metadata services of most clouds live there, and nothing a run
needs does."""
METADATA_ADDRESSES = tuple(map(ipaddress.ip_network, (
    "169.254.169.254/32",  # AWS, GCP, Azure, OpenStack, Oracle (IPv4)
    "169.254.170.2/32",  # AWS ECS and EKS Pod Identity credentials
    "100.100.100.200/32",  # Alibaba Cloud
    "168.63.129.16/32",  # Azure WireServer
    "fd00:ec2::254/128",  # AWS (IPv6)
)))
"""The clouds' instance metadata and credential endpoints, cut from any CIDR that contains them."""
KUBE_DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
"""The cluster's DNS pods, as kubeadm, kind, EKS, GKE and AKS label them (CoreDNS included)."""


class Destination(K8sModel):
    """A CIDR the run's pods may connect to, on `ports` (TCP; none listed: every port)."""

    model_config = ConfigDict(extra="forbid")
    cidr: str = Field(max_length=43)
    """An IPv4 or IPv6 network (`203.0.113.0/24`, `2001:db8::/32`; one address: `/32`, `/128`)."""
    ports: list[int] = Field(default_factory=list, max_length=16)
    """TCP ports; none: every port."""

    @field_validator("cidr")
    @classmethod
    def _network(cls, value: str) -> str:
        return str(ipaddress.ip_network(value, strict=True))

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        if bad := [p for p in value if not 1 <= p <= 65535]:
            raise ValueError(f"ports must be 1-65535, not {bad}")
        return value


class Egress(BaseModel):
    """Where a run's pods may connect when the egress policy is on."""

    model_config = ConfigDict(extra="forbid")
    dns: dict = Field(default_factory=lambda: dict(KUBE_DNS))
    """The NetworkPolicyPeer of the cluster's DNS, reached on port 53 (UDP and TCP)."""
    allowed: list[Destination] = Field(default_factory=list)
    """The object store's endpoints and whatever else the runs must reach (a model hub)."""


class NetworkSpec(K8sModel):
    """Where the run's pods may connect beyond DNS, the run's own pods and what the cluster admin
    opens to every run (the object store). Applies where the operator makes egress policies."""

    egress: list[Destination] = Field(default_factory=list, max_length=16)
    """CIDRs the run's pods may connect to: a judge's or teacher's external `base_urls`, a model
    hub. Each must be one the cluster admin allows (`guardrails.allowedEgress`: its CIDR as
    listed, its ports among the listed ones)."""


def ip_block(cidr: str) -> dict:
    """`cidr` without the metadata addresses inside it: without the whole link-local range when
    it is wider, else (a CIDR within link-local the admin listed) without each address in it."""
    network = ipaddress.ip_network(cidr)

    def inside(inner) -> bool:
        return inner.version == network.version and inner.subnet_of(network) and inner != network

    cut = [LINK_LOCAL] if inside(LINK_LOCAL) else []
    cut += [m for m in METADATA_ADDRESSES if inside(m) and not (cut and m.subnet_of(LINK_LOCAL))]
    return {"cidr": cidr, "except": [str(c) for c in cut]} if cut else {"cidr": cidr}


def build_egress_policy(run: RunRef, egress: Egress, asked: list[Destination] = (), peers: list[dict] = ()) -> dict:
    """`<run>-egress-network-policy`: every pod of the run may connect only to DNS, the run's own
    pods, `egress.allowed` and what the run `asked` for (`spec.network.egress`, within the
    guardrails); `peers`: further rules, a pool's and its members' pods (`pools`)."""
    dns = {"to": [egress.dns], "ports": [{"protocol": p, "port": 53} for p in ("UDP", "TCP")]}
    own = {"to": [{"podSelector": {"matchLabels": run.pod_labels()}}]}
    allowed = [{"to": [{"ipBlock": ip_block(d.cidr)}]} | (
        {"ports": [{"protocol": "TCP", "port": p} for p in d.ports]} if d.ports else {})
        for d in [*egress.allowed, *asked]]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata("egress-network-policy"),
        "spec": {"podSelector": {"matchLabels": run.pod_labels()}, "policyTypes": ["Egress"],
                 "egress": [dns, own, *allowed, *peers]},
    }
