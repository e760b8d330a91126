"""A chart's file: the formats the charts are written in, read from the file's extension.

In: the path a user names (``sim plot -o``, ``python -m analysis compare / sweep-plot / dualpipe ... -o``,
``compare-profile --chart``). Out: the path, or a one-line ``ConfigError`` naming the option where its extension is
none of PNG, SVG and PDF: the Gantt PNG is drawn by its own encoder (analysis.gantt_png) and the rest by Matplotlib's
canvases, which pick the format from the name; any other name was Matplotlib's ValueError traceback, raised after
the runs the chart draws (found in review9).
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError

CHART_SUFFIXES = (".png", ".svg", ".pdf")


def chart_path(path: Path | str, option: str = "-o") -> Path:
    """``path`` as a ``Path`` where its extension names a chart format (``CHART_SUFFIXES``, any case), else
    ConfigError naming ``option``; checked before anything is simulated or drawn."""
    path = Path(path)
    if path.suffix.lower() not in CHART_SUFFIXES:
        raise ConfigError(f"{option}: '{path}' is not a chart file: name it .png, .svg or .pdf (the format is read "
                          "from its extension)")
    return path
