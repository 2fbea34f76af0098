"""What a user who has the chart and nothing else gets: NOTES.txt's first run (a manifest inline,
to a namespace the operator watches, which the CRD schema, its CEL rules, the operator's spec and
both enforcements of the guardrails accept), and one value, `image.registry`, that points the
operator's image, the first run's image and the guardrails' allowed registries at their registry."""

import re
import textwrap

import pytest
import yaml
from rlkube_operator.main import parse_args
from rlkube_operator.spec import SFTRunSpec

from tests.operator.test_crds import cel_errors, schema_errors
from tests.operator.test_guardrails import Policy, operator_refusals
from tests.operator.test_helm import operator_args, render, render_files

NOTES = "rlkube/templates/NOTES.txt"
SYSTEM = {"kube-system", "kube-public", "kube-node-lease", "rlkube-system"}


def first_run(values: dict, kube_version: str | None = None) -> tuple[str, str, dict]:
    """NOTES.txt, the namespace its first run goes to (`kubectl apply -n NS -f - <<'EOF'`) and
    the run in the heredoc."""
    notes = render_files(values, kube_version=kube_version)[NOTES]
    match = re.search(r"kubectl apply -n (\S+) -f - <<'EOF'\n(.*?)\n\s*EOF\n", notes, re.DOTALL)
    assert match, notes
    return notes, match[1], yaml.safe_load(textwrap.dedent(match[2]))


@pytest.mark.parametrize("values", [{}, {"watch": {"namespaces": ["team-a", "team-b"]}},
                                    {"watch": {"allNamespaces": True}},
                                    {"image": {"registry": "registry.example.com:5000/ml"}}],
                         ids=["default", "two-namespaces", "cluster-wide", "own-registry"])
def test_the_first_run_goes_to_a_watched_namespace_and_is_accepted(values):
    notes, namespace, run = first_run(values)
    assert "examples/" not in notes  # a chart user has no checkout
    args = parse_args(operator_args(values))
    if args.all_namespaces:
        assert namespace not in SYSTEM
    else:
        assert namespace in args.namespace
    assert f"kubectl -n {namespace} get sftruns -w" in notes
    run["metadata"]["namespace"] = namespace
    assert run["kind"] == "SFTRun" and schema_errors("SFTRun", run) == [] and cel_errors("SFTRun", run) == []
    SFTRunSpec.model_validate(run["spec"])
    assert Policy(values).refusals(run) == []
    assert operator_refusals(run, values) == []
    assert run["spec"]["image"].startswith(values.get("image", {}).get("registry", "ghcr.io/rlkube") + "/")


def test_notes_say_where_the_guardrails_are_not_checked_at_admission():
    notes, _, _ = first_run({}, kube_version="v1.29.4")
    assert "Kubernetes v1.29.4 has no ValidatingAdmissionPolicy v1 (1.30)" in notes
    assert "only by the operator" in notes
    assert "refuse a run at admission" in first_run({}, kube_version="v1.30.0")[0]
    assert "guardrails" not in first_run({"guardrails": {"enabled": False}})[0]


def test_one_value_points_the_chart_the_guardrails_and_the_first_run_at_the_users_registry():
    values = {"image": {"registry": "registry.example.com:5000/ml"}}
    (deployment,) = [o for o in render(values) if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "registry.example.com:5000/ml/rlkube-operator:0.1.0"
    _, namespace, run = first_run(values)
    run["metadata"]["namespace"] = namespace
    assert run["spec"]["image"] == "registry.example.com:5000/ml/rlkube-runtime-cpu:0.1.0"
    upstream = run | {"spec": run["spec"] | {"image": "ghcr.io/rlkube/rlkube-runtime-cpu:0.1.0"}}
    for refusals in (Policy(values).refusals, lambda obj: operator_refusals(obj, values)):
        assert refusals(run) == []
        assert refusals(upstream) == [("spec.image ghcr.io/rlkube/rlkube-runtime-cpu:0.1.0 is not from a registry"
                                       " the cluster admin allows (guardrails.allowedImageRegistries)")]
    # The admin's own list adds to it; `repository` still names an operator image anywhere.
    more = {"image": values["image"] | {"repository": "mirror.example.com/rlkube-operator"},
            "guardrails": {"allowedImageRegistries": ["ghcr.io/rlkube/"]}}
    assert parse_args(operator_args(more)).guardrails.allowed_image_registries == [
        "registry.example.com:5000/ml/", "ghcr.io/rlkube/"]
    (deployment,) = [o for o in render(more) if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "mirror.example.com/rlkube-operator:0.1.0"
    assert Policy(more).refusals(upstream) == []


@pytest.mark.parametrize("registry", ["ghcr.io/rlkube/", "a,b", "reg.example.com/it's"])
def test_a_registry_that_is_no_image_prefix_is_refused_naming_the_value(registry):
    with pytest.raises(Exception, match="image.registry"):
        render({"image": {"registry": registry}})
