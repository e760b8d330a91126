"""Regenerate the README's Gantt charts and the figures stated beside them, from the bundled scenarios as they
simulate today.

In: nothing (run from the repository root: ``python scripts/make_readme_images.py``; ``--check`` renders nothing
and exits 1 when the README's figures differ from a fresh run's). Out: each chart in ``FIGURES`` copied to
docs/images/ (the ``gantt.png`` that ``sim run`` writes for that scenario, so a chart's title carries the current
model's step time, MFU and bubble), and each figure's caption rewritten in README.md between its markers
``<!-- make_readme_images: NAME -->`` and ``<!-- /make_readme_images -->``: the numbers come from the same runs.
``tests/test_readme_figures.py`` reruns the scenarios (without drawing) and fails when a caption drifts, so a change
to the model that moves a README figure also says to run this script (issue 26).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30


@dataclass(frozen=True)
class Run:
    """One ``sim run``: a bundled scenario, its ``--set`` overrides, and the image its gantt.png becomes (None:
    numbers only)."""

    scenario: str
    overrides: tuple[str, ...] = ()
    image: str | None = None
    link_timeline: bool = False  # contention network: draw the saturated links under the ranks


@dataclass(frozen=True)
class Figure:
    """A README caption (its marker name) and the runs whose summaries it states."""

    name: str
    runs: tuple[Run, ...]
    caption: Callable[[Sequence[Any]], str]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _step(summary: Any) -> str:
    host = f", host-bound {summary.host_bound_fraction:.1%}" if summary.host_bound_fraction > 0 else ""  # MoE
    return (f"{summary.step_time_s:.3f} s per step, {summary.mfu:.1%} MFU, bubble {summary.bubble_fraction:.1%}"
            f"{host}, {summary.peak_memory_bytes.max / GiB:.1f} GiB per GPU")


FIGURES = (
    Figure("gpt3-175b", (Run("gpt3-175b_a100-1024.yaml", image="gantt-gpt3-175b.png"),),
           lambda s: f"GPT-3 175B on 1024 A100: {_step(s[0])}; exposed communication tp / pp / dp "
                     f"{_ms(s[0].exposed_comm_s['tp'])} / {_ms(s[0].exposed_comm_s['pp'])} / "
                     f"{_ms(s[0].exposed_comm_s['dp'])}."),
    Figure("tiny", (Run("tiny.yaml", image="gantt-tiny.png"),), lambda s: f"tiny: {_step(s[0])}."),
    Figure("fsdp", (Run("llama2-7b_h100-16_fsdp.yaml", image="gantt-fsdp-prefetch.png"),
                    Run("llama2-7b_h100-16_fsdp.yaml", ("fsdp.prefetch=false",), "gantt-fsdp-no-prefetch.png")),
           lambda s: f"With backward prefetch (top): {s[0].step_time_s:.3f} s per step, "
                     f"{_ms(s[0].exposed_comm_s['dp'])} of exposed all-gathers and reduce-scatters, "
                     f"{s[0].peak_memory_bytes.max / GiB:.1f} GiB per GPU. Without (bottom): "
                     f"{s[1].step_time_s:.3f} s, {_ms(s[1].exposed_comm_s['dp'])} exposed."),
    Figure("spine", (Run("llama2-7b_h100-32_spine.yaml", ("cluster.fabric.oversubscription=1",)),
                     Run("llama2-7b_h100-32_spine.yaml", image="spine_contention.png", link_timeline=True)),
           lambda s: f"Non-blocking spine: {s[0].step_time_s:.3f} s per step, {_ms(s[0].exposed_comm_s['dp'])} of "
                     f"exposed DP communication; 4:1 oversubscribed (the chart): {s[1].step_time_s:.3f} s, "
                     f"{_ms(s[1].exposed_comm_s['dp'])}."),
)

BEGIN = "<!-- make_readme_images: {name} -->"
END = "<!-- /make_readme_images -->"


def caption(figure: Figure, summaries: Sequence[Any]) -> str:
    """The README block of ``figure`` (markers included) for these summaries, one per run."""
    return f"{BEGIN.format(name=figure.name)}\n*{figure.caption(summaries)}*\n{END}"


def readme_block(text: str, name: str) -> str | None:
    """The block named ``name`` as the README holds it (None: no such markers)."""
    found = re.search(re.escape(BEGIN.format(name=name)) + r".*?" + re.escape(END), text, re.DOTALL)
    return found.group(0) if found else None


def summaries(figure: Figure) -> list[Any]:
    """Each run's summary, simulated now (no chart drawn)."""
    from sim import api

    return [api.run(str(ROOT / "scenarios" / run.scenario), list(run.overrides)).summary for run in figure.runs]


def draw(run: Run) -> None:
    """``sim run`` the scenario and copy its gantt.png to docs/images/."""
    from sim.cli import main

    assert run.image is not None
    with tempfile.TemporaryDirectory() as folder:
        argv = ["run", str(ROOT / "scenarios" / run.scenario), "-o", folder]
        argv += [item for override in run.overrides for item in ("--set", override)]
        argv += ["--link-timeline"] if run.link_timeline else []
        if main(argv) != 0:
            raise SystemExit(f"sim run {run.scenario} failed")
        shutil.copyfile(Path(folder) / "gantt.png", ROOT / "docs" / "images" / run.image)
    print(f"wrote docs/images/{run.image}")


def make(check: bool = False) -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    stale = []
    for figure in FIGURES:
        block = caption(figure, summaries(figure))
        held = readme_block(text, figure.name)
        if held is None:
            raise SystemExit(f"README.md has no {BEGIN.format(name=figure.name)} ... {END} block")
        if held != block:
            stale.append(figure.name)
            text = text.replace(held, block)
        if not check:
            for run in figure.runs:
                if run.image is not None:
                    draw(run)
    if check:
        print("README figures " + (f"stale: {', '.join(stale)}" if stale else "current"))
        return 1 if stale else 0
    readme.write_text(text)
    print(f"wrote README.md ({', '.join(stale) or 'no'} captions changed)")
    return 0


if __name__ == "__main__":
    sys.exit(make(check="--check" in sys.argv[1:]))
