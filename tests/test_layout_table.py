"""The search's rules over the layout table (sim.explore.layout_table): each layout's line is the one check_rules
raises on its candidate alone, and each rule runs once per distinct value of the knobs it reads."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sim.explore import layout_table, search, search_candidate
from sim.spec.degrees import Degrees, degrees
from sim.spec.rules import RULES, Rule, check_rules
from sim.spec.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def _table_lines(base: Scenario, space: list[search.Layout],
                 rules: tuple[Rule, ...] = RULES) -> tuple[list[str | None], list[int]]:
    """The table's line per layout, and the layouts the rules ran on (a build each, the first time)."""
    batch, sections, built = degrees(base).global_batch, {}, {}  # type: ignore[var-annotated]

    def build(index: int) -> tuple[Scenario, Degrees]:
        if index not in built:
            scenario = search_candidate._candidate_scenario(base, space[index], batch, sections)
            built[index] = (scenario, degrees(scenario))
        return built[index]

    _, codes = layout_table.columns(space, search.LAYOUT_FIELDS)
    lines = layout_table.reasons(codes, search.LAYOUT_KEYS, search_candidate._DERIVED, build, len(space), rules)
    return lines, list(built)


def _alone(base: Scenario, layout: search.Layout) -> str | None:
    try:
        search.candidate(base, layout)
    except ValueError as error:
        return str(error)
    return None


# Spaces whose layouts fail every kind of rule the search meets: pipeline splits and schedules (175B), ZeRO-2/3
# under pipelines and FSDP's units (Llama 2 FSDP, 70B LoRA FSDP), Megatron's pipeline-split slots, recompute_num_layers
# and context parallelism's (405B on 16,384 GPUs), uneven stages (405B at 128k: every layout), the MoE rules (Mixtral
# narrowed to two tp degrees and two micro-batch sizes)
@pytest.mark.parametrize(("file", "only", "overrides"), [
    ("gpt3-175b_a100-1024.yaml", [], []),
    ("llama2-7b_h100-16_fsdp.yaml", [], []),
    ("llama3-70b_h100-8_lora_fsdp.yaml", [], []),
    ("llama3.1-405b_h100-16384.yaml", [], []),
    ("llama3.1-405b_h100-16384_cp16-128k.yaml", [], []),
    ("mixtral-8x7b_h100-64.yaml", ["tp=2,4", "micro_batch=1,2"], []),
    # Megatron-Core's EP A2A overlap: its rules read the schedule, vpp, recomputation and the dispatcher
    ("mixtral-8x7b_h100-64.yaml", ["tp=2,4", "micro_batch=1"], ["moe.a2a_overlap=true"]),
])
def test_every_layouts_line_is_the_one_its_candidate_raises_alone(file: str, only: list[str],
                                                                  overrides: list[str]) -> None:
    base = load_scenario(SCENARIOS / file, overrides)
    space = list(search.layouts(base, search.parse_only(only) if only else None))
    lines, _ = _table_lines(base, space)
    alone = [_alone(base, layout) for layout in space]
    assert lines == alone
    assert sum(line is not None for line in lines) > 200


# Layouts no search enumerates (any vpp with any schedule, a dp that does not fill the cluster, odd micro-batch
# sizes, expert degrees on any tp): a rule that reads a field its Rule.reads leaves out gives layouts that agree on
# what it claims to read different lines, and the table then disagrees with check_rules
@pytest.mark.parametrize(("file", "overrides"), [
    ("gpt3-175b_a100-1024.yaml", []),
    ("llama2-7b_h100-16_fsdp.yaml", []),
    ("llama3.1-405b_h100-16384.yaml", []),
    ("mixtral-8x7b_h100-64.yaml", ["moe.a2a_overlap=true"]),
])
def test_random_layouts_outside_the_search_get_check_rules_lines(file: str, overrides: list[str]) -> None:
    base = load_scenario(SCENARIOS / file, overrides)
    rng = random.Random(25)
    gpus, per_node = base.cluster.num_gpus, base.cluster.gpus_per_node
    space = []
    moe = base.model.is_moe  # past the MoE rules that most random layouts fail: ZeRO 0-1, SP, ep > 1
    for _ in range(2000):
        tp, pp, cp = rng.choice([1, 2, per_node]), rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 1, 2])
        dp = max(1, gpus // (tp * pp * cp)) + rng.choice([0, 0, 0, 1])
        space.append(search.Layout(tp, pp, dp, rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 3]),
                                   rng.choice(search.SEARCHED_SCHEDULES), rng.choice([0, 1] if moe else [0, 1, 2, 3]),
                                   rng.choice(search.RECOMPUTE_MODES), moe or rng.choice([False, True]),
                                   rng.choice([2, 8] if moe else [1, 2, 8]), rng.choice([1, 2]), cp,
                                   rng.choice(search.CP_COMM_TYPES)))
    lines, _ = _table_lines(base, space)
    assert lines == [_alone(base, layout) for layout in space]
    assert len(set(lines)) > 10


def test_a_rule_runs_once_per_value_of_what_it_reads_on_layouts_every_earlier_rule_passed() -> None:
    base = load_scenario(SCENARIOS / "pipeline-4x8.yaml")
    space = list(search.layouts(base))
    ran: list[tuple[str, int, int]] = []

    def deep(s: Scenario, d: Degrees) -> None:
        ran.append(("pp", s.parallel.pp, s.parallel.tp))
        if s.parallel.pp == 4:
            raise ValueError(f"parallel.pp: {s.parallel.pp} refused")

    def wide(s: Scenario, d: Degrees) -> None:
        ran.append(("tp", s.parallel.pp, s.parallel.tp))
        if s.parallel.tp == 2:
            raise ValueError(f"parallel.tp: {s.parallel.tp} refused")

    lines, _ = _table_lines(base, space, (Rule(("parallel.pp",), deep), Rule(("parallel.tp",), wide)))
    pps, tps = sorted({layout.pp for layout in space}), sorted({layout.tp for layout in space})
    assert 4 in pps and 2 in tps and len(tps) > 1
    assert sorted(pp for kind, pp, _ in ran if kind == "pp") == pps  # once per pp
    # once per tp among the layouts the first rule kept (none at pp 4)
    kept_tps = sorted({layout.tp for layout in space if layout.pp != 4})
    assert sorted(tp for kind, _, tp in ran if kind == "tp") == kept_tps
    assert all(pp != 4 for kind, pp, _ in ran if kind == "tp")
    for layout, line in zip(space, lines, strict=True):
        expected = "parallel.pp: 4 refused" if layout.pp == 4 else "parallel.tp: 2 refused" if layout.tp == 2 else None
        assert line == expected


def test_check_rules_runs_the_table_of_rules_in_order() -> None:
    base = load_scenario(SCENARIOS / "gpt3-175b_a100-1024.yaml")
    bad = search.Layout(8, 64, 2, 1, 1, "1f1b", 2, "none", True)  # pp 64 does not divide 96 layers; ZeRO-2 with pp
    scenario = search_candidate._candidate_scenario(base, bad)
    with pytest.raises(ValueError, match=r"^parallel.pp: 64 does not divide model.num_layers = 96$"):
        check_rules(scenario)
    first = next(rule for rule in RULES if _raises(rule, scenario))
    assert first is RULES[1]


def _raises(rule: Rule, scenario: Scenario) -> bool:
    try:
        rule.check(scenario, degrees(scenario))
    except ValueError:
        return True
    return False
