"""The base of every Kubernetes-facing section of the CRDs: camelCase fields and CEL rules.

Where pydantic cannot say it in JSON schema, `x-kubernetes-validations` (CEL) rules in
`json_schema_extra` make the API server refuse the object with a field-level message.
"""

from pydantic import ConfigDict
from pydantic.alias_generators import to_camel
from rlkube.config import Config


class K8sModel(Config):
    """camelCase field names, as Kubernetes users expect; snake_case still accepted in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


def cel(*rules: tuple[str, str]) -> dict:
    """`json_schema_extra` holding CEL rules, each a (rule, message) pair."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}
