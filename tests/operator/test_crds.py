"""The generated CRDs: fresh, valid CustomResourceDefinitions, structural, with printer
columns that never depend on list order; and the schema rejects bad specs at the field."""

import copy
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError
from rlkube_operator import crd, reconcile
from rlkube_operator.spec import KINDS, RLRunSpec

from tests.fixtures import prerequisites
from tests.operator.test_operator_kmock import TEACHER, example
from tests.operator.test_upgrade import applied, user_set

REPO = Path(__file__).resolve().parents[2]
CRDS = {name: yaml.safe_load(text) for name, text in crd.render_all().items()}


def test_committed_crds_are_fresh():
    assert crd.main(["--check"]) == 0, "run `python -m rlkube_operator.crd`"


def test_stale_crds_are_detected(tmp_path, monkeypatch):
    monkeypatch.setattr(crd, "OUTPUT_DIRS", [tmp_path])
    crd.main([])
    (tmp_path / "rlkube.dev_rlruns.yaml").write_text("stale")
    assert crd.main(["--check"]) == 1


@pytest.mark.parametrize("name", sorted(CRDS))
def test_crd_is_a_valid_customresourcedefinition(name):
    kubernetes_validate.validate(CRDS[name], "1.37.0", strict=True)
    version = CRDS[name]["spec"]["versions"][0]
    scale = {"scale": {"specReplicasPath": ".spec.inference.replicas", "statusReplicasPath": ".status.inference.replicas",
                       "labelSelectorPath": ".status.inference.selector"}}
    assert version["subresources"] == {"status": {}} | (scale if name == "rlkube.dev_rlruns.yaml" else {})
    assert CRDS[name]["spec"]["names"]["shortNames"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert ({"Phase", "Members", "Ready", "Age"} if name == "rlkube.dev_rlpools.yaml" else
            {"Phase", "Step", "Reward", "Age"}) <= set(columns)
    assert not any("conditions" in path for path in columns.values())
    assert CRDS[name]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def _assert_structural(node: dict, where: str) -> None:
    """The rules the API server applies to a structural schema (apiextensions v1)."""
    for banned in ("$ref", "anyOf", "oneOf", "allOf", "$defs", "const", "prefixItems", "title"):
        assert banned not in node, f"{where}: {banned}"
    special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    assert "type" in node or special, f"{where}: no type"
    assert not ("properties" in node and "additionalProperties" in node), f"{where}: both"
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
        raise TypeError(f"{where}: numeric exclusiveMinimum")
    if "default" in node:
        jsonschema.validate(node["default"], _to_jsonschema(node))
    for key, sub in node.get("properties", {}).items():
        _assert_structural(sub, f"{where}.{key}")
    if isinstance(node.get("items"), dict):
        _assert_structural(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        _assert_structural(node["additionalProperties"], f"{where}.*")


@pytest.mark.parametrize("name", sorted(CRDS))
def test_crd_schema_is_structural(name):
    _assert_structural(CRDS[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "root")


def _descriptions(node: dict, where: str):
    if "description" in node:
        yield where, node["description"]
    for key, sub in node.get("properties", {}).items():
        yield from _descriptions(sub, f"{where}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _descriptions(node[key], f"{where}.{key}")


@pytest.mark.parametrize("name", sorted(CRDS))
def test_descriptions_read_as_prose_in_kubectl_explain(name):
    """No source line breaks of the docstrings, no YAML document markers in the defaults."""
    described = dict(_descriptions(CRDS[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "root"))
    assert len(described) > 50
    for where, text in described.items():
        assert "\n" not in text.replace("\n\n", ""), where
        assert "..." not in text, where
    output_dir = described["root.spec.config.output_dir"]
    assert output_dir.endswith('(default: "outputs/run")'), output_dir


def _to_jsonschema(node):
    """OpenAPI v3.0 (Kubernetes flavour) → JSON Schema, to validate like the API server does."""
    if isinstance(node, list):
        return [_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_jsonschema(v) for k, v in node.items()
           if not k.startswith("x-kubernetes") and k not in ("nullable", "default", "exclusiveMinimum", "exclusiveMaximum")}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else out["type"] + ["null"]
    if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False  # kubectl's strict field validation
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(bound) is True:
            out[bound] = out.pop(inclusive)
    return out


def with_spec_field(run: dict, path: tuple[str, ...], value) -> dict:
    """`run` with `spec.<path>` set to `value` (removed when None), parents made as needed."""
    node = run["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node.pop(path[-1], None)
    if value is not None:
        node[path[-1]] = value
    return run


def schema_errors(kind: str, obj: dict) -> list[str]:
    schema = _to_jsonschema(CRDS[f"rlkube.dev_{kind.lower()}s.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    validator = jsonschema.Draft7Validator(schema)
    return [".".join(map(str, e.absolute_path)) + ": " + e.message for e in validator.iter_errors(obj)]


def test_examples_pass_the_schema():
    assert schema_errors("RLRun", example("rlrun.yaml")) == []
    assert schema_errors("RLRun", example("opd-rlrun.yaml")) == []
    assert schema_errors("RLRun", example("judge-rlrun.yaml")) == []
    assert schema_errors("SFTRun", example("sftrun.yaml")) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("inference", "replicas"), 0, "spec.inference.replicas: 0 is less than the minimum of 1"),
        (("suspend",), "yes", "spec.suspend: 'yes' is not of type 'boolean'"),
        (("config", "orchestrator", "group_size"), 0, "spec.config.orchestrator.group_size: 0 is less than"),
        (("config", "inference", "gpu_memory_utilization"), 0, "spec.config.inference.gpu_memory_utilization"),
        (("config", "trainer", "loss", "type"), "ppo", "spec.config.trainer.loss.type: 'ppo' is not one of"),
        (("trainer", "gpusPerNod"), 8, "spec.trainer: Additional properties are not allowed ('gpusPerNod'"),
        (("teacher",), {"replicas": 2, "model": {"dtype": "bfloat16"}}, "spec.teacher.model: 'name' is a required"),
        (("teacher",), {"model": {"name": "t"}, "server": {"replicas": 2}},
         "spec.teacher.server: Additional properties are not allowed ('replicas'"),
    ],
)
def test_schema_rejects_bad_fields_with_their_path(path, value, expected):
    run = with_spec_field(example("rlrun.yaml"), path, value)
    errors = schema_errors("RLRun", run)
    assert any(e.startswith(expected) for e in errors), errors


def test_cel_rules_cover_what_pydantic_validators_check():
    """Cross-field rules (validators in pydantic) are CEL rules in the schema, with messages."""
    spec = CRDS["rlkube.dev_rlruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    messages = " ".join(r["message"] for r in spec["x-kubernetes-validations"])
    assert "config.inference.replicas must equal inference.replicas" in messages
    assert "needs storage.pvc or storage.objectStore" in messages
    assert "config.orchestrator.env_workers must equal envWorkers.replicas" in messages


def test_operator_imports_without_torch_or_vllm():
    code = (
        "import sys, rlkube_operator.main, rlkube_operator.crd;"
        "heavy = {'torch', 'vllm', 'transformers'} & set(sys.modules);"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def cel_errors(kind: str, obj: dict, old: dict | None = None) -> list[str]:
    """The messages of the CRD's CEL rules (every node's) that `obj` breaks, evaluated as the
    local API server admits a write (e2e/localcluster/admission.py: cel-python, the schema's
    defaults applied); with `old`, as an update of `old` to `obj` (transition rules included)."""
    prerequisites.import_module("celpy", "cel-python, from the dev extra")
    from e2e.localcluster import admission

    root = CRDS[f"rlkube.dev_{kind.lower()}s.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return [error.split(": ", 1)[1] for error in admission.check(root, obj, old)]


def test_cel_rules_compile_and_accept_the_examples():
    assert cel_errors("RLRun", example("rlrun.yaml")) == []
    assert cel_errors("RLRun", example("opd-rlrun.yaml")) == []
    KINDS["RLRun"].model_validate(example("opd-rlrun.yaml")["spec"])
    assert cel_errors("RLRun", example("judge-rlrun.yaml")) == []
    KINDS["RLRun"].model_validate(example("judge-rlrun.yaml")["spec"])
    assert cel_errors("SFTRun", example("sftrun.yaml")) == []
    minimal = {"metadata": {"name": "m"}, "spec": {"image": "x", "config": {"weights": {"type": "grpc"}}}}
    assert cel_errors("RLRun", minimal) == []


def test_cel_rules_reject_what_pydantic_validators_reject():
    run = example("rlrun.yaml")
    run["spec"]["config"]["inference"]["replicas"] = 3
    assert cel_errors("RLRun", run) == ["config.inference.replicas must equal inference.replicas (or be left out)"]
    workers = example("rlrun.yaml")
    workers["spec"]["config"]["orchestrator"]["env_workers"] = 2
    assert cel_errors("RLRun", workers) == [
        "config.orchestrator.env_workers must equal envWorkers.replicas (or be left out)"]
    workers["spec"]["envWorkers"] = {"replicas": 2}
    assert cel_errors("RLRun", workers) == []
    no_storage = {"metadata": {"name": "m"}, "spec": {"image": "x"}}
    assert any("needs storage.pvc or storage.objectStore" in e for e in cel_errors("RLRun", no_storage))
    long_name = example("sftrun.yaml")
    long_name["metadata"]["name"] = "x" * 41
    assert cel_errors("SFTRun", long_name) == [crd.NAME_RULES[0]["message"]]


@pytest.mark.parametrize("name", ["Reverse-text", "1run", "run.v2", "run_2", "run-", "-run", "rün"])
def test_names_that_cannot_become_dns_labels_are_refused_at_admission(name):
    """The run's Services (`<name>-trainer-master`, `<name>-inference`) must be DNS-1035 labels."""
    for kind, manifest in (("RLRun", "rlrun.yaml"), ("SFTRun", "sftrun.yaml")):
        run = example(manifest)
        run["metadata"]["name"] = name
        assert cel_errors(kind, run) == [crd.NAME_RULES[1]["message"]], (kind, name)
    run = example("rlrun.yaml")
    run["metadata"]["name"] = "r" + "-2" * 19 + "x"  # 40 characters, every child name valid
    assert cel_errors("RLRun", run) == []


def test_a_multi_node_trainer_on_a_single_node_claim_is_refused():
    """Every trainer pod mounts the claim from its own node: ReadWriteOnce cannot do that."""
    message = "storage.pvc.accessModes must include ReadWriteMany when trainer.nodes > 1"
    for kind, manifest in (("RLRun", "rlrun.yaml"), ("SFTRun", "sftrun.yaml")):
        run = example(manifest)
        run["spec"]["trainer"]["nodes"] = 2
        run["spec"]["storage"] = {"pvc": {"size": "1Gi"}}  # the default: ReadWriteOnce
        assert [e for e in cel_errors(kind, run) if e.startswith(message)], kind
        run["spec"]["storage"]["pvc"]["accessModes"] = ["ReadWriteMany"]
        assert cel_errors(kind, run) == [], kind
        run["spec"]["storage"] = {"pvc": {"claimName": "theirs"}}  # a claim the user made: theirs to say
        assert cel_errors(kind, run) == [], kind


def test_operator_cli_needs_a_watch_scope():
    from rlkube_operator.main import main

    assert main([]) == 2  # neither --namespace nor --all-namespaces: refuse, do not guess
    with pytest.raises(SystemExit) as exit_info:
        main(["--namespace", "a", "--all-namespaces"])
    assert exit_info.value.code == 2


OWN_CLAIM = {"pvc": {"size": "1Gi", "accessModes": ["ReadWriteOncePod"]}}  # a claim the operator creates
# (kind, the example with these spec fields set (dotted paths; None: left out), what the API
# server answers; None: accepted)
ADMISSION = [
    ("RLRun", {"config.orchestrator.batch_size": 30}, "batch_size must be a multiple of group_size"),
    ("RLRun", {"config.orchestrator.batch_size": None, "config.orchestrator.group_size": 3},
     "batch_size must be a multiple of group_size"),  # the default batch_size, 128
    ("RLRun", {"config.orchestrator.batch_size": 24, "config.orchestrator.group_size": 3}, None),
    ("RLRun", {"config.orchestrator.sampling.temperature": 0}, "temperature must be > 0 for training"),
    ("RLRun", {"config.orchestrator.sampling.top_p": 0.9}, "top_p must be 1 for training"),
    ("RLRun", {"config.orchestrator.eval": {"sampling": {"temperature": 0, "top_p": 0.9}}}, None),
    ("RLRun", {"config.teacher": {"model": {"name": "teacher"}}}, "config.teacher is the teacher server `rlkube rl` starts"),
    ("RLRun", {"config.judge": {"model": {"name": "judge"}}}, "config.judge is the judge server `rlkube rl` starts"),
    ("RLRun", {"storage": OWN_CLAIM}, "storage.pvc.accessModes ['ReadWriteOncePod'] lets one pod use the claim"),
    ("SFTRun", {"storage": OWN_CLAIM}, None),  # one pod
    ("SFTRun", {"storage": OWN_CLAIM, "trainer.nodes": 2},
     "storage.pvc.accessModes ['ReadWriteOncePod'] lets one pod use the claim"),
]


@pytest.mark.parametrize(("kind", "fields", "refusal"), ADMISSION)
def test_cel_admission_and_the_operator_agree(kind, fields, refusal):
    """Each cross-field rule the runtime's validators (and so the operator) enforce is refused by
    the API server too, with its message; what the operator accepts, admission accepts."""
    run = example(f"{kind.lower()}.yaml")
    for path, value in fields.items():
        run = with_spec_field(run, tuple(path.split(".")), copy.deepcopy(value))
    errors = cel_errors(kind, run)
    if refusal is None:
        assert errors == []
        KINDS[kind].model_validate(run["spec"])
    else:
        assert any(e.startswith(refusal) for e in errors), errors
        with pytest.raises(ValidationError):
            KINDS[kind].model_validate(run["spec"])


def test_every_cel_field_path_names_a_field_of_its_node():
    """The API server refuses a CRD whose rule's fieldPath is not in the schema."""
    def walk(node):
        for rule in node.get("x-kubernetes-validations", []):
            if "fieldPath" in rule:
                assert rule["fieldPath"].lstrip(".") in node["properties"], rule
                yield rule
        for sub in node.get("properties", {}).values():
            yield from walk(sub)

    for crd_ in CRDS.values():
        list(walk(crd_["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
    spec = CRDS["rlkube.dev_rlruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    inside_config = {r["fieldPath"] for r in walk(spec) if "oldSelf" not in r["rule"]}
    assert inside_config == {".batch_size", ".temperature", ".top_p"}


@pytest.mark.parametrize(("path", "value", "expected"), [
    (("trainer", "nodes"), 0, "spec.trainer.nodes: 0 is less than the minimum of 1"),
    (("config", "inference", "replicas"), 0, "spec.config.inference.replicas: 0 is less than the minimum of 1"),
    (("inference", "resources", "requests", "memory"), "16 GB", "spec.inference.resources.requests.memory: '16 GB'"),
    (("trainer", "resources", "limits", "cpu"), "two", "spec.trainer.resources.limits.cpu: 'two' does not match"),
])
def test_replicas_and_quantities_are_checked_by_the_schema(path, value, expected):
    run = with_spec_field(example("rlrun.yaml"), path, value)
    errors = schema_errors("RLRun", run)
    assert any(e.startswith(expected) for e in errors), errors
    with pytest.raises(ValidationError, match=path[-1]):
        RLRunSpec.model_validate(run["spec"])


def test_well_formed_quantities_pass_the_schema_and_the_operator():
    run = example("rlrun.yaml")
    run["spec"]["inference"]["resources"] = {"requests": {"cpu": "500m", "memory": "1.5Gi", "ephemeral-storage": 10},
                                             "limits": {"memory": "2e9", "cpu": 4}}
    assert schema_errors("RLRun", run) == []
    RLRunSpec.model_validate(run["spec"])


RESOURCES = {"requests": {"cpu": "3", "memory": "7Gi"}}
# (kind, the old spec's fields, the update's fields (dotted paths), the spec field refused; None: accepted)
TRANSITIONS = [
    ("RLRun", {}, {}, None),
    ("RLRun", {}, {"suspend": True, "restartPolicy.backoffLimit": 5, "ttlSecondsAfterFinished": 60}, None),
    ("RLRun", {}, {"image": "other:2"}, "image"),
    ("RLRun", {}, {"trainer.resources": RESOURCES}, "trainer"),
    ("RLRun", {}, {"suspend": True, "trainer.resources": RESOURCES}, "trainer"),  # suspend first
    ("RLRun", {"suspend": True}, {"trainer.resources": RESOURCES}, None),
    ("RLRun", {"suspend": True}, {"suspend": False, "inference.replicas": 2, "inference.resources": RESOURCES,
                                  "orchestrator.resources": RESOURCES, "envWorkers.replicas": 3}, None),
    ("RLRun", {}, {"inference.replicas": 3}, None),  # kubectl scale rlrun
    ("RLRun", {}, {"inference.replicas": 3, "inference.resources": RESOURCES}, "inference"),
    ("RLRun", {"suspend": True}, {"trainer.nodes": 2}, "trainer"),
    ("RLRun", {"suspend": True}, {"envWorkers.pod": {"labels": {"team": "a"}}}, "envWorkers"),
    ("RLRun", {"suspend": True}, {"config.max_steps": 7}, "config"),
    ("RLRun", {}, {"teacher": TEACHER}, "teacher"),
    ("RLRun", {"teacher": TEACHER}, {"teacher.replicas": 3}, "teacher"),
    ("RLRun", {"teacher": TEACHER}, {"teacher": None}, "teacher"),
    ("RLRun", {"suspend": True}, {"teacher": TEACHER}, None),
    ("RLRun", {"suspend": True, "teacher": TEACHER}, {"teacher.model.name": "other", "teacher.replicas": 3}, None),
    ("RLRun", {"suspend": True, "teacher": TEACHER}, {"suspend": False, "teacher": None}, None),
    ("RLRun", {}, {"judge": TEACHER}, "judge"),
    ("RLRun", {"judge": TEACHER}, {"judge.replicas": 3}, "judge"),
    ("RLRun", {"suspend": True, "judge": TEACHER}, {"judge.sampling": {"temperature": 0}, "judge.replicas": 3}, None),
    ("RLRun", {"suspend": True, "judge": TEACHER}, {"suspend": False, "judge": None}, None),
    ("SFTRun", {"suspend": True}, {"trainer.resources": RESOURCES}, None),
    ("SFTRun", {}, {"trainer.resources": RESOURCES}, "trainer"),
    ("SFTRun", {"suspend": True}, {"storage.pvc.mountPath": "/elsewhere"}, "storage"),
]


@pytest.mark.parametrize(("kind", "before", "update", "refused"), TRANSITIONS)
def test_transition_rules_and_the_operator_agree_on_what_a_run_may_change(kind, before, update, refused):
    """Admission (CEL transition rules) refuses what the operator would refuse as
    ChangeRequiresRecreate, naming the field; live fields change any time, components' sizes
    while the run is suspended."""
    old = example(f"{kind.lower()}.yaml")
    for path, value in before.items():
        old = with_spec_field(old, tuple(path.split(".")), copy.deepcopy(value))
    new = copy.deepcopy(old)
    for path, value in update.items():
        new = with_spec_field(new, tuple(path.split(".")), copy.deepcopy(value))
    errors = cel_errors(kind, new, old)
    _, refusal = applied(user_set(old["spec"], KINDS[kind]), new["spec"], reconcile.WORKLOADS[kind])
    if refused is None:
        assert errors == [] and refusal is None, (errors, refusal)
    else:
        assert [e for e in errors if e.startswith(f"spec.{refused} cannot change")] == errors != [], errors
        assert f"spec.{refused}" in refusal, refusal


@pytest.mark.parametrize("served", ["teacher", "judge"])
def test_the_served_models_runtime_configs_keep_no_defaults_in_the_stored_object(served):
    """Like `spec.config`, the teacher's and the judge's `model` and `server` are the runtime's:
    the API server stores what the user wrote (the runtime applies its defaults); its Kubernetes
    fields default."""
    spec = CRDS["rlkube.dev_rlruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    teacher = spec["properties"][served]["properties"]
    assert (teacher["replicas"]["default"], teacher["gpusPerReplica"]["default"]) == (1, 0)
    for section in ("model", "server"):
        assert not [name for name, node in teacher[section]["properties"].items() if "default" in node], section
    assert "(default: 8000)" in teacher["server"]["properties"]["port"]["description"]


def test_transition_rules_are_updates_only():
    """A create has no old object: the rules that read `oldSelf` do not run."""
    spec = CRDS["rlkube.dev_rlruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    transitions = [r for r in spec["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
    assert {r["fieldPath"] for r in transitions} >= {".image", ".config", ".trainer", ".inference", ".storage"}
    assert not {".suspend", ".restartPolicy", ".ttlSecondsAfterFinished"} & {r["fieldPath"] for r in transitions}
    assert cel_errors("RLRun", with_spec_field(example("rlrun.yaml"), ("image",), "other:2")) == []


def test_a_field_doc_changed_without_regenerating_leaves_the_reference_stale(tmp_path, monkeypatch):
    """docs/reference.md is one of the generated files: a field's new doc, not regenerated, fails
    `--check` (what `make lint` runs), and the page then carries the new doc."""
    from rlkube.config.shared import ModelConfig

    reference = tmp_path / "reference.md"
    monkeypatch.setattr(crd, "OUTPUT_DIRS", [tmp_path])
    monkeypatch.setattr(crd, "GUARDRAILS_FILE", tmp_path / "guardrails.yaml")
    monkeypatch.setattr(crd, "REFERENCE_FILE", reference)
    crd.main([])
    assert "| `model.name` | str |" in reference.read_text()
    monkeypatch.setattr(ModelConfig.model_fields["name"], "description", "A renamed doc of model.name.")
    assert crd.main(["--check"]) == 1
    crd.main([])
    assert "| `model.name` | str | `\"outputs/tiny-model\"` | A renamed doc of model.name. |" in reference.read_text()
