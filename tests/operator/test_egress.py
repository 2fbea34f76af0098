"""The runs' optional egress NetworkPolicy (`egress.py`), from the chart's values to the policy
the operator makes: only when turned on, DNS to kube-dns, the run's own pods, the listed CIDRs
with the cloud metadata addresses cut out. (Egress is not enforced by the local cluster: these
check what the policy says, which a plugin that enforces egress applies.)"""

import json

import kubernetes_validate
import pytest
from rlkube_operator.egress import build_egress_policy
from rlkube_operator.main import parse_args
from rlkube_operator.names import RunRef

from tests.operator.embedded import VERBS, operator_calls
from tests.operator.test_helm import operator_args, render
from tests.operator.test_operator_kmock import rlrun

RUN = RunRef("RLRun", "rt", "ml", "0f1e-uid")
EGRESS = {"enabled": True, "allowed": [{"cidr": "0.0.0.0/0", "ports": [443]}, {"cidr": "::/0", "ports": [443]},
                                       {"cidr": "10.96.0.0/12", "ports": [9000]}, {"cidr": "169.254.0.0/16"},
                                       {"cidr": "100.64.0.0/10"}, {"cidr": "169.254.20.10/32"}]}


def chart_egress(egress: dict):
    """The operator's egress setting as the chart passes it."""
    return parse_args(operator_args({"networkPolicy": {"egress": egress}})).egress_policy


def test_the_chart_gives_no_egress_policy_unless_turned_on():
    assert chart_egress({}) is None
    assert chart_egress({"enabled": False, "allowed": [{"cidr": "10.0.0.0/8"}]}) is None
    with pytest.raises(Exception, match="networkPolicy.egress.enabled needs networkPolicy.enabled"):
        render({"networkPolicy": {"enabled": False, "egress": {"enabled": True}}})


def test_the_policy_admits_dns_the_runs_pods_and_the_listed_cidrs_without_the_metadata_addresses():
    policy = build_egress_policy(RUN, chart_egress(EGRESS))
    kubernetes_validate.validate(policy, "1.37.0", strict=True)
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": RUN.pod_labels()} and spec["policyTypes"] == ["Egress"]
    dns, own, *listed = spec["egress"]
    assert dns == {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                   "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    assert own == {"to": [{"podSelector": {"matchLabels": RUN.pod_labels()}}]}
    assert [rule["to"] for rule in listed] == [
        # link-local whole (AWS, GCP, Azure, OpenStack, Oracle, ECS), Alibaba's, Azure's WireServer
        [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", "100.100.100.200/32", "168.63.129.16/32"]}}],
        [{"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}}],
        [{"ipBlock": {"cidr": "10.96.0.0/12"}}],  # no metadata address inside: nothing to cut
        # link-local listed by the admin: each metadata address in it
        [{"ipBlock": {"cidr": "169.254.0.0/16", "except": ["169.254.169.254/32", "169.254.170.2/32"]}}],
        [{"ipBlock": {"cidr": "100.64.0.0/10", "except": ["100.100.100.200/32"]}}],
        [{"ipBlock": {"cidr": "169.254.20.10/32"}}],  # NodeLocal DNSCache's address, listed: kept
    ]
    assert [rule.get("ports") for rule in listed] == [[{"protocol": "TCP", "port": 443}]] * 2 + [
        [{"protocol": "TCP", "port": 9000}], None, None, None]


@pytest.mark.parametrize(("allowed", "said"), [
    ([{"cidr": "10.0.0.1/8"}], "has host bits set"),
    ([{"cidr": "10.0.0.0/8", "ports": [0]}], "ports must be 1-65535"),
    ([{"cidr": "10.0.0.0/8", "port": 443}], "Extra inputs are not permitted"),
])
def test_a_bad_egress_setting_is_refused_naming_it(allowed, said, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--egress-policy", json.dumps({"allowed": allowed})])
    err = capsys.readouterr().err
    assert "--egress-policy" in err and said in err


@pytest.mark.parametrize("operator_settings", [
    {"egress": chart_egress(EGRESS)}, {}], ids=["egress-on", "egress-off"])
async def test_the_operator_makes_the_egress_policy_before_the_pods_only_when_on(cluster, operator_settings):
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    policy = cluster.get("NetworkPolicy", "rt-egress-network-policy")
    if not operator_settings:
        assert policy is None
        return
    assert policy["spec"]["policyTypes"] == ["Egress"]
    uid = cluster.get("RLRun", "rt")["metadata"]["uid"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"rlkube.dev/run-uid": uid}}
    assert [r["uid"] for r in policy["metadata"]["ownerReferences"]] == [uid]
    creates = [(resource, (request.data or {}).get("metadata", {}).get("name"))
               for request, resource in operator_calls(cluster.server) if VERBS[request.action.value] == "create"]
    first_workload = min(i for i, (resource, _) in enumerate(creates) if resource in ("statefulsets", "deployments", "jobs"))
    assert creates.index(("networkpolicies", "rt-egress-network-policy")) < first_workload
