"""The CLI's console prints tables whole: no cell is cut with an ellipsis when output is narrower than a table
(a pipe or a CI log is an 80-column console)."""

import io

from rich.table import Table

from sim.cli.console import TableConsole


def _table() -> Table:
    table = Table(title="best layouts")
    for name in ("layout", "mb", "schedule", "ZeRO", "recompute", "SP", "step s", "est. s", "MFU", "GiB"):
        table.add_column(name, no_wrap=True)
    table.add_row("tp2 pp1 dp512 v24", "1", "interleaved", "3", "selective", "yes", "17.15", "17.11", "61.8%", "48")
    return table


def test_a_table_wider_than_the_console_keeps_every_cell():
    out = io.StringIO()
    console = TableConsole(file=out, width=60, color_system=None)
    console.print(_table())
    text = out.getvalue()
    assert "…" not in text
    for cell in ("tp2 pp1 dp512 v24", "interleaved", "selective", "17.15", "17.11", "61.8%", "recompute"):
        assert cell in text
    assert console.width == 60  # widened for the call only


def test_plain_text_still_wraps_at_the_console_width():
    out = io.StringIO()
    console = TableConsole(file=out, width=20, color_system=None)
    console.print("word " * 10)
    assert max(len(line) for line in out.getvalue().splitlines()) <= 20
