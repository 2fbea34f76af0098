"""The base class every rlkube config model derives from.

Config classes are the single source of truth: the CLI's `--help`, the docs reference and the
CRD schemas are generated from them, so every field carries a docstring.
"""

from pydantic import BaseModel, ConfigDict


class Config(BaseModel):
    """Strict: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=True,
        populate_by_name=True,
    )
