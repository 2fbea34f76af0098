"""The base class every rlkube config model derives from.

Config classes are the single source of truth: the CLI's `--help`, the docs reference and the
CRD schemas are generated from them, so every field carries a docstring.
"""

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from rlkube.config.renames import rename_keys, renamed_properties


def _schema_with_renamed_keys(schema: dict, model: type["Config"]) -> None:
    renamed_properties(schema, model.RENAMED)


class Config(BaseModel):
    """Strict: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=True,
        populate_by_name=True,
        json_schema_extra=_schema_with_renamed_keys,
    )

    RENAMED: ClassVar[dict[str, str]] = {}
    """Key paths read as rlkube's (`rlkube.config.renames`): prime-rl's names, with a warning."""

    SECTION: ClassVar[str] = ""
    """Where the model's table usually sits (`orchestrator.eval`), for the renaming warnings."""

    UNSUPPORTED: ClassVar[dict[str, str]] = {}
    """Keys of prime-rl's that rlkube has no equivalent for, and why: an unknown field whose
    error says so (`rlkube.config.cli.format_validation_error`)."""

    @model_validator(mode="before")
    @classmethod
    def _read_other_names(cls, data: Any) -> Any:
        return rename_keys(data, cls.RENAMED, cls.SECTION)
