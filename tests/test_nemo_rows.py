"""The NeMo 24.07 H100 FP8 validation rows match NVIDIA's table (tests/data/nemo_2407_h100_fp8_pretraining.csv,
copied from the NeMo Framework 24.07 performance page): every layout field, and iteration time =
GBS * seq / (tokens/s/GPU * GPUs). The Llama 3 rows run context parallelism (CP 2, parallel.cp)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.api import load_scenario

ROOT = Path(__file__).resolve().parents[1]
TABLE = pd.read_csv(ROOT / "tests/data/nemo_2407_h100_fp8_pretraining.csv")
PUBLISHED = pd.read_csv(ROOT / "scenarios/validation/published.csv")
ROWS = PUBLISHED[PUBLISHED.group == "NeMo 24.07 (H100 FP8)"]


def test_every_row_is_there() -> None:
    assert len(ROWS) == len(TABLE) == 12
    assert set(TABLE[TABLE.context_parallel > 1].model) == {"LLAMA3-8B", "LLAMA3-70B"}


@pytest.mark.parametrize("scenario", list(ROWS.scenario))
def test_row_matches_the_table(scenario: str) -> None:
    spec = load_scenario(ROOT / "scenarios/validation" / scenario)
    gpus = spec.cluster.nodes * spec.cluster.gpus_per_node
    row = TABLE[(TABLE.model == spec.model.name) & (TABLE.num_gpus == gpus)]
    assert len(row) == 1
    r = row.iloc[0]
    p, t = spec.parallel, spec.training
    assert (p.tp, p.pp, p.vpp, p.cp, p.dp, t.micro_batch, t.global_batch, t.seq_len) == (
        r.tensor_parallel, r.pipeline_parallel, r.virtual_pipeline, r.context_parallel, r.data_parallel,
        r.micro_batch_size, r.global_batch_size, r.seq_len)
    assert t.dtype == "fp8" and spec.cluster.gpu.name == "H100-SXM"
    published = ROWS[ROWS.scenario == scenario].iloc[0]
    expected = r.global_batch_size * r.seq_len / (r.tokens_per_s_per_gpu * gpus)
    assert published.iteration_time_s == pytest.approx(expected, rel=1e-5)
    assert published.tokens_per_s_per_gpu == r.tokens_per_s_per_gpu
    # NeMo recipe facts every row shares: sequence parallel with tp > 1, the distributed optimizer, flash attention
    assert p.sequence_parallel == (p.tp > 1) and p.zero == 1 and t.flash_attention
