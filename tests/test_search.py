"""Layout search (sim.search) and the Dask executor of sweeps."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim import search, sweep
from sim.config import load_scenario
from sim.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "scenarios" / "tiny.yaml"
DDP8 = ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml"


def test_every_kept_layout_is_one_sim_run_accepts_and_every_rejected_one_says_why() -> None:
    base = load_scenario(DDP8, ["model.num_layers=8", "training.global_batch=8"])
    table = search.screen(base, list(search.layouts(base)))
    assert len(table) == len(set(map(tuple, table[list(search.LAYOUT_FIELDS)].to_numpy().tolist())))
    kept = table[table["status"].isin(["ok", "oom"])]
    assert len(kept) > 50
    for _, row in kept.sample(25, random_state=0).iterrows():
        point = search.to_points(row.to_frame().T)[0]
        overrides = [f"{key}={sweep._encode(value)}" for key, value in point.items()]
        scenario = load_scenario(DDP8, ["model.num_layers=8", "training.global_batch=8", *overrides])
        assert scenario.parallel.tp * scenario.parallel.pp * scenario.dp == 8
    rejected = table[table["status"].str.startswith("invalid")]
    assert rejected["status"].str.contains("parallel|schedule|training").all()
    assert (kept["bound_step_time_s"] <= kept["est_step_time_s"] * (1 + 1e-12)).all()
    assert (table[table["status"] == "oom"]["est_peak_memory_bytes"] > base.cluster.gpu.hbm_capacity).all()


def test_search_simulates_the_best_and_prunes_by_the_bound(tmp_path: Path) -> None:
    found = search.run_search(DDP8, ["model.num_layers=8", "training.global_batch=8"], tmp_path, top=40)
    simulated = found.simulated
    assert 0 < len(simulated) <= 40
    statuses = found.screened["status"]
    assert (statuses == "pruned").sum() + len(simulated) == min(40, int((statuses.isin(["ok", "pruned"])).sum()))
    best = float(simulated["step_time_s"].min())
    pruned = found.screened[statuses == "pruned"]
    assert (pruned["bound_step_time_s"] >= best).all()  # nothing pruned could have won
    # Simulated and estimated agree where the closed forms hold (enough micro-batches to fill the pipeline).
    merged = simulated.merge(found.screened, left_on=[search.LAYOUT_KEYS[f] for f in search.LAYOUT_FIELDS],
                             right_on=list(search.LAYOUT_FIELDS))
    assert (merged["bound_step_time_s"] <= merged["step_time_s"] * (1 + 1e-9)).all()  # a true lower bound
    filled = merged[(merged["pp"] == 1) | (merged["microbatches_x"] >= 2 * merged["pp"])]
    assert len(filled) > 10
    assert ((filled["est_step_time_s"] / filled["step_time_s"] - 1).abs() < 0.05).all()
    assert (tmp_path / "screen.parquet").is_file() and (tmp_path / "results.parquet").is_file()


def test_a_sweep_on_a_local_dask_cluster_gives_the_process_executors_table(tmp_path: Path) -> None:
    spec = sweep.SweepSpec(TINY, {"schedule": ["1f1b", "gpipe", "zb-h1"], "training.microbatches": [1, 2, 4, 5]})
    local = sweep.run_sweep(spec, tmp_path / "process", jobs=2)
    dask = sweep.run_sweep(spec, tmp_path / "dask", jobs=2, executor="dask")
    pd.testing.assert_frame_equal(local, dask)
    assert (local["status"] == "ok").all() and len(local) == 12


def test_an_unreachable_dask_scheduler_is_a_one_line_error(tmp_path: Path) -> None:
    spec = sweep.SweepSpec(TINY, {"training.microbatches": [1]})
    with pytest.raises(ConfigError, match="--scheduler: cannot reach the Dask scheduler at 'tcp://127.0.0.1:1'"):
        sweep.run_sweep(spec, tmp_path, executor="dask", scheduler="tcp://127.0.0.1:1")
