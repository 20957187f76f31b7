"""Shared pydantic base: Kubernetes-style camelCase fields, unknown fields rejected."""
from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A Kubernetes quantity ("500m", "16Gi", 8): the CRD says x-kubernetes-int-or-string.
Quantity = Union[int, str]

# A free-form Kubernetes object we pass through untouched (affinity, tolerations...):
# the CRD marks it x-kubernetes-preserve-unknown-fields; the rendered child is validated instead.
FreeForm = dict[str, Any]


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        use_attribute_docstrings=False,
    )

    def dump(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def field(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """Field with a mandatory description (it becomes the CRD's `kubectl explain` text)."""
    if not description:
        raise ValueError("every GRPOJob field needs a description")
    return Field(default, description=description, **kw)
