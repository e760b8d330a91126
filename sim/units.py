"""Quantities with explicit units.

In: strings such as ``"450 GB/s"``, ``"80 GiB"``, ``"2 us"``, ``"989 TFLOPS"``, ``"400 Gb/s"`` (bits), or plain
numbers already in SI units. Out: floats in SI units (bytes, seconds, bytes/s, FLOP/s), and the reverse
(``format_bytes(80 * 2**30) == "80 GiB"``) for writing resolved scenarios back out.

Conventions (ARCHITECTURE.md rule 1): GB is 1e9 bytes, GiB is 2**30 bytes; "b" (lower case) is bits.
The pydantic types at the bottom (``Bytes``, ``Seconds``, ``BytesPerSecond``, ``FlopsPerSecond``) are what
every spec field uses, so no unit string survives below the config boundary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, StringConstraints

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}

_QUANTITY = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµ/]*)\s*$")


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"cannot read {text!r} as {what} (write it like {example!r})")
    return float(match.group(1)), match.group(2)


def _prefixed(unit: str, base_units: tuple[str, ...]) -> float | None:
    """Scale of ``unit`` = <prefix><base> for a decimal or binary prefix, or None if it is not one."""
    for base in base_units:
        if not unit.endswith(base):
            continue
        prefix = unit[: len(unit) - len(base)]
        if prefix in _DECIMAL:
            return _DECIMAL[prefix]
        if prefix in _BINARY:
            return _BINARY[prefix]
    return None


def _parser(what: str, example: str, scale_of: Callable[[str], float | None]) -> Callable[[object], float]:
    def parse(value: object) -> float:
        if isinstance(value, bool):
            raise ValueError(f"expected {what} like {example!r}, got {value!r}")
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            number, unit = _split(value, what, example)
            if unit == "":
                raise ValueError(f"{value!r} has no unit: write {what} like {example!r}")
            scale = scale_of(unit)
            if scale is None:
                raise ValueError(f"unknown unit {unit!r} in {value!r}: write {what} like {example!r}")
            number *= scale
        else:
            raise ValueError(f"expected {what} like {example!r}, got {value!r}")
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{what} must be a finite, non-negative quantity, got {value!r}")
        return number

    return parse


def _bytes_scale(unit: str) -> float | None:
    if unit == "bytes":
        return 1.0
    return _prefixed(unit, ("B",))


def _bandwidth_scale(unit: str) -> float | None:
    byte_scale = _prefixed(unit, ("B/s", "Bps"))
    if byte_scale is not None:
        return byte_scale
    bit_scale = _prefixed(unit, ("b/s", "bps"))  # network line rates are quoted in bits
    return None if bit_scale is None else bit_scale / 8.0


def _time_scale(unit: str) -> float | None:
    return _TIME.get(unit)


def _flops_scale(unit: str) -> float | None:
    return _prefixed(unit, ("FLOPS", "FLOP/s", "flops", "flop/s"))


parse_bytes = _parser("a size", "80 GiB", _bytes_scale)
parse_bandwidth = _parser("a bandwidth", "450 GB/s", _bandwidth_scale)
parse_seconds = _parser("a duration", "2 us", _time_scale)
parse_flops = _parser("a FLOP rate", "989 TFLOPS", _flops_scale)


def _mantissa(value: float) -> str:
    return f"{value:.12g}"


def _format_decimal(value: float, unit: str, prefixes: tuple[str, ...]) -> str:
    if value == 0:
        return f"0 {unit}"
    for prefix in prefixes:
        scale = _DECIMAL[prefix]
        if value >= scale:
            return f"{_mantissa(value / scale)} {prefix}{unit}"
    return f"{_mantissa(value)} {unit}"


def format_bytes(value: float) -> str:
    """``80 GiB`` when the size is a whole number of binary units, else decimal (``141 GB``)."""
    for prefix in ("Ti", "Gi", "Mi", "Ki"):
        scale = _BINARY[prefix]
        if value >= scale and (value / scale) == int(value / scale):
            return f"{int(value / scale)} {prefix}B"
    return _format_decimal(value, "B", ("P", "T", "G", "M", "k"))


def format_bandwidth(value: float) -> str:
    return _format_decimal(value, "B/s", ("T", "G", "M", "k"))


def format_flops(value: float) -> str:
    return _format_decimal(value, "FLOPS", ("T", "G", "M"))


def format_seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{_mantissa(value / scale)} {unit}"
    return "0 s" if value == 0 else f"{_mantissa(value / 1e-9)} ns"


_COUNT = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(value: object) -> float:
    """A large count such as a token budget: a number, or a string with a decimal suffix as the field writes it
    ("15T" = 15e12 tokens, "300B" = 3e11; B is billions here, G its synonym; K, M, T)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a count like '15T', got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        number, suffix = _split(value, "a count", "15T")
        if suffix not in _COUNT:
            raise ValueError(f"unknown suffix {suffix!r} in {value!r}: write a count like '15T' (K, M, B, T)")
        number *= _COUNT[suffix]
    else:
        raise ValueError(f"expected a count like '15T', got {value!r}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"a count must be finite and non-negative, got {value!r}")
    return number


def format_count(value: float) -> str:
    for suffix in ("T", "B", "M", "K"):
        if value >= _COUNT[suffix]:
            return f"{_mantissa(value / _COUNT[suffix])}{suffix}"
    return _mantissa(value)


# What each parser accepts, as a JSON-Schema ``pattern`` (ECMA-262 and Python ``re`` alike) for the scenario's
# JSON Schema (sim.spec.json_schema): a number and one of the units the scale functions above know.
_NUMBER = r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*"
_PREFIX = "(?:[kKMGTPE]|[KMGTP]i)?"
UNIT_PATTERNS: dict[str, str] = {
    "bytes": _NUMBER + f"(?:bytes|{_PREFIX}B)\\s*$",
    "bandwidth": _NUMBER + f"{_PREFIX}(?:B/s|Bps|b/s|bps)\\s*$",
    "seconds": _NUMBER + "(?:s|ms|us|µs|ns|min|h)\\s*$",
    "flops": _NUMBER + f"{_PREFIX}(?:FLOPS|FLOP/s|flops|flop/s)\\s*$",
    "count": _NUMBER + "[kKMBGT]?\\s*$",
}


def _quantity(parse: Callable[[object], float], format_: Callable[[float], str], pattern: str) -> Any:
    """A float field read by ``parse`` (a number in SI units or a unit string), written back by ``format_``;
    its JSON Schema accepts a non-negative number or a string matching ``pattern``."""
    text = Annotated[str, StringConstraints(pattern=pattern)]
    number = Annotated[float, Field(ge=0)]
    return Annotated[float, BeforeValidator(parse, json_schema_input_type=number | text),
                     PlainSerializer(format_, return_type=str)]


Bytes = _quantity(parse_bytes, format_bytes, UNIT_PATTERNS["bytes"])
Seconds = _quantity(parse_seconds, format_seconds, UNIT_PATTERNS["seconds"])
BytesPerSecond = _quantity(parse_bandwidth, format_bandwidth, UNIT_PATTERNS["bandwidth"])
FlopsPerSecond = _quantity(parse_flops, format_flops, UNIT_PATTERNS["flops"])
Count = _quantity(parse_count, format_count, UNIT_PATTERNS["count"])

GB = 1e9
GiB = 2.0**30
