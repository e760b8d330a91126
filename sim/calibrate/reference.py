"""The published measurements shipped in ``sim/data/reference/``, in the simulator's names and SI units.

In: the CSVs copied from the project's reference set (each row names its source): OpenXLA's collective and GEMM
tables, and nccl-tests results. Out: pandas DataFrames with one row per measurement and fixed columns:
``xla_collectives`` (platform, op, n, bytes, seconds; the ring collectives, or all-to-all), ``nccl_tests`` (H100
rows with a time: setting, op, n, nodes, bytes, seconds), ``xla_gemms`` (platform, dtype, b, m, n, k, flops,
flops_per_s, seconds), ``gpu_attention`` (our own causal attention sweep, ``sim calibrate``'s attention.csv columns
plus device, date, source and run: ``sweep`` fits the shipped curves, ``check`` is a second GPU's cross-check).
The fitting scripts and the analysis reports read these, never the CSVs' own column names.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pandas as pd

FOLDER = Path(str(resources.files("sim").joinpath("data/reference")))
COLLECTIVE_OPS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter"}
# XLA runs all-to-all as NCCL grouped send/recv to every peer; its tensor size is the per-rank buffer, as in
# nccl-tests (busbw = algbw x (n-1)/n).
ALL_TO_ALL_OPS = {"all-to-all": "all_to_all"}
# XLA's f32 dots ran on the tensor cores as TF32 (its default precision): up to 403 TFLOP/s on H100 and 870 on
# B200, 6-11x their fp32 (CUDA-core) peaks of 67 and 80 and 82% / 79% of their TF32 peaks, so they are tf32 here.
# "fp32" means what PyTorch does by default (allow_tf32 off), which no table row measured.
GEMM_DTYPES = {"bf16xbf16->bf16": "bf16", "f16xf16->f16": "fp16", "f32xf32->f32": "tf32",
               "f8e4m3fnxf8e4m3fn->bf16": "fp8"}


def xla_collectives(opcodes: dict[str, str] = COLLECTIVE_OPS) -> pd.DataFrame:
    """OpenXLA's collective rows of the given opcodes (XLA name -> ours): by default the ring collectives;
    ``ALL_TO_ALL_OPS`` for the all-to-all rows."""
    table = pd.read_csv(FOLDER / "xla_collective_perf_tables.csv")
    table = table[table["opcode"].isin(list(opcodes))]
    return pd.DataFrame({"platform": table["platform"], "op": table["opcode"].map(opcodes),
                         "n": table["group_size"].astype(int), "bytes": table["tensor_size_bytes"].astype(float),
                         "seconds": table["median_time_us"] * 1e-6}).reset_index(drop=True)


def nccl_tests() -> pd.DataFrame:
    """The H100 all-reduce rows that give a time (the others are maintainers' guidance, in prose)."""
    table = pd.read_csv(FOLDER / "nccl_tests_measurements.csv")
    table = table[table["gpu"].eq("H100 80GB HBM3") & table["time_us"].notna()]
    return pd.DataFrame({"setting": table["nccl_algo_or_setting"].astype(str), "op": "all_reduce",
                         "n": table["num_gpus"].astype(int), "nodes": table["num_nodes"].astype(int),
                         "bytes": table["message_size_bytes"].astype(float),
                         "seconds": table["time_us"].astype(float) * 1e-6}).reset_index(drop=True)


def xla_gemms() -> pd.DataFrame:
    table = pd.read_csv(FOLDER / "xla_matmul_perf_tables.csv")
    label = table["dtype(lhs x rhs -> out)"]
    table = table[label.isin(list(GEMM_DTYPES))]
    return pd.DataFrame({"platform": table["platform"], "dtype": table["dtype(lhs x rhs -> out)"].map(GEMM_DTYPES),
                         "b": table["batch_b"], "m": table["m"], "n": table["n"], "k": table["k"],
                         "flops": table["flop_count(2*b*m*n*k)"].astype(float),
                         "flops_per_s": table["achieved_flops_per_s"].astype(float),
                         "seconds": table["implied_time_us"] * 1e-6}).reset_index(drop=True)


def gpu_attention(run: str | None = None) -> pd.DataFrame:
    """The attention kernels this project measured (``sim calibrate`` on an H200, 2026-11-26: run ``sweep``; and
    scripts/measure_gpu_kernels.py on an H100 the same day: run ``check``), optionally one run's rows."""
    table = pd.read_csv(FOLDER / "gpu_attention_measurements.csv")
    return (table if run is None else table[table["run"] == run]).reset_index(drop=True)
