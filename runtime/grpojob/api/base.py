"""Shared pydantic base: Kubernetes-style camelCase fields, unknown fields rejected."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# Keyword arguments for user plug-ins (dataset factories, rewards): the CRD keeps their unknown
# fields. Kubernetes sub-objects are typed instead (grpojob.api.k8s).
FreeForm = dict[str, Any]

FIELD_ERROR = "field_error"  # a model validator's error about one of its fields (validate.errors_of)
# validate.check validates a manifest with errors a second time with this key in the validation
# context: the rules local to one value (Kubernetes pod rules, names, a sub-model's own consistency)
# stand aside, which they can since they change no value, so that the spec's cross-field rules run
# beside them and one run lists every error.
DEFER_LOCAL_RULES = "grpojob.defer_local_rules"


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        # No coercion ("4" is not 4): the API server refuses what the CRD's types refuse, and so do we.
        strict=True,
        validate_default=True,
        use_attribute_docstrings=False,
    )

    def dump(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def deferring(info: Any) -> bool:
    """Whether a validator's local rule stands aside in this validation (DEFER_LOCAL_RULES)."""
    context = getattr(info, "context", None)
    return bool(context and context.get(DEFER_LOCAL_RULES))


def field(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """Field with a mandatory description (it becomes the CRD's `kubectl explain` text)."""
    if not description:
        raise ValueError("every GRPOJob field needs a description")
    return Field(default, description=description, **kw)


def invalid(subpath: str, message: str) -> PydanticCustomError:
    """The error a model validator raises about one of its own fields, `subpath` relative to the
    model (`volumes[0].name`): reported at that field's full path."""
    return PydanticCustomError(FIELD_ERROR, "{subpath}: {message}", {"subpath": subpath, "message": message})


FIELD_ERRORS = "field_errors"  # a validator's several errors, each about one field (validate.errors_of)


def invalid_all(problems: list[tuple[str, str]]) -> PydanticCustomError:
    """The error a validator raises to report every problem it found at once: (subpath relative to
    the model or value, message) pairs, each reported at its field's full path."""
    summary = "; ".join(f"{p}: {m}" if p else m for p, m in problems)
    return PydanticCustomError(FIELD_ERRORS, "{summary}", {"summary": summary, "errors": list(problems)})
