"""The runs' egress NetworkPolicy (`egress.py`), from the chart's values to the policy the operator
makes: on by default, DNS to kube-dns, the run's own pods, the listed CIDRs and those a run asks
for within `guardrails.allowedEgress`, with the cloud metadata addresses cut out. (Egress is not enforced by the local cluster: these
check what the policy says, which a plugin that enforces egress applies.)"""

import json

import kubernetes_validate
import pytest
from rlkube_operator.egress import Egress, build_egress_policy
from rlkube_operator.main import parse_args
from rlkube_operator.names import RunRef

from tests.operator.embedded import PERMISSIVE, VERBS, operator_calls
from tests.operator.test_guardrails import EXAMPLES, Policy, operator_refusals, run
from tests.operator.test_helm import operator_args
from tests.operator.test_operator_kmock import rlrun

RUN = RunRef("RLRun", "rt", "ml", "0f1e-uid")
EGRESS = {"enabled": True, "allowed": [{"cidr": "0.0.0.0/0", "ports": [443]}, {"cidr": "::/0", "ports": [443]},
                                       {"cidr": "10.96.0.0/12", "ports": [9000]}, {"cidr": "169.254.0.0/16"},
                                       {"cidr": "100.64.0.0/10"}, {"cidr": "169.254.20.10/32"}]}


def chart_egress(egress: dict):
    """The operator's egress setting as the chart passes it."""
    return parse_args(operator_args({"networkPolicy": {"egress": egress}})).egress_policy


def test_the_chart_gives_an_egress_policy_by_default_and_none_when_turned_off():
    """On by default: DNS and the run's own pods, nothing else until the admin lists it."""
    assert chart_egress({}) == Egress()
    assert chart_egress({"enabled": False, "allowed": [{"cidr": "10.0.0.0/8"}]}) is None
    off = parse_args(operator_args({"networkPolicy": {"enabled": False}}))  # both kinds of policy go
    assert off.no_network_policy and off.egress_policy is None


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
async def test_the_operator_makes_its_policies_before_the_pods_and_egress_only_when_on(cluster, operator_settings):
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    creates = [(resource, (request.data or {}).get("metadata", {}).get("name"))
               for request, resource in operator_calls(cluster.server) if VERBS[request.action.value] == "create"]
    first_workload = min(i for i, (resource, _) in enumerate(creates) if resource in ("statefulsets", "deployments", "jobs"))
    for ingress in ("rt-network-policy", "rt-trainer-network-policy", "rt-servers-network-policy"):  # fences first
        assert creates.index(("networkpolicies", ingress)) < first_workload, ingress
    policy = cluster.get("NetworkPolicy", "rt-egress-network-policy")
    if not operator_settings:
        assert policy is None
        return
    assert policy["spec"]["policyTypes"] == ["Egress"]
    uid = cluster.get("RLRun", "rt")["metadata"]["uid"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"rlkube.dev/run-uid": uid}}
    assert [r["uid"] for r in policy["metadata"]["ownerReferences"]] == [uid]
    assert creates.index(("networkpolicies", "rt-egress-network-policy")) < first_workload


JUDGE_HOST = {"cidr": "203.0.113.7/32", "ports": [443]}
"""A judge's external `base_urls` host, which its run asks to reach."""
ALLOWED_EGRESS = [{"cidr": "203.0.113.7/32", "ports": [443, 8443]}, {"cidr": "198.51.100.0/24"},
                  {"cidr": "0.0.0.0/0", "ports": [443]}]


@pytest.mark.parametrize(("asked", "refused"), [
    ([JUDGE_HOST], None),
    ([{"cidr": "198.51.100.0/24", "ports": [22]}], None),  # no ports listed: any
    ([{"cidr": "203.0.113.7/32"}], "203.0.113.7/32"),  # every port: more than the admin allows
    ([{"cidr": "203.0.113.7/32", "ports": [22]}], "203.0.113.7/32"),
    ([{"cidr": "::/0", "ports": [443]}], "::/0"),
    ([{"cidr": "0.0.0.0/0", "ports": [80]}], "0.0.0.0/0"),
    ([JUDGE_HOST, {"cidr": "169.254.169.254/32"}], "169.254.169.254/32"),
])
def test_a_run_asks_for_egress_only_within_what_the_admin_allows(asked, refused):
    """At admission (the chart's policy) and in the operator, each naming the field and the CIDR."""
    obj = run(network={"egress": asked})
    values = EXAMPLES | {"guardrails": EXAMPLES["guardrails"] | {"allowedEgress": ALLOWED_EGRESS}}
    for where, messages in (("admission", Policy(values).refusals(obj)), ("operator", operator_refusals(obj, values))):
        if refused is None:
            assert messages == [], where
        else:
            assert messages == [(f"spec.network.egress: {refused} (on those ports) is not a destination the "
                                 "cluster admin allows (guardrails.allowedEgress)")], where
    assert Policy(EXAMPLES).refusals(run(network={"egress": [JUDGE_HOST]})), "no allowedEgress: none"


@pytest.mark.parametrize("operator_settings", [
    {"egress": Egress(), "guardrails": PERMISSIVE.model_copy(update={"allowed_egress": ALLOWED_EGRESS})}])
async def test_the_egress_a_run_asks_for_is_in_its_policy_with_the_metadata_addresses_cut(cluster, operator_settings):
    await cluster.create(rlrun(network={"egress": [JUDGE_HOST, {"cidr": "198.51.100.0/24"},
                                                   {"cidr": "0.0.0.0/0", "ports": [443]}]}))
    policy = await cluster.until(lambda: cluster.get("NetworkPolicy", "rt-egress-network-policy"), what="policy")
    _dns, _own, *asked = policy["spec"]["egress"]
    assert asked == [{"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}], "ports": [{"protocol": "TCP", "port": 443}]},
                     {"to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]},
                     {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                         "169.254.0.0/16", "100.100.100.200/32", "168.63.129.16/32"]}}],
                      "ports": [{"protocol": "TCP", "port": 443}]}]
