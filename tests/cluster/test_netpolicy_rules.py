"""The nft rules netpolicy.py derives from NetworkPolicies, for what the cluster test does not
try: who isolates a pod at all, ipBlock, port ranges and protocols, a port name no container
gives."""

from e2e.localcluster.netpolicy import Member, ingress_rules


def pod(name: str, ns: str, labels: dict, ports=()) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"containers": [{"name": "main", "ports": list(ports)}]}}


def policy(ns: str, ingress=None, types=None, selector=None) -> dict:
    spec = {"podSelector": selector or {}} | ({"ingress": ingress} if ingress is not None else {})
    return {"metadata": {"name": "p", "namespace": ns}, "spec": spec | ({"policyTypes": types} if types else {})}


SERVER = pod("server", "a", {"app": "s"}, [{"name": "dns", "containerPort": 53, "protocol": "UDP"}])
MEMBERS = [Member(SERVER, "10.0.0.2"), Member(pod("c", "a", {"role": "c"}), "10.0.0.3"),
           Member(pod("x", "b", {"role": "c"}), "10.0.0.4")]
NAMESPACES = {"a": {"metadata": {"name": "a"}}, "b": {"metadata": {"name": "b", "labels": {"team": "b"}}}}


def rules(*policies: dict) -> list[str] | None:
    return ingress_rules(SERVER, MEMBERS, NAMESPACES, list(policies))


def test_which_policies_isolate_a_pod():
    assert rules() is None, "no policy: open"
    assert rules(policy("b")) is None, "another namespace's policy"
    assert rules(policy("a", selector={"matchLabels": {"app": "other"}})) is None, "a selector that misses"
    assert rules(policy("a", ingress=[{}], types=["Egress"])) is None, "egress only"
    assert rules(policy("a")) == [], "selected, no ingress rule: nothing admitted"
    assert rules(policy("a", ingress=[{}])) == ["accept"], "an empty rule admits everything"


def test_peers_and_ports():
    assert rules(policy("a", ingress=[{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}]}])) \
        == ["ip saddr { 10.0.0.4 } accept"]
    assert rules(policy("a", ingress=[{"from": [{"podSelector": {"matchExpressions": [
        {"key": "role", "operator": "In", "values": ["c"]}]}}]}])) == ["ip saddr { 10.0.0.3 } accept"]
    assert rules(policy("a", ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.4/32"]}}]}])) \
        == ["ip saddr 10.0.0.0/24 ip saddr != { 10.0.0.4/32 } accept"]
    assert rules(policy("a", ingress=[{"from": [{"podSelector": {"matchLabels": {"role": "none"}}}]}])) == [], \
        "a peer that matches no pod admits nothing"
    assert rules(policy("a", ingress=[{"ports": [{"port": 8000, "endPort": 8010}, {"port": "dns", "protocol": "UDP"},
                                                 {"port": "dns"}, {"protocol": "SCTP"}]}])) \
        == ["meta l4proto tcp th dport { 8000-8010 } accept", "meta l4proto udp th dport { 53 } accept",
            "meta l4proto sctp accept"], "a TCP port named dns does not exist: that entry admits nothing"
