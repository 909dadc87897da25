"""resource.Quantity: the strings Kubernetes uses for CPU and memory ("7500m", "16Gi")."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(text: str | int | float) -> Decimal:
    """The exact value of a quantity; ValueError for anything Kubernetes would refuse."""
    if isinstance(text, int | float):
        return Decimal(str(text))
    m = _QUANTITY.match(text.strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, exponent, suffix = m.groups()
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None
    if exponent:
        return value * Decimal(10) ** int(exponent[1:])
    return value * _SUFFIX[suffix or ""]
