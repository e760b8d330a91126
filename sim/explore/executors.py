"""Where sweep points run: in this process, in local worker processes, or on a Dask cluster.

In: a picklable function, a list of (key, argument tuple) jobs, and the executor's settings. Out: an iterator
of (key, result) in completion order (the caller records each row as it arrives, so an interrupted run keeps
what finished). ``process`` (default) uses ``concurrent.futures.ProcessPoolExecutor`` with ``jobs`` workers
(in-process when ``jobs <= 1``); ``dask`` submits to the Dask scheduler at ``scheduler`` (``tcp://host:8786``)
or, without one, to a ``LocalCluster`` of ``jobs`` single-threaded worker processes started for the run
(dask.distributed, imported only here and only when asked for). ``dask_timeout`` (seconds, default
``DASK_TIMEOUT_S``) is how long the Dask client waits to connect before a scheduler counts as unreachable. The
function and its results are the same either way, so the results table does not depend on the executor.

Stopping (issue 27): local workers never outlive the run. When the caller stops iterating (an exception such as
the KeyboardInterrupt that SIGINT raises, or SIGTERM, which ``stop_on_sigterm`` turns into one), the process pool
cancels the points not started and terminates its workers at once, instead of ``shutdown(wait=True)`` running
every queued point to the end; the Dask ``LocalCluster`` is closed. Each local worker ignores SIGINT (a terminal's
Ctrl-C reaches the whole process group; the parent alone decides) and, on Linux, asks the kernel for SIGKILL
when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so even a SIGKILLed parent leaves no worker running.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Generator, Iterator
from types import FrameType
from typing import Any, Literal

from sim.errors import ConfigError

Executor = Literal["process", "dask"]
# dask.distributed's own connect timeout (its distributed.comm.timeouts.connect default): a remote scheduler
# behind a slow network gets that long, and a wrong address fails after it with a one-line error.
DASK_TIMEOUT_S = 30.0


def run_all(function: Callable[..., Any], jobs: list[tuple[Any, tuple[Any, ...]]], workers: int = 1,
            executor: Executor = "process", scheduler: str | None = None,
            dask_timeout: float = DASK_TIMEOUT_S,
            on_dashboard: Callable[[str], None] | None = None) -> Generator[tuple[Any, Any], None, None]:
    """``on_dashboard`` (Dask only): start the Dask dashboard and call this with its link (the remote
    scheduler's own, or the local cluster's on 127.0.0.1); without it no dashboard is served."""
    if executor == "dask":
        yield from _dask(function, jobs, workers, scheduler, dask_timeout, on_dashboard)
    elif executor != "process":
        raise ConfigError(f"--executor: {executor!r} is not one of process, dask")
    elif workers <= 1:
        for key, args in jobs:
            yield key, function(*args)
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed  # here: the CLI's parser imports this module

        pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init)
        try:
            futures = {pool.submit(function, *args): key for key, args in jobs}
            for future in as_completed(futures):
                yield futures[future], future.result()
        except BaseException:  # interrupted (or the caller stopped iterating): stop the workers now
            _terminate(pool)
            raise
        pool.shutdown(wait=True)


# prctl(2) option: the signal the kernel sends this process when its parent thread exits (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def _worker_init() -> None:
    """In each local worker: leave SIGINT to the parent, die of SIGTERM, and die with the parent (Linux; elsewhere
    the parent's ``_terminate`` on an interrupt is what stops the workers). SIGTERM back to its default: a forked
    worker inherits the parent's ``stop_on_sigterm`` handler, which turned ``_terminate``'s SIGTERM into a
    KeyboardInterrupt that the pool's worker loop catches as the running point's result, so a worker busy with a
    point outlived an interrupted sweep and the parent's exit waited for it (the SIGINT sweep test's hang)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _terminate(pool: Any) -> None:
    """Cancel the points not started and end the pool's workers without waiting for the running ones
    (``ProcessPoolExecutor`` has no public way to stop a running worker before Python 3.14's
    ``terminate_workers``; its ``_processes`` map holds them)."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.terminate()
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            process.join(timeout=5)


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within: SIGTERM raises KeyboardInterrupt in the main thread, as SIGINT does, so a sweep or search stopped
    by ``kill`` (a batch system, a timeout) unwinds like Ctrl-C: its workers are stopped, its finished rows are
    kept. The previous handler comes back on exit."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave the handler alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# The local Dask cluster's address (issue 27: no listener beyond localhost). Its scheduler and workers listen on the
# loopback address only (the workers connect to the scheduler, so those listeners are the executor itself). The
# dashboard is off unless asked for (``--dask-dashboard``: DASHBOARD_ADDRESS, loopback too). dask.distributed's
# scheduler starts its HTTP server whatever it is told (Scheduler.__init__ -> start_http_server, port 8787 by
# default): without a dashboard it gets a random loopback port and no routes (distributed.scheduler.http.routes
# and the workers' distributed.worker.http.routes emptied, so not even /health or /metrics is served).
LOCAL_HOST = "127.0.0.1"
DASHBOARD_ADDRESS = f"{LOCAL_HOST}:8787"  # dask's usual dashboard port, on the loopback address


def local_cluster_settings(workers: int, dashboard: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(keyword arguments of ``dask.distributed.LocalCluster``, the dask config set while it starts) for
    ``workers`` single-threaded worker processes, with or without the dashboard."""
    options: dict[str, Any] = {"n_workers": max(1, workers), "threads_per_worker": 1, "processes": True,
                               "host": LOCAL_HOST, "worker_dashboard_address": None}
    if dashboard:
        return options | {"dashboard_address": DASHBOARD_ADDRESS}, {}
    options |= {"dashboard_address": None,
                "scheduler_kwargs": {"dashboard": False, "dashboard_address": f"{LOCAL_HOST}:0"}}
    return options, {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}


def _dask(function: Callable[..., Any], jobs: list[tuple[Any, tuple[Any, ...]]], workers: int,
          scheduler: str | None, timeout: float,
          on_dashboard: Callable[[str], None] | None = None) -> Iterator[tuple[Any, Any]]:
    if not timeout > 0:
        raise ConfigError(f"--dask-timeout: {timeout} is not a positive number of seconds")
    try:
        import dask.config
        from dask.distributed import Client, LocalCluster
        from dask.distributed import as_completed as dask_completed
    except ImportError:
        raise ConfigError("--executor dask: needs dask.distributed: pip install 'clustersim[dask]'") from None
    cluster = None
    if scheduler is None:
        options, config = local_cluster_settings(workers, on_dashboard is not None)
        with dask.config.set(config):
            cluster = LocalCluster(**options)
    try:
        with Client(scheduler if scheduler is not None else cluster, timeout=f"{timeout}s") as client:
            if on_dashboard is not None:
                on_dashboard(str(client.dashboard_link))
            # pure=False: two points with equal arguments are still two rows; keys keep the results apart.
            futures = {client.submit(function, *args, pure=False): key for key, args in jobs}
            for future in dask_completed(futures):
                yield futures[future], future.result()
    except OSError as error:
        raise ConfigError(f"--scheduler: cannot reach the Dask scheduler at {scheduler!r}: {error}") from None
    finally:
        if cluster is not None:
            cluster.close()
