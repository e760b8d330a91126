"""The command line as a user meets it: outputs, one-line errors without tracebacks, determinism.

Most tests call ``sim.cli.main(argv)`` in this process (capsys holds what it printed; ``main`` returns the exit
code that ``sys.exit`` gives the shell). The ``end_to_end`` tests run the installed ``sim`` console script and
``python -m sim`` as real processes, to check what ``main`` alone cannot: the entry points, the shell's exit
code, and that a trace is byte-identical across processes (each with its own hash seed), not only within one.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from sim.cli import main

from conftest import ROOT, SCENARIOS

TINY = str(SCENARIOS / "tiny.yaml")


@dataclass
class Done:
    """What a command gave: its exit code and what it printed (the fields of subprocess.CompletedProcess)."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def sim(capsys, monkeypatch):
    """sim(*args) runs ``sim ARGS`` in this process from the repository root, as the subprocess did."""
    monkeypatch.chdir(ROOT)

    def call(*args: str) -> Done:
        capsys.readouterr()  # drop what earlier calls printed
        code = main([*args])
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return call


def console_script() -> str:
    """The ``sim`` script that ``pip install -e .`` puts beside this interpreter (or, failing that, on PATH)."""
    beside = Path(sysconfig.get_path("scripts")) / "sim"
    found = str(beside) if beside.is_file() else shutil.which("sim")
    assert found, "no 'sim' console script: install the project (pip install -e .)"
    return found


def sim_process(*command: str, hash_seed: str = "random") -> subprocess.CompletedProcess:
    """Run a command as its own process from the repository root, with its own PYTHONHASHSEED."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run(list(command), capture_output=True, text=True, cwd=ROOT, env=env)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_end_to_end_the_sim_script_runs_a_bundled_scenario(tmp_path, sim):
    """``sim run scenarios/tiny.yaml -o DIR`` by the installed ``sim`` script in its own process: exit 0, the
    summary table on stdout, every output (the Gantt chart from the analysis plugin included), and a trace byte
    for byte the one ``main`` writes here (two processes with two hash seeds, one trace). The README's 175B run
    is the same code path at about 3x the cost; tiny keeps this test near a second."""
    done = sim_process(console_script(), "run", TINY, "-o", str(tmp_path / "script"), hash_seed="1")
    assert done.returncode == 0, done.stderr
    assert "step time" in done.stdout and "Traceback" not in done.stderr
    for name in ("summary.json", "trace.parquet", "gantt.png", "scenario.resolved.yaml"):
        assert (tmp_path / "script" / name).is_file(), name
    assert (tmp_path / "script" / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sim("run", TINY, "-o", str(tmp_path / "here"), "--no-plot").returncode == 0
    assert digest(tmp_path / "script" / "trace.parquet") == digest(tmp_path / "here" / "trace.parquet")
    assert (json.loads((tmp_path / "script" / "summary.json").read_text())
            == json.loads((tmp_path / "here" / "summary.json").read_text()))


def test_end_to_end_a_bad_scenario_exits_non_zero_with_one_line_and_no_traceback(tmp_path, sim):
    """``python -m sim`` in its own process: the shell sees main's exit code and one line on stderr."""
    args = ("run", TINY, "-o", str(tmp_path / "x"), "--set", "parallel.tpp=2")
    done = sim_process(sys.executable, "-m", "sim", *args)
    assert done.returncode == 2 and done.stderr == "error: parallel.tpp: unknown key\n"
    assert "Traceback" not in done.stdout + done.stderr
    here = sim(*args)
    assert (here.returncode, here.stderr) == (done.returncode, done.stderr)


def test_run_writes_every_output(tmp_path, sim):
    out = tmp_path / "run"
    result = sim("run", TINY, "-o", str(out), "--chrome")
    assert result.returncode == 0, result.stderr
    for name in ("summary.json", "trace.parquet", "gantt.png", "scenario.resolved.yaml", "trace.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "exposed_comm_s",
                "peak_memory_bytes", "fits_in_memory", "num_gpus", "scenario", "seed"):
        assert key in summary
    assert (out / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    chrome = json.loads((out / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in chrome["traceEvents"])
    assert "step time" in result.stdout
    again = sim("run", str(out / "scenario.resolved.yaml"), "-o", str(tmp_path / "again"), "--no-plot")
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["step_time_s"] == summary["step_time_s"]


def test_same_scenario_and_seed_give_byte_identical_traces(tmp_path, sim):
    digests = []
    for name, fmt in (("a", "parquet"), ("b", "parquet"), ("c", "csv"), ("d", "csv")):
        assert sim("run", TINY, "-o", str(tmp_path / name), "--no-plot", "--format", fmt).returncode == 0
        digests.append(hashlib.sha256((tmp_path / name / f"trace.{fmt}").read_bytes()).hexdigest())
    assert digests[0] == digests[1] and digests[2] == digests[3]


def test_contention_run_writes_link_usage_timeline_and_counters(tmp_path, sim):
    args = ("--set", "network.model=contention", "--set", "ranks=all", "--link-timeline", "--chrome", "--no-plot",
            "--format", "csv")
    digests = []
    for name in ("a", "b"):
        out = tmp_path / name
        done = sim("run", TINY, "-o", str(out), *args)
        assert done.returncode == 0, done.stderr
        digests.append(hashlib.sha256((out / "trace.csv").read_bytes() + (out / "links.csv").read_bytes()).digest())
    assert digests[0] == digests[1]
    out = tmp_path / "a"
    links = (out / "links.csv").read_text().splitlines()
    assert links[0].startswith("link,src,dst,tier,capacity_Bps,bytes,busy_s,saturated_s,utilization")
    assert len(links) > 4 and (out / "link_timeline.csv").is_file()
    chrome = json.loads((out / "trace.json").read_text())
    assert any(e["ph"] == "C" and e["args"]["load"] > 0 for e in chrome["traceEvents"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["busiest_links"]
    assert {"link", "tier", "utilization", "saturated_s"} <= set(summary["busiest_links"][0])


@pytest.mark.parametrize("args, message", [
    (["--set", "network.algorithm=magic"], "error: network.algorithm: Input should be 'auto', 'ring', 'tree'"),
    (["--set", "cluster.fabric.oversubscription=0.5"], "error: cluster.fabric.oversubscription: Input should be"),
    (["--set", "costs.model=calibrated", "--set", "costs.profile=nope.json"], "error: costs.profile: no such file"),
    (["--set", "parallel.tpp=2"], "error: parallel.tpp: unknown key"),
    (["--set", "cluster.gpu.hbm_capacity=80 GX"], "error: cluster.gpu.hbm_capacity: unknown unit 'GX'"),
    (["--set", "parallel.dp=3"], "error: parallel: tp*pp*dp = 12 but the cluster has 4 GPUs"),
    (["--set", "model=missing/config.json"], "error: model: Hugging Face config 'missing/config.json' not found"),
    (["--set", "parallel"], "error: --set 'parallel': expected a.b=value"),
    (["--set", "cluster.gpu=XYZ"], "error: cluster.gpu: unknown GPU preset 'XYZ'"),
    (["--set", "schedule=zb"], "error: schedule: Input should be 'gpipe', '1f1b', 'interleaved', 'zb-h1'"),
    (["--set", "schedule=interleaved", "--set", "parallel.vpp=2", "--set", "training.global_batch=7"],
     "error: schedule: interleaved needs the micro-batch count (7) to be a multiple of pp (2)"),
])
def test_bad_scenarios_exit_non_zero_with_one_line(tmp_path, sim, args, message):
    result = sim("run", TINY, "-o", str(tmp_path / "x"), *args)
    assert result.returncode != 0
    assert result.stderr.strip() == message or result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr + result.stdout


def test_missing_scenario_file(tmp_path, sim):
    result = sim("run", "nowhere.yaml", "-o", str(tmp_path))
    assert result.returncode == 2 and result.stderr.strip() == "error: scenario: file 'nowhere.yaml' not found"


def test_unwritable_output_directory_is_one_line(tmp_path, sim):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = sim("run", TINY, "-o", str(blocker / "run"), "--no-plot")
    assert result.returncode == 1 and result.stderr.startswith("error: cannot write")
    assert "Traceback" not in result.stderr


def test_fail_on_oom_exits_non_zero_naming_the_rank(tmp_path, sim):
    result = sim("run", str(SCENARIOS / "llama2-7b_h100-8_dp.yaml"), "-o", str(tmp_path), "--no-plot",
                 "--fail-on-oom")
    assert result.returncode == 4
    assert result.stderr.startswith("error: rank 0 needs") and "optimizer" in result.stderr


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_bundled_scenario_passes_check(sim, path):
    result = sim("check", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("ok:")


def test_plot_a_window_of_some_ranks(tmp_path, sim):
    assert sim("run", TINY, "-o", str(tmp_path / "r"), "--no-plot").returncode == 0
    out = tmp_path / "zoom.png"
    result = sim("plot", str(tmp_path / "r"), "--ranks", "0", "--start", "0", "--end", "0.005", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    missing = sim("plot", str(tmp_path / "nothing"), "-o", str(out))
    assert missing.returncode == 2 and "no trace.parquet or trace.csv" in missing.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--ranks", "99", "-o", "x.svg"], "--ranks: rank 99 is not in the trace"),
    (["--ranks", "99", "-o", "x.png"], "--ranks: rank 99 is not in the trace"),
    (["--ranks", "zero", "-o", "x.png"], "--ranks: 'zero' is not a comma-separated list of ranks"),
    (["--start", "2", "--end", "1", "-o", "x.svg"], "--end: 1.0 s is not after --start 2.0 s"),
    (["--start", "100", "--end", "200", "-o", "x.svg"], "--start: the trace ends at"),
])
def test_plot_refuses_a_selection_with_nothing_in_it_in_one_line(tmp_path, sim, args, message):
    """Ranks the run did not simulate, an empty or inverted window: one line naming the option (the SVG path
    raised Matplotlib's 'Axis limits cannot be NaN or Inf' with a traceback, the PNG path drew an empty chart)."""
    assert sim("run", TINY, "-o", str(tmp_path / "r"), "--no-plot").returncode == 0
    args = [str(tmp_path / a) if a.startswith("x.") else a for a in args]
    result = sim("plot", str(tmp_path / "r"), *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.glob("x.*"))


def test_search_prints_the_best_layouts_and_writes_its_tables_and_plot(tmp_path, sim):
    out = tmp_path / "search"
    result = sim("search", str(SCENARIOS / "llama2-7b_h100-8_dp.yaml"), "--set", "model.num_layers=8",
                 "--set", "training.global_batch=8", "--top", "12", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "screened" in result.stdout and "best layouts" in result.stdout
    for name in ("screen.parquet", "results.csv", "results.parquet", "search.png"):
        assert (out / name).is_file(), name
    # Resumable like a sweep: a second run simulates nothing new and gives the same table.
    first = (out / "results.csv").read_text()
    assert sim("search", str(SCENARIOS / "llama2-7b_h100-8_dp.yaml"), "--set", "model.num_layers=8", "--set",
               "training.global_batch=8", "--top", "12", "-o", str(out)).returncode == 0
    assert (out / "results.csv").read_text() == first


def test_run_names_the_straggler(tmp_path, sim):
    result = sim("run", str(SCENARIOS / "llama2-7b_h100-8_dp.yaml"), "--set", "ranks=all", "--set",
                 "variation.slowdown={3: 1.2}", "--set", "model.num_layers=4", "-o", str(tmp_path), "--no-plot")
    assert result.returncode == 0, result.stderr
    assert re.search(r"critical rank\s+│\s+3: ", result.stdout), result.stdout


@pytest.mark.parametrize("timeout, message", [
    ("1", "error: --scheduler: cannot reach the Dask scheduler at 'tcp://127.0.0.1:1'"),
    ("0", "error: --dask-timeout: 0.0 is not a positive number of seconds"),
])
def test_dask_timeout_bounds_the_wait_for_an_unreachable_scheduler(tmp_path, sim, timeout, message):
    """--dask-timeout reaches the Dask client: nothing listens on port 1, so the sweep fails after about a
    second (not Dask's default 30) with one line; a timeout that is not positive is refused by name."""
    result = sim("sweep", TINY, "--grid", "training.microbatches=1", "--executor", "dask", "--scheduler",
                 "tcp://127.0.0.1:1", "--dask-timeout", timeout, "-o", str(tmp_path / "sweep"), "--no-plot")
    assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
