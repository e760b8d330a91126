"""The base of every validated spec (hardware, model, scenario, profile).

In: the fields of a spec, as parsed from YAML or JSON. Out: a frozen pydantic model, or a validation error naming
the field: unknown keys, and NaN or infinite floats, are refused at the boundary.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FrozenSpec(BaseModel):
    """Base of every validated spec: immutable, unknown keys rejected (ARCHITECTURE.md rule 1), and every float
    finite: a NaN or infinite number is refused at the boundary, naming its field, instead of surfacing as a
    NaN step time or an MFU above 1 (NaN slips through checks such as ``factor <= 0``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
