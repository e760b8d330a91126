"""Output files written whole or not at all (issue 27): a killed run never leaves a half-written file.

In: a destination path and a writer (a function that writes a file at the path it is given), or the text itself.
Out: the file at its destination, put there by ``os.replace`` from a temporary file beside it (same directory, so
the same file system, where POSIX rename is atomic): a reader sees the old file or the new one, never a torn one.
The temporary name keeps the destination's suffix (``.trace.tmp1234.parquet``), since writers pick the format from
it, and is removed if the writer fails or the process is interrupted.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path


def temporary_path(path: Path) -> Path:
    """A hidden sibling of ``path``, unique to this process, with the same suffix."""
    return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


def write_atomically(path: Path | str, write: Callable[[Path], object]) -> Path:
    """``write(temporary)`` then ``os.replace(temporary, path)``; the temporary file is removed on any failure,
    and an OSError names ``path`` (e.g. a directory standing where the file goes: 'Is a directory')."""
    path = Path(path)
    temporary = temporary_path(path)
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as error:  # reported against the file asked for, not the temporary one (the CLI prints it)
        _remove(temporary)
        raise OSError(error.errno, error.strerror or str(error), str(path)) from None
    except BaseException:
        _remove(temporary)
        raise
    return path


def _remove(temporary: Path) -> None:
    with contextlib.suppress(OSError):
        temporary.unlink(missing_ok=True)


def write_text_atomically(path: Path | str, text: str) -> Path:
    """``Path.write_text`` (UTF-8), whole or not at all."""
    return write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
