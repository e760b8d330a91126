"""What fp16 and bf16 do to training numbers: dot-product error, the formats' edges, loss scaling.

In: nothing but torch (CPU is enough: these are properties of the formats). Out: rows (check, dtype, value,
note) that ``sim calibrate`` prints and writes to ``numerics.csv``:
- the relative error of a 4096-deep dot product of N(0,1) vectors computed in the format (inputs rounded to
  it), against the same dot product in float64;
- what the formats keep at their edges: fp16's largest finite value (65504) and overflow beyond it, its
  smallest subnormal (~6e-8) and the underflow below it; bf16 keeps fp32's range (Micikevicius et al. 2018;
  Kalamkar et al. 2019);
- a gradient of 1e-8 cast to fp16 vanishes; multiplied by a loss scale of 2^16 first, it survives and
  unscales back to 1e-8 in fp32 (mixed-precision training's loss scaling).
"""

from __future__ import annotations

from typing import Any

LOSS_SCALE = 2.0 ** 16


def dot_relative_error(dtype: str, depth: int = 4096, seed: int = 0) -> float:
    import torch

    kind = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(depth, generator=generator, dtype=torch.float64)
    y = torch.randn(depth, generator=generator, dtype=torch.float64)
    exact = float(torch.dot(x, y))
    got = float(torch.dot(x.to(kind), y.to(kind)).to(torch.float64))
    return abs(got - exact) / abs(exact)


def _cast(value: float, dtype: str) -> float:
    import torch

    low = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[dtype])
    return float(torch.tensor(value, dtype=torch.float32).to(low))


def numerics_report(depth: int = 4096) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for dtype in ("fp16", "bf16"):
        rows.append({"check": f"dot product relative error ({depth}-deep, vs float64)", "dtype": dtype,
                     "value": dot_relative_error(dtype, depth), "note": "fp32: "
                     f"{dot_relative_error('fp32', depth):.1e}"})
    edges = [("largest finite", 65504.0), ("overflow", 70000.0), ("smallest subnormal", 6e-8), ("underflow", 2e-8)]
    for dtype in ("fp16", "bf16"):
        for label, value in edges:
            rows.append({"check": f"{label}: {value:g} ->", "dtype": dtype, "value": _cast(value, dtype), "note": ""})
    gradient = 1e-8
    for dtype in ("fp16", "bf16"):
        plain = _cast(gradient, dtype)
        scaled = _cast(gradient * LOSS_SCALE, dtype) / LOSS_SCALE
        rows.append({"check": "gradient 1e-8 without loss scaling", "dtype": dtype, "value": plain,
                     "note": "vanishes" if plain == 0 else "survives"})
        rows.append({"check": "gradient 1e-8 with loss scale 2^16, unscaled in fp32", "dtype": dtype, "value": scaled,
                     "note": f"relative error {abs(scaled - gradient) / gradient:.1e}"})
    return rows
