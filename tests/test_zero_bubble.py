"""Zero-bubble schedules against Qi et al. ICLR 2024 Tables 5-6 (tests/data/zero_bubble_qi2024_bubble_rates.csv):
with the table's profiled T_F, T_B, T_W and T_comm (as the p2p latency of an otherwise infinitely fast link),
the simulated bubble rates of 1F1B, ZB-H1 and ZB-H2 match the published ones within 0.01 absolute (their
definition: (cost - m(T_F+T_B+T_W)) / cost, cost = the longest stage's span). And the memory: ZB-H1 holds
1F1B's p micro-batches, ZB-H2 2p-1."""

import csv

import pytest

from sim import runner
from sim.spec.scenario import scenario_from_dict

from conftest import DATA

ROWS = list(csv.DictReader(open(DATA / "zero_bubble_qi2024_bubble_rates.csv")))
COLUMNS = {"1f1b": "bubble_1F1B", "zb-h1": "bubble_ZB-H1", "zb-h2": "bubble_ZB-H2"}


def qi_scenario(row, schedule, hidden=256):
    p, m = int(row["pipeline_parallel"]), int(row["num_microbatches"])
    return scenario_from_dict({
        "name": f"qi-{row['model']}-{m}", "cluster": {
            "gpu": "H100-SXM", "nodes": 1, "gpus_per_node": p,
            "intra_node": {"bandwidth": "1e30 B/s", "latency": f"{row['T_comm_ms']} ms", "efficiency": 1,
                           "base_latency": 0, "efficiency_curve": []}},
        "model": {"name": "m", "num_layers": p, "hidden_size": hidden, "num_attention_heads": 4, "vocab_size": 1000,
                  "max_seq_len": 128},
        # The paper's schedule model: T_comm a hop the sender does not wait for, and no step tail.
        "training": {"microbatches": m, "clip_grad": 0},
        "parallel": {"tp": 1, "pp": p, "dp": 1, "overlap_p2p_comm": True}, "schedule": schedule,
        "costs": {"model": "fixed", "forward": f"{row['T_F_ms']} ms", "backward": f"{row['T_B_ms']} ms",
                  "weight_grad": f"{row['T_W_ms']} ms"},
        "network": "analytic",
    })


@pytest.mark.parametrize("schedule", sorted(COLUMNS))
@pytest.mark.parametrize("row", ROWS,
                         ids=[f"{r['model']}-p{r['pipeline_parallel']}-m{r['num_microbatches']}" for r in ROWS])
def test_bubble_rate_matches_qi_et_al(row, schedule):
    rate = runner.run(qi_scenario(row, schedule)).summary.bubble_rate_stagewise
    assert rate == pytest.approx(float(row[COLUMNS[schedule]]), abs=0.01)


def test_closed_forms_of_the_bubbles():
    """The simulated ZB bubbles are the paper's closed forms plus the p2p latency on the critical path."""
    row = ROWS[0]
    p, m = int(row["pipeline_parallel"]), int(row["num_microbatches"])
    f, b, w, c = (float(row[k]) * 1e-3 for k in ("T_F_ms", "T_B_ms", "T_W_ms", "T_comm_ms"))
    ideal = m * (f + b + w)
    for schedule, bubble in (("zb-h1", (p - 1) * (f + b - w) + 4 * (p - 1) * c),
                             ("zb-h2", (p - 1) * (f + b - 2 * w) + 2 * (p - 1) * c)):
        rate = runner.run(qi_scenario(row, schedule)).summary.bubble_rate_stagewise
        assert rate == pytest.approx(bubble / (ideal + bubble), rel=1e-9)


def test_zb_h1_memory_equals_1f1b_and_zb_h2_is_about_twice():
    row = ROWS[0]
    p = int(row["pipeline_parallel"])
    activations = {}
    for schedule in ("1f1b", "zb-h1", "zb-h2"):
        summary = runner.run(qi_scenario(row, schedule)).summary
        activations[schedule] = max(m["activations"] for m in summary.memory_breakdown_bytes.values())
    assert activations["zb-h1"] == activations["1f1b"]
    assert activations["zb-h2"] / activations["1f1b"] == pytest.approx((2 * p - 1) / p)


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_zb_v_has_no_bubble_with_1f1b_memory(p):
    """ZB-V (Qi et al. NeurIPS 2024): with T_F = T_B = T_W and m >= 2p, no stage idles inside its span, and
    the activations held are 1F1B's (2p half-stage chunks = p micro-batches of a whole stage)."""
    from conftest import pipeline_scenario
    for m in (2 * p, 3 * p):
        zbv = runner.run(pipeline_scenario(p, m, "zb-v", forward="0.5 s", backward="0.5 s", weight_grad="0.5 s",
                                           layers_per_stage=2, vpp=2)).summary
        ofob = runner.run(pipeline_scenario(p, m, "1f1b", forward="0.5 s", backward="0.5 s", weight_grad="0.5 s",
                                            layers_per_stage=2)).summary
        assert zbv.bubble_rate_stagewise == pytest.approx(0.0, abs=1e-12)
        activations = [max(x["activations"] for x in s.memory_breakdown_bytes.values()) for s in (zbv, ofob)]
        assert activations[0] == activations[1]
