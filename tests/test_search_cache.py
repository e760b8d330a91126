"""The screen's shared caches (sim.explore.estimate.Estimator: per-shape tails, compiled and memoised stage-level
replays) change nothing: every layout's estimate is the float a fresh Estimator gives it alone, so the ranking is
the same; and the screen reports its progress."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.explore import search
from sim.explore.estimate import Estimator
from sim.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["status", "est_step_time_s", "est_mfu", "est_peak_memory_bytes", "bound_step_time_s"]


def _alone(base, space: list[search.Layout]) -> pd.DataFrame:
    """The screen with a new Estimator for every layout: nothing one layout priced is reused for another."""
    rows = []
    for layout in space:
        rows.append(search.screen(base, [layout], Estimator(base)))
    return pd.concat(rows, ignore_index=True)


@pytest.mark.parametrize(("scenario", "stride"), [
    ("pipeline-4x8.yaml", 9),  # every schedule on 4 stages, zero-bubble orders replayed (m < 2p)
    ("gpt3-175b_a100-1024.yaml", 61),  # 236 layouts: tp 1-8, pp 1-32, all ZeRO stages and schedules
    ("llama2-7b_h100-32_spine.yaml", 23),  # the contention network's static shares
    ("mixtral-8x7b_h100-64.yaml", 401),  # MoE: expert tails, ep x etp
])
def test_the_shared_screen_gives_each_layout_the_estimate_it_gets_alone(scenario: str, stride: int) -> None:
    base = load_scenario(ROOT / "scenarios" / scenario)
    space = list(search.layouts(base))[::stride]
    shared = search.screen(base, space)
    alone = _alone(base, space)
    key = list(search.LAYOUT_FIELDS)
    merged = shared.merge(alone, on=key, suffixes=("", "_alone"), validate="one_to_one")
    assert len(merged) == len(space)
    assert (merged["status"] == merged["status_alone"]).all()
    for column in COLUMNS[1:]:  # bit for bit, NaN (invalid layouts) where the other is NaN
        a, b = merged[column], merged[f"{column}_alone"]
        assert ((a == b) | (a.isna() & b.isna())).all(), column
    priced = shared[shared["status"] == "ok"]
    assert len(priced) > 5
    ranked = alone[alone["status"] == "ok"].sort_values("est_step_time_s", kind="stable")
    assert priced[key].to_numpy().tolist() == ranked[key].to_numpy().tolist()


def test_the_screen_reports_its_progress_and_ends_at_the_total() -> None:
    base = load_scenario(ROOT / "scenarios" / "pipeline-4x8.yaml")
    space = list(search.layouts(base))
    seen: list[tuple[int, int]] = []
    search.screen(base, space, on_progress=lambda done, total: seen.append((done, total)))
    every = search.SCREEN_PROGRESS_EVERY
    assert seen == [(n, len(space)) for n in range(every, len(space), every)] + [(len(space), len(space))]
