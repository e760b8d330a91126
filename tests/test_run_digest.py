"""Bit-for-bit pins of whole runs: the SHA-256 of ``summary.json`` and of the trace's contents for bundled scenarios
that between them take every branch of the summary and the trace writer (slice and ``ranks: all``, 1F1B and
interleaved pipelines, ZeRO-3/FSDP's memory timeline, LoRA and QLoRA, MoE, the contention network).

A speed-up must leave them as they were: issue 25's work on ``sim run`` (the trace frame, the summary's per-rank
loop, the Parquet writer) was checked against them. A change that means to move a number regenerates them with
``CLUSTERSIM_REGEN_GOLDEN=1 python -m pytest tests/test_run_digest.py`` and says why in its commit (as
``tests/test_golden.py``'s trace). Each case also writes the trace through ``write_trace`` and reads it back equal.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from sim import runner
from sim.output import trace
from sim.spec.scenario import load_scenario

from conftest import DATA, SCENARIOS

DIGESTS = DATA / "golden" / "run_digests.json"

CASES: dict[str, tuple[str, list[str]]] = {
    "tiny": ("tiny.yaml", []),
    "pipeline-4x8": ("pipeline-4x8.yaml", []),
    "pipeline-4x8 ranks all": ("pipeline-4x8.yaml", ["ranks=all"]),
    "llama2-7b_h100-8_dp": ("llama2-7b_h100-8_dp.yaml", []),
    "llama2-7b_h100-16_fsdp": ("llama2-7b_h100-16_fsdp.yaml", []),
    "llama2-7b_h100-32_spine": ("llama2-7b_h100-32_spine.yaml", []),
    "llama3-8b_h100-1_lora": ("llama3-8b_h100-1_lora.yaml", []),
    "llama3-70b_h100-1_qlora": ("llama3-70b_h100-1_qlora.yaml", []),
    "mixtral-8x7b_h100-64": ("mixtral-8x7b_h100-64.yaml", []),
}


def trace_digest(frame: pd.DataFrame) -> str:
    """SHA-256 over every column's name, dtype and values: numbers as their bytes, strings joined by a unit
    separator, with the Python types the object columns hold (a ``Kind`` member where a ``str`` belongs shows)."""
    digest = hashlib.sha256()
    for name in frame.columns:
        column = frame[name]
        digest.update(f"{name}:{column.dtype};".encode())
        if column.dtype == object:
            digest.update("\x1f".join(map(str, column)).encode())
            digest.update(repr(sorted({type(value).__name__ for value in column})).encode())
        else:
            digest.update(column.to_numpy().tobytes())
    return digest.hexdigest()


def _run(case: str) -> tuple[str, str, pd.DataFrame]:
    path, overrides = CASES[case]
    result = runner.run(load_scenario(SCENARIOS / path, overrides))
    summary = hashlib.sha256(result.summary.to_json().encode()).hexdigest()
    return summary, trace_digest(result.trace), result.trace


@pytest.mark.parametrize("case", list(CASES))
def test_run_matches_its_digest(case: str, tmp_path: Path) -> None:
    summary, frame_digest, frame = _run(case)
    if os.environ.get("CLUSTERSIM_REGEN_GOLDEN"):
        pinned = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
        pinned[case] = {"summary_sha256": summary, "trace_sha256": frame_digest, "tasks": len(frame)}
        DIGESTS.write_text(json.dumps(dict(sorted(pinned.items())), indent=1) + "\n")
    expected = json.loads(DIGESTS.read_text())[case]
    assert len(frame) == expected["tasks"]
    assert frame_digest == expected["trace_sha256"], f"{case}: the trace changed"
    assert summary == expected["summary_sha256"], f"{case}: summary.json changed"
    path = tmp_path / "trace.parquet"
    trace.write_trace(frame, path)
    assert_frame_equal(trace.read_trace(path), frame, check_exact=True)


def test_trace_digest_sees_a_changed_value() -> None:
    """The digest is not blind: one float moved by one ulp, or a string column's type, changes it."""
    frame = runner.run(load_scenario(SCENARIOS / "tiny.yaml")).trace
    base = trace_digest(frame)
    raw = frame["end_s"].to_numpy().copy()
    raw.view("int64")[3] += 1  # the next float up
    nudged = frame.assign(end_s=raw)
    assert trace_digest(nudged) != base
    renamed = frame.copy()
    renamed.loc[0, "name"] = renamed.loc[0, "name"] + " "
    assert trace_digest(renamed) != base
