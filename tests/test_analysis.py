"""The analysis entry points produce images from real runs (content is checked by the tests of the numbers
they draw; here: they run, and they write a PNG). ``python -m analysis`` and ``sim`` are called through their
``main(argv)`` in this process; the end-to-end tests of tests/test_cli.py run real processes."""

import pytest

from analysis.__main__ import main as analysis
from sim.cli import main as sim

from conftest import SCENARIOS

PNG = b"\x89PNG\r\n\x1a\n"


def test_compare_schedules_writes_one_page(tmp_path, capsys):
    out = tmp_path / "schedules.png"
    assert analysis(["compare", str(SCENARIOS / "pipeline-4x8.yaml"), "-o", str(out)]) == 0, capsys.readouterr().err
    assert out.read_bytes()[:8] == PNG


def test_sweep_writes_table_and_plot_and_replots(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = sim(["sweep", str(SCENARIOS / "pipeline-4x8.yaml"), "--grid", "training.microbatches=4..8", "--grid",
                "schedule=1f1b,zb-h1", "-o", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "10 points: 10 ok" in printed.out
    assert (out / "sweep.png").read_bytes()[:8] == PNG
    again = tmp_path / "again.png"
    code = analysis(["sweep-plot", str(out), "--x", "training.microbatches", "--hue", "schedule", "-o", str(again)])
    assert code == 0, capsys.readouterr().err
    assert again.read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, message", [
    (["--x", "nope", "--hue", "schedule"], "error: --x: 'nope' is not a column of the sweep's results ("),
    (["--x", "training.microbatches", "--hue", "nope"], "error: --hue: 'nope' is not a column of the sweep's "),
    (["--x", "training.microbatches", "--metric", "nope"], "error: --metric: 'nope' is not a column of the "),
])
def test_sweep_plot_names_a_bad_key_in_one_line(tmp_path, capsys, args, message):
    """A key the sweep's table lacks is one line naming the option (and the columns there are), exit 2, not a
    KeyError traceback from pandas (found in review9); so is a folder without a sweep's results."""
    out = tmp_path / "sweep"
    assert sim(["sweep", str(SCENARIOS / "pipeline-4x8.yaml"), "--grid", "training.microbatches=4,8", "--grid",
                "schedule=1f1b,zb-h1", "-o", str(out)]) == 0
    capsys.readouterr()
    assert analysis(["sweep-plot", str(out), *args, "-o", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert analysis(["sweep-plot", str(tmp_path), "--x", "a", "-o", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: run_dir: no results.parquet in '{tmp_path}' (a `sim sweep` or `sim search` folder)"]
    missing = tmp_path / "no" / "p.png"
    assert analysis(["sweep-plot", str(out), "--x", "training.microbatches", "-o", str(missing)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: -o: cannot write '{missing}'"), err


def test_a_chart_file_without_a_chart_extension_is_one_line(tmp_path, capsys):
    """``-o chart.xyz`` (or no extension) was Matplotlib's ValueError traceback from every chart command (sim plot,
    python -m analysis compare / sweep-plot / dualpipe); the charts are PNG, SVG or PDF by their extension (found in
    review9)."""
    run = tmp_path / "run"
    assert sim(["run", str(SCENARIOS / "tiny.yaml"), "-o", str(run), "--no-plot"]) == 0
    sweep = tmp_path / "sweep"
    assert sim(["sweep", str(SCENARIOS / "pipeline-4x8.yaml"), "--grid", "training.microbatches=4,8", "-o",
                str(sweep), "--no-plot"]) == 0
    for name in ("chart.xyz", "chart"):
        out = tmp_path / name
        expected = (f"error: -o: '{out}' is not a chart file: name it .png, .svg or .pdf (the format is read from "
                    "its extension)")
        for main, argv in ((sim, ["plot", str(run), "-o", str(out)]),
                           (analysis, ["compare", str(SCENARIOS / "pipeline-4x8.yaml"), "-o", str(out)]),
                           (analysis, ["sweep-plot", str(sweep), "--x", "training.microbatches", "-o", str(out)]),
                           (analysis, ["dualpipe", "-o", str(out)])):
            capsys.readouterr()
            assert main(argv) == 2, argv
            assert capsys.readouterr().err.strip().splitlines() == [expected], argv
            assert not out.exists()
