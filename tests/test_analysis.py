"""The analysis entry points produce images from real runs (content is checked by the tests of the numbers
they draw; here: they run, and they write a PNG). ``python -m analysis`` and ``sim`` are called through their
``main(argv)`` in this process; the end-to-end tests of tests/test_cli.py run real processes."""

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
