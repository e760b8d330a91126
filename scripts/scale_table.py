"""docs/scale.md's table of issue 25's must-show figures, regenerated from the benchmarks' own output.

Each benchmark in ``benchmarks/`` prints its figures as tagged lines (``[startup] ...``, ``[gantt] ...``,
``[frontier] ...``, ``[screen] ...``, ``[confirm] ...``, ``[confirm-cpu] ...``) with medians, the runs, CPU time
and peak RSS, and the baseline measured in the same run. This script runs them (or some: ``--only``), keeps each
one's output in ``docs/scale/<benchmark>.log`` under a header with the date, the command and the machine, and
rewrites the table between the ``<!-- scale-table -->`` markers of ``docs/scale.md`` from every log there: one row
per figure, the line it comes from, the target, whether the target is met. ``--render`` rewrites the table from
the logs alone.
The 16,384-GPU ``ranks: all`` run is a separate command with a wall-clock limit (``--all-ranks-timeout``): it
is logged as finished (time, peak RSS) or as stopped at the limit (the CPU seconds it had spent, its RSS).

Run: python scripts/scale_table.py [--repeat 3]
     [--only startup,gantt,frontier,all-ranks,search,confirm,confirm-cpu,estimate]
     [--top 1000] [--confirm-repeat 1] [--all-ranks-timeout 900] [--render]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "docs" / "scale"
DOC = ROOT / "docs" / "scale.md"
BEGIN, END = "<!-- scale-table -->", "<!-- /scale-table -->"
LLAMA = "scenarios/llama3.1-405b_h100-16384.yaml"


def _bench(script: str, *args: str) -> list[str]:
    return [sys.executable, f"benchmarks/{script}", *args]


def commands(repeat: int, top: int, confirm_repeat: int) -> dict[str, list[str]]:
    """Each benchmark's command line (run from the repository root)."""
    return {
        "startup": _bench("bench_startup.py", "--repeat", str(repeat)),
        "gantt": _bench("bench_gantt.py", "--repeat", str(repeat)),
        "frontier": _bench("bench_frontier.py", "--repeat", str(repeat), "--skip-all-ranks"),
        "search": _bench("bench_search.py", "--repeat", str(repeat), "--skip-confirm"),
        "confirm": _bench("bench_search.py", "--skip-screen", "--top", str(top), "--confirm-repeat",
                          str(confirm_repeat)),
        "confirm-cpu": _bench("bench_confirm.py", "--top", str(top), "--repeat", str(repeat)),
        "estimate": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_estimate.py"],
    }


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _machine() -> str:
    load = os.getloadavg()
    return (f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, "
            f"Python {sys.version.split()[0]}")


def _header(argv: list[str]) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    shown = " ".join(["python", *argv[1:]])
    return f"# date: {now}\n# command: {shown}\n# machine: {_machine()}\n"


def run_logged(name: str, argv: list[str]) -> None:
    """Run one benchmark from the repository root, its output into docs/scale/NAME.log."""
    print(f"running {name}: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    header = _header(argv)
    done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    text = header + done.stdout + (f"\n# exit status {done.returncode}\n{done.stderr[-2000:]}" if done.returncode
                                   else "")
    (LOGS / f"{name}.log").write_text(text)


def run_all_ranks(timeout: float) -> None:
    """The 16,384-GPU scenario with every rank on the contention network, stopped at ``timeout`` seconds."""
    out = tempfile.mkdtemp(prefix="all-ranks-")
    argv = [sys.executable, "-m", "sim", "run", LLAMA, "--set", "ranks=all", "--set", "network.model=contention",
            "--no-plot", "-o", out]
    print(f"running all-ranks (limit {timeout:.0f} s)", file=sys.stderr, flush=True)
    header = _header(argv[:-1] + ["DIR"])
    began = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finished = True
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - began > timeout:
            child.send_signal(signal.SIGKILL)
            _, status, usage = os.wait4(child.pid, 0)
            finished = False
            break
        time.sleep(1.0)
    wall = time.perf_counter() - began
    cpu, rss = usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024
    code = os.waitstatus_to_exitcode(status)
    if finished and code == 0:
        line = (f"[frontier] all-ranks: sim run --no-plot {wall:.1f} s wall, CPU {cpu:.1f} s, "
                f"peak RSS {rss / 2**30:.2f} GiB")
    elif finished:
        line = f"[frontier] all-ranks: failed (exit {code}) after {wall:.1f} s wall, CPU {cpu:.1f} s"
    else:
        line = (f"[frontier] all-ranks: not finished, stopped after {wall:.1f} s wall, CPU {cpu:.1f} s, "
                f"peak RSS {rss / 2**30:.2f} GiB")
    shutil.rmtree(out, ignore_errors=True)
    (LOGS / "all-ranks.log").write_text(header + line + "\n")


@dataclass(frozen=True)
class Row:
    figure: str
    target: str
    log: str  # docs/scale/<log>.log
    pattern: str  # the line's text after its tag, as a regex; group "value" is checked against the target
    met: Callable[[float], bool]
    cell: Callable[[re.Match[str]], str] = lambda found: found.group(0)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


ROWS = (
    Row("`sim run` 175B, whole process (summary, trace, Gantt)", "<= 1.5 s", "startup",
        r"\[startup\] sim run 175B: (?P<value>[\d.]+) s .*", lambda v: v <= 1.5),
    Row("the same / `python -c \"import numpy, pandas\"` (same run)", "<= 4x", "startup",
        r"\[startup\] sim run 175B / import numpy, pandas = (?P<value>[\d.]+)x wall.*", lambda v: v <= 4),
    Row("`sim --help`", "<= 0.3 s", "startup", r"\[startup\] sim --help: (?P<value>[\d.]+) s .*",
        lambda v: v <= 0.3),
    Row("`sim check` 175B", "a few tenths (<= 0.5 s)", "startup", r"\[startup\] sim check 175B: (?P<value>[\d.]+) s .*",
        lambda v: v <= 0.5),
    Row("Gantt writer, 175B (158k tasks)", ">= 500,000 blocks/s", "gantt",
        r"\[gantt\] 175B, global batch 1536: .*= (?P<value>[\d,]+) blocks/s .*", lambda v: v >= 500_000),
    Row("its time against tasks at 40k / 80k / 159k tasks (same run)", "", "gantt",
        r"\[gantt\] blocks/s at 40k / 80k / 159k tasks: .*", lambda v: True),
    Row("Llama 3.1 405B, 16,384 H100, default mode, whole `sim run`", "< 2 s", "frontier",
        r"\[frontier\] llama3.1-405b_h100-16384: sim run \(whole process\) (?P<value>[\d.]+) s .*",
        lambda v: v < 2),
    Row("the same, `ranks: all`, contention network", "< 5 min, < 8 GiB", "all-ranks",
        r"\[frontier\] all-ranks: (?:sim run --no-plot (?P<value>[\d.]+) s|not finished|failed).*",
        lambda v: v < 300),
    Row("1.1T dense, 98,304 H100, default mode, whole `sim run`", "< 5 s", "frontier",
        r"\[frontier\] gpt-1t_h100-98304: sim run \(whole process\) (?P<value>[\d.]+) s .*", lambda v: v < 5),
    Row("`sim search -j 2` screen, GPT-3 175B (two processes)", ">= 20,000 layouts/s", "search",
        r"\[screen\] GPT-3 175B, 1024 A100: [\d,]+ layouts in [\d.]+ s = (?P<value>[\d,]+) layouts/s .*",
        lambda v: v >= 20_000),
    Row("the same screen's critical path: the -j 2 parent's CPU + its costlier share's (same run)",
        ">= 20,000 layouts/s", "search",
        r"\[screen\] GPT-3 175B, 1024 A100: -j 2 critical path [\d.]+ CPU s = (?P<value>[\d,]+) layouts per .*",
        lambda v: v >= 20_000),
    Row("the same screen in one process (same run)", "", "search",
        r"\[screen\] GPT-3 175B, 1024 A100, one process: .*", lambda v: True),
    Row("its baseline: building and rule-checking the layouts alone (same run)", "", "search",
        r"\[screen\] GPT-3 175B, 1024 A100: baseline.*", lambda v: True),
    Row("`sim search -j 2` screen, Mixtral 8x7B (MoE)", "", "search",
        r"\[screen\] Mixtral 8x7B, 64 H100: [\d,]+ layouts in [\d.]+ s = (?P<value>[\d,]+) layouts/s .*",
        lambda v: True),
    Row("`sim search --no-bound -j 2`: best N confirmed by simulation", "< 60 s for 1,000", "confirm",
        r"\[confirm\] GPT-3 175B: best (?P<n>[\d,]+) by estimate simulated with -j 2: (?P<value>[\d.]+) s .*",
        lambda v: v < 60),
    Row("one confirmation's CPU, in process, against a full run (same run)", "<= 0.12 s per layout", "confirm-cpu",
        r"\[confirm-cpu\] GPT-3 175B: .*: confirm (?P<value>[\d.]+) CPU s per layout .*", lambda v: v <= 0.12),
    Row("the estimate within 5% of the simulation on every bundled scenario", "every row", "estimate",
        r"(?P<value>\d+) passed.*|.*failed.*", lambda v: True),
)


def _log(name: str) -> tuple[dict[str, str], str]:
    path = LOGS / f"{name}.log"
    if not path.exists():
        return {}, ""
    text = path.read_text()
    header = dict(line[2:].split(": ", 1) for line in text.splitlines() if line.startswith("# ") and ": " in line)
    return header, text


def render() -> str:
    """The table, from the logs in docs/scale/."""
    lines = ["| figure | target | measured (median of the runs, their spread, CPU, peak RSS) | met | command, date, "
             "load |", "|---|---|---|---|---|"]
    for row in ROWS:
        header, text = _log(row.log)
        found = next((m for m in (re.fullmatch(row.pattern, line.strip()) for line in text.splitlines()) if m),
                     None)
        if found is None:
            lines.append(f"| {row.figure} | {row.target} | not measured | | `docs/scale/{row.log}.log` |")
            continue
        measured = found.group(0).split("] ", 1)[-1].replace("|", "/")
        value = found.groupdict().get("value")
        if row.log == "confirm" and found.groupdict().get("n") and _num(found.group("n")) != 1000:
            met = "scaled: n/a"  # fewer layouts than the target's 1,000
        elif row.log == "estimate":
            met = "yes" if value and "failed" not in text else "no"
        else:
            met = "" if not row.target else ("yes" if value and row.met(_num(value)) else "no")
        load = header.get("machine", "").split("load average ")[-1].split(",")[0]
        lines.append(f"| {row.figure} | {row.target} | {measured} | {met} | `{header.get('command', '')}`, "
                     f"{header.get('date', '')}, load {load} |")
    return "\n".join(lines)


def write_doc() -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} markers")
    before, rest = doc.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    DOC.write_text(before + BEGIN + "\n" + render() + "\n" + END + after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=1000)
    parser.add_argument("--confirm-repeat", type=int, default=1, help="confirmations of the best --top (minutes each)")
    parser.add_argument("--only", default="startup,gantt,frontier,all-ranks,search,confirm,confirm-cpu,estimate")
    parser.add_argument("--all-ranks-timeout", type=float, default=900.0)
    parser.add_argument("--render", action="store_true", help="only rewrite the table from docs/scale/*.log")
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    if not args.render:
        chosen = args.only.split(",")
        for name, argv in commands(args.repeat, args.top, args.confirm_repeat).items():
            if name in chosen:
                run_logged(name, argv)
        if "all-ranks" in chosen:
            run_all_ranks(args.all_ranks_timeout)
    write_doc()
    print(render())


if __name__ == "__main__":
    main()
