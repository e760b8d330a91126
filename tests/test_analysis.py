"""The analysis entry points produce images from real runs (content is checked by the tests of the numbers
they draw; here: they run, and they write a PNG)."""

import subprocess
import sys

from conftest import ROOT, SCENARIOS

PNG = b"\x89PNG\r\n\x1a\n"


def test_compare_schedules_writes_one_page(tmp_path):
    out = tmp_path / "schedules.png"
    result = subprocess.run([sys.executable, "-m", "analysis", "compare", str(SCENARIOS / "pipeline-4x8.yaml"),
                             "-o", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == PNG


def test_sweep_writes_table_and_plot_and_replots(tmp_path):
    out = tmp_path / "sweep"
    run = subprocess.run([sys.executable, "-m", "sim", "sweep", str(SCENARIOS / "pipeline-4x8.yaml"), "--grid",
                          "training.microbatches=4..8", "--grid", "schedule=1f1b,zb-h1", "-o", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "10 points: 10 ok" in run.stdout
    assert (out / "sweep.png").read_bytes()[:8] == PNG
    again = tmp_path / "again.png"
    replot = subprocess.run([sys.executable, "-m", "analysis", "sweep-plot", str(out), "--x", "training.microbatches",
                             "--hue", "schedule", "-o", str(again)], cwd=ROOT, capture_output=True, text=True)
    assert replot.returncode == 0, replot.stderr
    assert again.read_bytes()[:8] == PNG
