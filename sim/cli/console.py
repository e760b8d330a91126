"""Terminal output that never truncates a table's numbers.

In: rich renderables printed by the CLI. Out: the same output, except that a table wider than the console is
printed at its natural width (lines wrap in a narrow terminal) instead of being squeezed. Rich squeezes
columns to the console width and cuts their cells with an ellipsis, and a console that is not a terminal
(output piped to a file, CI logs) is 80 columns wide, so ``sim search | tee log`` printed a step time as
``17.…`` and dropped the micro-batch column entirely.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


class TableConsole(Console):
    """A rich Console whose ``print`` widens itself, for the call, to fit any table it is given. Markup is off:
    scenario names, paths and errors are user text, printed as given (``[/x]`` in a name is not a rich tag)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        super().__init__(**kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        tables = [item for item in objects if isinstance(item, Table)]
        if not tables:
            super().print(*objects, **kwargs)
            return
        unbounded = self.options.update(max_width=1_000_000)
        needed = max(Measurement.get(self, unbounded, table).maximum for table in tables)
        width = self.width
        self.width = max(width, needed)
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = width
