"""The scenario loader's time against file size (issue 27 must-show 4): linear, and a 100 kB file well under 1 s.

In: nothing (``python benchmarks/bench_loader.py``). Out: printed lines. The bundled tiny scenario is padded to
10 kB ... 255 kB (just under the loader's bound, sim.spec.files.MAX_FILE_BYTES) three ways: comment lines, a
long list under an unknown key (refused by the schema after parsing) and a long name (refused by its
200-character bound); each is loaded in process (``load_scenario``, what ``sim check`` starts with), medians of 5.
The ratio of the time per kB at the largest and the smallest size says whether the time grows faster than the file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from measure import ROOT, machine, timed_call

from sim.errors import ConfigError
from sim.spec.scenario import MAX_FILE_BYTES, load_scenario

SIZES = (10_000, 30_000, 100_000, MAX_FILE_BYTES - 1_000)


def padded(base: str, kind: str, size: int) -> str:
    room = max(0, size - len(base))
    if kind == "comments":
        line = "# " + "x" * 77 + "\n"
        return base + line * (room // len(line))
    if kind == "list":
        return base + "padding: [" + "1, " * (room // 3) + "1]\n"
    return base.replace("name: tiny\n", "name: " + "x" * room + "\n")


def load(path: Path) -> None:
    try:
        load_scenario(path)
    except ConfigError:
        pass  # the list and the name are refused: the time to refuse them is what is measured


def main() -> None:
    print(machine())
    base = (ROOT / "scenarios" / "tiny.yaml").read_text()
    with tempfile.TemporaryDirectory() as folder:
        for kind in ("comments", "list", "name"):
            per_kb = []
            for size in SIZES:
                path = Path(folder) / f"{kind}-{size}.yaml"
                path.write_text(padded(base, kind, size))
                timed = timed_call(lambda path=path: load(path), repeat=5)
                per_kb.append(timed.seconds / (path.stat().st_size / 1000))
                print(f"[loader] {kind:8s} {path.stat().st_size:>9,} bytes: {timed}")
            print(f"[loader] {kind}: time per kB at {SIZES[-1]:,} bytes / at {SIZES[0]:,} bytes = "
                  f"{per_kb[-1] / per_kb[0]:.2f} (1 = linear)")


if __name__ == "__main__":
    main()
