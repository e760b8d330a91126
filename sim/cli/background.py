"""Output plugins in a forked process that starts with the command (``sim run``'s charts, issue 25).

In: an entry-point group, forked once the command has imported numpy and pandas (the child shares them, copy
on write) and before it loads the scenario; later the plugins' arguments (``submit``, pickled through a pipe).
Out: what the plugins write, and ``wait()``: None, or the child's one-line error. The child loads the plugins
(Matplotlib and the analysis package: about a third of a second) while the parent loads the scenario and
simulates, then draws while the parent writes the trace and the summary; on two idle cores the chart costs the
command little more than handing it over. ``wait`` returns only when the child has exited, so every file
exists when the command returns, and a plugin's failure is still one line.

Where ``os.fork`` does not exist, ``start`` returns None and the caller runs the plugins itself.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

_CHUNK = 1 << 16


class Plugins:
    """A forked child waiting for the arguments of the plugins of one entry-point group."""

    def __init__(self, pid: int, to_child: int, from_child: int):
        self.pid, self._to_child, self._from_child = pid, to_child, from_child
        self._done = False
        self._error: str | None = None

    def submit(self, *args: Any) -> None:
        """Send the plugins' arguments (pickled; the child calls each plugin with them)."""
        with os.fdopen(self._to_child, "wb", closefd=True) as pipe:
            pickle.dump(args, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        self._to_child = -1

    def cancel(self) -> None:
        """Tell the child there is nothing to draw (the command failed), and reap it."""
        if self._to_child >= 0:
            os.close(self._to_child)
            self._to_child = -1
        self.wait()

    def wait(self) -> str | None:
        """Wait for the child to exit; its one-line error, or None when every plugin returned."""
        if self._done:
            return self._error
        self._done = True
        with os.fdopen(self._from_child, "rb", closefd=True) as pipe:
            message = pipe.read().decode("utf-8", "replace").strip()
        _, status = os.waitpid(self.pid, 0)
        if message:
            self._error = message
        elif os.waitstatus_to_exitcode(status) != 0:
            self._error = f"output plugins: the chart process exited with status {os.waitstatus_to_exitcode(status)}"
        return self._error


def start(group: str) -> Plugins | None:
    """Fork a child that loads the plugins of ``group`` and waits for their arguments; None without fork."""
    if not hasattr(os, "fork"):
        return None
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:  # the parent
        os.close(to_child_r)
        os.close(from_child_w)
        return Plugins(pid, to_child_w, from_child_r)
    os.close(to_child_w)
    os.close(from_child_r)
    code = 0
    try:
        error = _serve(group, to_child_r)
    except BaseException as failure:  # noqa: BLE001 - reported to the parent as one line, never a traceback
        error = f"output plugins: {type(failure).__name__}: {failure}"
    if error:
        os.write(from_child_w, error.splitlines()[0].encode() if error.strip() else b"output plugins failed")
        code = 1
    os.close(from_child_w)
    os._exit(code)  # no atexit handlers, no buffers of the parent's flushed twice


def _serve(group: str, source: int) -> str | None:
    from sim.cli.plugins import plugins as registered
    from sim.errors import SimError

    plugins = registered(group)
    data = bytearray()
    while chunk := os.read(source, _CHUNK):
        data += chunk
    os.close(source)
    if not data:  # cancelled
        return None
    args = pickle.loads(bytes(data))
    try:
        for write in plugins:
            write(*args)
    except SimError as error:
        return str(error)
    except OSError as error:
        target = f" {error.filename!r}" if error.filename else ""
        return f"cannot write{target}: {error.strerror or error}"
    return None
