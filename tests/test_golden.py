"""Golden trace of scenarios/tiny.yaml: any change to timing, ordering or the schema shows up here.
Regenerate after an intended change with CLUSTERSIM_REGEN_GOLDEN=1 and say why in the commit."""

import os

import pandas as pd
from pandas.testing import assert_frame_equal

from sim import runner
from sim.output import trace
from sim.spec.scenario import load_scenario

from conftest import DATA, SCENARIOS

GOLDEN = DATA / "golden" / "tiny_trace.csv"


def test_tiny_trace_matches_golden():
    frame = runner.run(load_scenario(SCENARIOS / "tiny.yaml")).trace
    if os.environ.get("CLUSTERSIM_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        trace.write_trace(frame, GOLDEN)
    golden = trace.read_trace(GOLDEN)
    assert list(frame.columns) == list(trace.TRACE_COLUMNS)
    assert_frame_equal(frame.reset_index(drop=True), golden, check_exact=False, rtol=1e-9, atol=1e-15)
    assert len(golden) == 374 and pd.api.types.is_float_dtype(golden["start_s"])
