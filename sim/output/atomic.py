"""Output files written whole or not at all (issue 27): a killed run never leaves a half-written file.

In: a destination path and a writer (a function that writes a file at the path it is given), or the text itself.
Out: the file at its destination, put there by ``os.replace`` from a temporary file beside it (same directory, so
the same file system, where POSIX rename is atomic): a reader sees the old file or the new one, never a torn one.
The temporary name keeps the destination's suffix (``.trace.tmp1234.parquet``), since writers pick the format from
it, and is removed if the writer fails or the process is interrupted.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def temporary_path(path: Path) -> Path:
    """A hidden sibling of ``path``, unique to this process, with the same suffix."""
    return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


def write_atomically(path: Path | str, write: Callable[[Path], object]) -> Path:
    """``write(temporary)`` then ``os.replace(temporary, path)``; the temporary file is removed on any failure."""
    path = Path(path)
    temporary = temporary_path(path)
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def write_text_atomically(path: Path | str, text: str) -> Path:
    """``Path.write_text`` (UTF-8), whole or not at all."""
    return write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
