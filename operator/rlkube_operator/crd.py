"""Generate the RLRun, SFTRun and RLPool CustomResourceDefinitions from the pydantic models.

    python -m rlkube_operator.crd            # write crds/*.yaml and the charts' copies
    python -m rlkube_operator.crd --check    # exit 1 if the committed files are stale

Pydantic writes JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0 schema. The
translation: `$ref`s inlined, `X | None` becomes `nullable`, `int | str` becomes
`x-kubernetes-int-or-string` (keeping the string's pattern), free-form dicts keep unknown
fields, numeric exclusive bounds become booleans, tuples become bounded arrays. CEL rules inside
`spec.config` (a spec model's `CONFIG_RULES`) are placed on their nodes. Defaults are kept for
the Kubernetes-facing fields only: inside `spec.config` (and the teacher's and judge's `model`, `server`)
the runtime applies its own defaults (shown in the descriptions), so the stored object says
only what the user wrote, exactly as in a TOML file. Transition rules (`oldSelf`) keep a run's
spec as created, but for the fields that apply live (`inference.replicas`, the scale
subresource's, among them) and, while the run is suspended, its components' sizes and its
teacher and judge (`reconcile.LIVE_FIELDS`, `reconcile.ELASTIC_FIELDS`, `reconcile.SUSPENDED_FIELDS`,
`reconcile.SUSPENDED_BLOCKS`: the operator refuses the same changes).
"""

import argparse
import copy
import json
import sys
from pathlib import Path

import yaml

from rlkube_operator import GROUP, VERSION, guardrails, reference, threatmodel
from rlkube_operator.credentials import URL_CREDENTIALS_RE
from rlkube_operator.names import NAME_MAX_LENGTH, NAME_PATTERN
from rlkube_operator.poolspec import PoolStatus, RLPoolSpec
from rlkube_operator.reconcile import (
    ELASTIC_FIELDS,
    LIVE_FIELDS,
    POOL_LIVE_FIELDS,
    SUSPENDED_BLOCKS,
    SUSPENDED_FIELDS,
)
from rlkube_operator.spec import KINDS
from rlkube_operator.status import RunStatus

REPO = Path(__file__).resolve().parents[2]
# kubectl apply -f crds/; the operator chart (crds.install); the CRD-only chart (once per cluster).
OUTPUT_DIRS = [REPO / "crds"] + [REPO / "helm" / chart / "files" / "crds" for chart in ("rlkube", "rlkube-crds")]
GUARDRAILS_FILE = REPO / "helm" / "rlkube" / "files" / "guardrails.yaml"
REFERENCE_FILE = REPO / "docs" / "reference.md"

CRD_KINDS = KINDS | {"RLPool": RLPoolSpec}
STATUS = {"RLRun": RunStatus, "SFTRun": RunStatus, "RLPool": PoolStatus}
SHORT_NAMES = {"RLRun": ["rlr"], "SFTRun": ["sftr"], "RLPool": ["rlp"]}
RUNS = ("RLRun", "SFTRun")
NAME_RULES = [
    {
        "rule": f"size(self.metadata.name) <= {NAME_MAX_LENGTH}",
        "message": f"metadata.name must be at most {NAME_MAX_LENGTH} characters: the run's children and"
        " their pods are named after it (`<name>-sft-trainer-master`, `<name>-inference-0`), and each"
        " of those names must stay a DNS label of at most 63",
    },
    {
        "rule": f"self.metadata.name.matches('{NAME_PATTERN}')",
        "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting"
        " with a letter and ending with a letter or digit): the run's Services are named after it",
    },
]
PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "boolean", "jsonPath": ".status.ready", "kinds": ("RLPool",)},
    {"name": "Members", "type": "integer", "jsonPath": ".status.memberCount", "kinds": ("RLPool",)},
    {"name": "MaxRuns", "type": "integer", "jsonPath": ".spec.maxRuns", "kinds": ("RLPool",)},
    {"name": "Waiting", "type": "integer", "jsonPath": ".status.waiting", "kinds": ("RLPool",), "priority": 1},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step", "kinds": RUNS},
    {"name": "Max", "type": "integer", "jsonPath": ".status.maxSteps", "priority": 1, "kinds": RUNS},
    {"name": "Reward", "type": "number", "jsonPath": ".status.reward", "kinds": RUNS},
    {"name": "Eval", "type": "number", "jsonPath": ".status.evalReward", "kinds": ("RLRun",)},
    {"name": "Inference", "type": "string", "jsonPath": ".status.inference.ready", "kinds": ("RLRun", "RLPool")},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
SCALE = {
    "RLRun": {
        "specReplicasPath": ".spec.inference.replicas",
        "statusReplicasPath": ".status.inference.replicas",
        "labelSelectorPath": ".status.inference.selector",
    },
}
"""`kubectl scale rlrun/NAME --replicas N` (and an HPA, KEDA) sizes the run's inference."""
_DROPPED_KEYS = {"title", "$defs"}
RUNTIME_CONFIGS = {"spec.config", "spec.teacher.model", "spec.teacher.server", "spec.judge.model", "spec.judge.server"}
"""The runtime's own config models embedded in a spec: the runtime applies their defaults."""


class SchemaError(ValueError):
    """A pydantic schema construct with no structural OpenAPI equivalent."""


def _resolve(node: dict, defs: dict) -> dict:
    if "$ref" not in node:
        return node
    target = defs[node["$ref"].rsplit("/", 1)[-1]]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def _collapse_any_of(node: dict, defs: dict, where: str) -> dict:
    options = [_resolve(o, defs) for o in node.pop("anyOf")]
    nullable = any(o.get("type") == "null" for o in options)
    options = [o for o in options if o.get("type") != "null"]
    if nullable:
        node["nullable"] = True
    if len(options) == 1:
        return {**options[0], **node}
    if {o.get("type") for o in options} == {"integer", "string"}:
        node["x-kubernetes-int-or-string"] = True
        for pattern in (o["pattern"] for o in options if "pattern" in o):
            node["pattern"] = pattern  # applies to the string form only (a Quantity's)
        return node
    raise SchemaError(f"{where}: union of {[o.get('type') for o in options]} is not structural")


def _unwrap(text: str) -> str:
    """A field docstring's source line breaks removed (kubectl explain wraps by itself);
    its paragraphs kept."""
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in text.split("\n\n"))


def structural(node: dict, defs: dict, *, keep_defaults: bool, where: str = "spec") -> dict:
    """One pydantic JSON-schema node as a structural OpenAPI v3.0 node (pure)."""
    node = copy.deepcopy(_resolve(node, defs))
    if "anyOf" in node:
        node = _collapse_any_of(node, defs, where)
    for key in _DROPPED_KEYS:
        node.pop(key, None)
    if node.get("format") == "path":
        del node["format"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node[bound], bool):
            node[inclusive], node[bound] = node[bound], True
    if "prefixItems" in node:
        items = node.pop("prefixItems")
        node.update(items=items[0], minItems=len(items), maxItems=len(items))
    if "description" in node:
        node["description"] = _unwrap(node["description"])
    if "default" in node:
        default = node.pop("default")
        if not keep_defaults:
            # An object's fields say their own defaults; only a leaf (or a list) says its own.
            if default is not None and "description" in node and "properties" not in node:
                node["description"] += f" (default: {json.dumps(default)})"
        elif default is not None:
            node["default"] = {} if isinstance(default, dict) and "properties" in node else default
    extra = node.get("additionalProperties")
    if extra is False:
        del node["additionalProperties"]
    elif extra is True or (node.get("type") == "object" and "properties" not in node and extra is None):
        node.pop("additionalProperties", None)
        node["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, dict):
        node["additionalProperties"] = structural(extra, defs, keep_defaults=keep_defaults, where=f"{where}.*")
    if "items" in node:
        node["items"] = structural(node["items"], defs, keep_defaults=keep_defaults, where=f"{where}[]")
    for name, prop in node.get("properties", {}).items():
        in_config = not keep_defaults or f"{where}.{name}" in RUNTIME_CONFIGS
        node["properties"][name] = structural(
            prop, defs, keep_defaults=not in_config, where=f"{where}.{name}"
        )
    if "type" not in node and not node.get("x-kubernetes-int-or-string"):
        node["x-kubernetes-preserve-unknown-fields"] = True
    return node


def _model_schema(model, *, keep_defaults: bool, where: str) -> dict:
    schema = model.model_json_schema(by_alias=True)
    return structural(schema, schema.get("$defs", {}), keep_defaults=keep_defaults, where=where)


def _unchanged(path: str) -> str:
    """CEL: `spec.<path>` is as it was, set or left out alike."""
    return f"has(self.{path}) == has(oldSelf.{path}) && (!has(self.{path}) || self.{path} == oldSelf.{path})"


def immutability_rules(spec_schema: dict) -> list[dict]:
    """Transition rules on `spec` (they reference `oldSelf`, so the API server runs them on
    updates only): every field but the live ones stays as created, except the resumable ones of
    a run that was suspended before the update (they apply when it resumes)."""
    rules = []
    for name, node in spec_schema["properties"].items():
        if name in LIVE_FIELDS + POOL_LIVE_FIELDS:
            continue
        rule, message = _unchanged(name), f"spec.{name} cannot change once the run is created"
        if name in SUSPENDED_BLOCKS:
            rule = f"(has(oldSelf.suspend) && oldSelf.suspend) || ({rule})"
            message += " unless the run is suspended"
        elastic = ELASTIC_FIELDS.get(name, ())
        if elastic:
            rule = " && ".join(_unchanged(f"{name}.{sub}") for sub in node["properties"] if sub not in elastic)
            message += f", but for {', '.join(elastic)}"
        if resumable := SUSPENDED_FIELDS.get(name):
            kept = " && ".join(_unchanged(f"{name}.{sub}") for sub in node["properties"] if sub not in resumable)
            rule = f"(has(oldSelf.suspend) && oldSelf.suspend) ? ({kept or 'true'}) : ({rule})"
            message += f"{' and' if elastic else ', but for'} {', '.join(f for f in resumable if f not in elastic)} while the run is suspended"
        message += ": delete and recreate the run to change it (a PVC claimName keeps the checkpoints)"
        rules.append({"rule": rule, "message": message, "fieldPath": f".{name}"})
    return rules


URL_MAX_LENGTH, URLS_MAX_ITEMS = 4096, 64


def _is_url(name: str, node: dict, many: bool) -> bool:
    ending = ("urls", "Urls") if many else ("url", "Url")
    return name.endswith(ending) and (node.get("items", {}) if many else node).get("type") == "string"


def refuse_url_credentials(node: dict, where: str = "spec") -> None:
    """Every URL field under `node` (`url`, `*_url`, `*Url`; lists `*_urls`), `config.*` included,
    refuses credentials at admission (`credentials.URL_CREDENTIALS_RE`, the operator's own check),
    so none is stored where `view` reads it; each is bounded, which bounds the rule's cost."""
    message = (" must not hold credentials (user info before '@', or a key, secret, token, password or signature "
               "query parameter): put them in a Secret (storage.objectStore.secretName)")
    rule = f"!self.matches('{URL_CREDENTIALS_RE}')"
    for name, prop in node.get("properties", {}).items():
        string = prop.get("items") if _is_url(name, prop, True) else prop if _is_url(name, prop, False) else None
        covered = any(f"self.{name}.matches" in r["rule"] for r in node.get("x-kubernetes-validations", []))
        if string is not None and not covered:
            string.setdefault("maxLength", URL_MAX_LENGTH)
            shown = f"{where}.{name}" + ("[]" if string is not prop else "")
            string["x-kubernetes-validations"] = [*string.get("x-kubernetes-validations", []),
                                                  {"rule": rule, "message": shown + message}]
            if string is not prop:
                prop.setdefault("maxItems", URLS_MAX_ITEMS)
        refuse_url_credentials(prop.get("items", prop), f"{where}.{name}" + ("[]" if "items" in prop else ""))


def build_crd(kind: str) -> dict:
    """The CustomResourceDefinition of `kind` (`RLRun`, `SFTRun` or `RLPool`)."""
    plural = kind.lower() + "s"
    spec_schema = _model_schema(CRD_KINDS[kind], keep_defaults=True, where="spec")
    for path, rules in getattr(CRD_KINDS[kind], "CONFIG_RULES", {}).items():
        node = spec_schema["properties"]["config"]
        for key in path:
            node = node["properties"][key]
        node["x-kubernetes-validations"] = rules
    refuse_url_credentials(spec_schema)
    spec_schema["x-kubernetes-validations"] = spec_schema.get("x-kubernetes-validations", []) + immutability_rules(
        spec_schema)
    status_schema = _model_schema(STATUS[kind], keep_defaults=False, where="status")
    conditions = status_schema["properties"]["conditions"]
    conditions.update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            # Helm leaves the CRD (and so every user's runs) in place on `helm uninstall`.
            "annotations": {"helm.sh/resource-policy": "keep"},
            "labels": {"app.kubernetes.io/name": "rlkube", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": SHORT_NAMES[kind],
                "categories": ["rlkube"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}} | ({"scale": SCALE[kind]} if kind in SCALE else {}),
                    "additionalPrinterColumns": [
                        {k: v for k, v in column.items() if k != "kinds"}
                        for column in PRINTER_COLUMNS if kind in column.get("kinds", (kind,))
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": spec_schema.get("description", kind),
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                            "x-kubernetes-validations": NAME_RULES,
                        }
                    },
                }
            ],
        },
    }


def render_all() -> dict[str, str]:
    """File name → YAML text of every CRD."""
    header = "# Generated by `python -m rlkube_operator.crd` from operator/rlkube_operator/spec.py. Do not edit.\n"
    return {
        f"{GROUP}_{kind.lower()}s.yaml": header + yaml.safe_dump(build_crd(kind), sort_keys=False, width=100)
        for kind in CRD_KINDS
    }


def outputs() -> dict[Path, str]:
    """Path → text of every generated file: the CRDs, in each place that holds them, the
    chart's guardrail rules (`guardrails.chart_file`), docs/reference.md and the threat model in
    docs/security.md (`threatmodel`)."""
    files = {directory / name: text for directory in OUTPUT_DIRS for name, text in render_all().items()}
    header = ("# Generated by `python -m rlkube_operator.crd` from operator/rlkube_operator/guardrails.py. "
              "Do not edit.\n")
    files[GUARDRAILS_FILE] = header + yaml.safe_dump(guardrails.chart_file(), sort_keys=False, width=100)
    files[REFERENCE_FILE] = reference.render({kind: build_crd(kind) for kind in CRD_KINDS})
    files[threatmodel.PAGE] = threatmodel.page(threatmodel.PAGE.read_text())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed files are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale generated files (run `python -m rlkube_operator.crd`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
