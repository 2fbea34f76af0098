"""The local API server enforces ValidatingAdmissionPolicies (e2e/localcluster/policies.py):
the operator chart's guardrails refuse a hostile run there as a cluster's API server would."""

import yaml

from tests.operator.test_guardrails import HOSTILE, run
from tests.operator.test_helm import render


def test_the_local_api_server_refuses_a_hostile_run_as_a_cluster_would(local_api, ns):
    """The chart's policy and binding applied to the local API server (tests/cluster): kubectl
    gets the refusal naming the field; a benign run, and the hostile one where not bound, pass."""
    benign = run() | {"metadata": {"name": "benign"}}
    # the example's shared claim, which the admin lists (the guardrails allow what is listed)
    values = {"watch": {"namespaces": [ns]},
              "guardrails": {"allowedClaims": [benign["spec"]["storage"]["pvc"]["claimName"]]}}
    local_api.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(
        [o for o in render(values) if o["kind"].startswith("ValidatingAdmissionPolicy")]))
    hostile, _ = HOSTILE["hostPath"]
    hostile = hostile | {"metadata": {"name": "hostile"}}
    out = local_api.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(hostile), check=False)
    assert "is forbidden: ValidatingAdmissionPolicy" in out
    assert "spec.trainer.pod.volumes: volume host is a hostPath volume" in out
    assert local_api.get(f"/apis/rlkube.dev/v1alpha1/namespaces/{ns}/rlruns/hostile") is None
    assert "created" in local_api.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(benign))
    other = f"{ns}-other"
    local_api.create("/api/v1/namespaces", {"metadata": {"name": other}})
    assert "created" in local_api.kubectl("apply", "-n", other, "-f", "-", input=yaml.safe_dump(hostile))
