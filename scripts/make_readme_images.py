"""Regenerate the Gantt charts the README shows, from the bundled scenarios as they simulate today.

In: nothing (run from the repository root: ``python scripts/make_readme_images.py``). Out: docs/images/gantt-tiny.png
and docs/images/gantt-gpt3-175b.png, each the ``gantt.png`` that ``sim run`` writes for tiny.yaml and
gpt3-175b_a100-1024.yaml, so the charts' titles (step time, MFU, bubble) are the current model's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from sim.cli import main

CHARTS = {"tiny.yaml": "gantt-tiny.png", "gpt3-175b_a100-1024.yaml": "gantt-gpt3-175b.png"}


def make(root: Path = Path(".")) -> None:
    for scenario, image in CHARTS.items():
        with tempfile.TemporaryDirectory() as folder:
            if main(["run", str(root / "scenarios" / scenario), "-o", folder]) != 0:
                raise SystemExit(f"sim run {scenario} failed")
            shutil.copyfile(Path(folder) / "gantt.png", root / "docs" / "images" / image)
        print(f"wrote docs/images/{image}")


if __name__ == "__main__":
    make()
