"""The reports that show the bubble show the host-bound share beside it (summary.json version 2, docs/summary.md:
``host_bound_fraction`` is the compute stream's wait for the host to issue a MoE layer pass behind the token
dispatcher's host sync, no longer part of ``bubble_fraction``): the search report's table
(analysis/search_report.py), the sweep's chart (analysis/sweep_plot.py), the Gantt charts' titles
(analysis/gantt.py, analysis/compare.py). Checked on tests/test_moe_host_sync.py's one-MoE-layer model on 8 GPUs
(DeepEP, each pass host-bound), searched and swept for real; a dense run's reports do not grow the column."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml
from test_moe_host_sync import _doc as host_sync_doc

from analysis.compare import compare_schedules
from analysis.gantt import bubble_text, run_title
from analysis.search_report import to_markdown
from analysis.sweep_plot import METRICS, default_metrics, sweep_figure, write_sweep_plot
from sim import runner
from sim.explore.search import run_search
from sim.explore.sweep import SweepSpec, run_sweep
from sim.spec.scenario import load_scenario, scenario_from_dict

from conftest import ROOT, SCENARIOS


def _scenario_file(folder: Path) -> Path:
    path = folder / "host-sync.yaml"
    path.write_text(yaml.safe_dump(host_sync_doc()))
    return path


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_search_report_has_a_host_bound_column_with_each_layouts_share(tmp_path: Path) -> None:
    """``sim search`` over the host-sync model's layouts (every one waits for the host: ~20-26% of the time to
    the last forward/backward): the report's table has a ``host-bound`` column right after ``bubble``, and each
    layout's row holds its results-table ``host_bound_fraction`` and ``bubble_fraction`` to 0.1%, the header,
    separator and rows with the same number of cells."""
    found = run_search(_scenario_file(tmp_path), [], tmp_path / "search", top=20)
    best = found.simulated.head(12)
    assert (best["status"] == "ok").all() and (best["host_bound_fraction"] > 0.15).all()
    text = to_markdown(found.screened, best)
    table = [line for line in text.splitlines() if line.startswith("|")]
    header = _cells(table[0])
    assert header.index("host-bound") == header.index("bubble") + 1
    assert len(_cells(table[1])) == len(header)
    rows = [_cells(line) for line in table[2:]]
    assert len(rows) == len(best)
    for cells, (_, row) in zip(rows, best.iterrows(), strict=True):
        assert len(cells) == len(header)
        assert cells[header.index("host-bound")] == f"{row['host_bound_fraction']:.1%}"
        assert cells[header.index("bubble")] == f"{row['bubble_fraction']:.1%}"
    # the same rows with nothing host-bound (a dense model's, a pre-version-2 table's): no such column
    for quiet in (best.assign(host_bound_fraction=0.0), best.drop(columns="host_bound_fraction")):
        plain = to_markdown(found.screened, quiet).splitlines()
        header = _cells(next(line for line in plain if line.startswith("|")))
        assert "host-bound" not in header and "bubble" in header


def test_the_sweep_chart_draws_the_host_bound_fraction_beside_the_bubble(tmp_path: Path) -> None:
    """A sweep of the host-sync model over the global batch, with and without the sync: the default panels add
    ``host-bound fraction`` after the bubble; its lines are the results table's numbers (0 without the sync). A
    table where nothing is host-bound keeps step time, bubble and MFU."""
    spec = SweepSpec(_scenario_file(tmp_path), {"training.global_batch": [16, 32], "moe.host_sync": [True, False]})
    table = run_sweep(spec, tmp_path / "sweep")
    assert (table["status"] == "ok").all()
    synced = table[table["moe.host_sync"]]
    assert (synced["host_bound_fraction"] > 0.3).all()
    assert (table[~table["moe.host_sync"]]["host_bound_fraction"] == 0).all()
    assert default_metrics(table) == ("step_time_s", "bubble_fraction", "host_bound_fraction", "mfu")
    figure = sweep_figure(table, "training.global_batch", "moe.host_sync")
    panel = figure.axes[2]
    assert panel.get_ylabel() == "host-bound fraction"
    drawn = {line.get_label(): list(line.get_ydata()) for line in panel.get_lines()}
    for sync, rows in table.groupby("moe.host_sync"):
        assert drawn[str(sync)] == list(rows.sort_values("training.global_batch")["host_bound_fraction"])
    assert drawn["True"] != drawn["False"]
    assert write_sweep_plot(tmp_path / "sweep", table, list(spec.grid)) == tmp_path / "sweep" / "sweep.png"
    assert default_metrics(table[~table["moe.host_sync"]]) == METRICS
    assert default_metrics(table.drop(columns="host_bound_fraction")) == METRICS  # before summary.json v2


def test_chart_titles_state_the_host_bound_share_where_there_is_one(tmp_path: Path) -> None:
    """``gantt.png``'s title and each panel of the schedule comparison say ``bubble B%, host-bound H%`` for a run
    that waited for the host (the single-stage host-sync model: most of its pipeline is host-bound), and only
    ``bubble B%`` for a dense run."""
    moe = runner.run(scenario_from_dict(host_sync_doc()))
    summary = moe.summary
    assert summary.host_bound_fraction > 0.6  # tests/test_host_bound_report.py's closed form: 21 of 32 ms
    expected = f"bubble {summary.bubble_fraction:.1%}, host-bound {summary.host_bound_fraction:.1%}"
    assert bubble_text(summary) == expected
    assert f"MFU {summary.mfu:.1%}, {expected} (1f1b, m=4)" in run_title(summary, moe.trace)
    dense = runner.run(load_scenario(SCENARIOS / "tiny.yaml")).summary
    assert dense.host_bound_fraction == 0.0
    assert bubble_text(dense) == f"bubble {dense.bubble_fraction:.1%}"
    # the comparison page: one panel per variant, titled through bubble_text
    page = compare_schedules(_scenario_file(tmp_path), tmp_path / "compare.png", [("1F1B", [])])
    assert page.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_answers_table_records_the_host_bound_share(tmp_path: Path) -> None:
    """scripts/answers_table.py (the refactor's before/after table) records the host-bound share beside the bubble
    (the run's summary figures, to 9 digits) and compares it."""
    spec = importlib.util.spec_from_file_location("answers_table", ROOT / "scripts" / "answers_table.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.COLUMNS.index("host_bound_fraction") == script.COLUMNS.index("bubble_fraction") + 1
    answers = script.answers(_scenario_file(tmp_path), [])
    summary = runner.run(scenario_from_dict(host_sync_doc())).summary
    assert answers["host_bound_fraction"] == f"{summary.host_bound_fraction:.9g}"
    assert answers["bubble_fraction"] == f"{summary.bubble_fraction:.9g}"
    assert float(answers["host_bound_fraction"]) > 0.6
