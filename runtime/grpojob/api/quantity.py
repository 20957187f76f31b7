"""Kubernetes resource quantities (`500m`, `1Gi`, `1024Mi`, `1e3`, `8`) as exact fractions, so that
`1024Mi == 1Gi` and `0.5 == 500m` compare equal, as the API server compares them.

Source: kubernetes/apimachinery pkg/api/resource/quantity.go (`ParseQuantity`, the grammar in its
doc comment, and `Quantity.Cmp`), and suffix.go (the binary and decimal SI suffixes).
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Optional

_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10 ** 3), "M": Fraction(10 ** 6), "G": Fraction(10 ** 9), "T": Fraction(10 ** 12),
            "P": Fraction(10 ** 15), "E": Fraction(10 ** 18)}
# <signedNumber><suffix>; the exponent of a decimalExponent is a signed integer (ParseQuantity).
_QUANTITY = re.compile(r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?$")


def parse(value: Any) -> Optional[Fraction]:
    """The exact value of a quantity (a string, or an integer as YAML gives one), or None when it
    is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        return None
    m = _QUANTITY.match(value)
    if not m:
        return None
    number = Fraction(m.group("num"))
    if m.group("exp") is not None:
        exp = int(m.group("exp"))
        if abs(exp) > 1000:  # far outside what a Quantity holds; the API server refuses it too
            return None
        return number * Fraction(10) ** exp
    suffix = m.group("suffix") or ""
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def text(value: Any) -> str:
    """A quantity as the user wrote it (an integer without quotes)."""
    return str(value)
