"""Where sweep points run: in this process, in local worker processes, or on a Dask cluster.

In: a picklable function, a list of (key, argument tuple) jobs, and the executor's settings. Out: an iterator
of (key, result) in completion order (the caller records each row as it arrives, so an interrupted run keeps
what finished). ``process`` (default) uses ``concurrent.futures.ProcessPoolExecutor`` with ``jobs`` workers
(in-process when ``jobs <= 1``); ``dask`` submits to the Dask scheduler at ``scheduler`` (``tcp://host:8786``)
or, without one, to a ``LocalCluster`` of ``jobs`` single-threaded worker processes started for the run
(dask.distributed, imported only here and only when asked for). ``dask_timeout`` (seconds, default
``DASK_TIMEOUT_S``) is how long the Dask client waits to connect before a scheduler counts as unreachable. The
function and its results are the same either way, so the results table does not depend on the executor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

from sim.errors import ConfigError

Executor = Literal["process", "dask"]
# dask.distributed's own connect timeout (its distributed.comm.timeouts.connect default): a remote scheduler
# behind a slow network gets that long, and a wrong address fails after it with a one-line error.
DASK_TIMEOUT_S = 30.0


def run_all(function: Callable[..., Any], jobs: list[tuple[Any, tuple[Any, ...]]], workers: int = 1,
            executor: Executor = "process", scheduler: str | None = None,
            dask_timeout: float = DASK_TIMEOUT_S) -> Iterator[tuple[Any, Any]]:
    if executor == "dask":
        yield from _dask(function, jobs, workers, scheduler, dask_timeout)
    elif executor != "process":
        raise ConfigError(f"--executor: {executor!r} is not one of process, dask")
    elif workers <= 1:
        for key, args in jobs:
            yield key, function(*args)
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed  # here: the CLI's parser imports this module

        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(function, *args): key for key, args in jobs}
            for future in as_completed(futures):
                yield futures[future], future.result()


def _dask(function: Callable[..., Any], jobs: list[tuple[Any, tuple[Any, ...]]], workers: int,
          scheduler: str | None, timeout: float) -> Iterator[tuple[Any, Any]]:
    if not timeout > 0:
        raise ConfigError(f"--dask-timeout: {timeout} is not a positive number of seconds")
    try:
        from dask.distributed import Client, LocalCluster
        from dask.distributed import as_completed as dask_completed
    except ImportError:
        raise ConfigError("--executor dask: needs dask.distributed: pip install 'clustersim[dask]'") from None
    cluster = None
    if scheduler is None:
        cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                               dashboard_address=None)
    try:
        with Client(scheduler if scheduler is not None else cluster, timeout=f"{timeout}s") as client:
            # pure=False: two points with equal arguments are still two rows; keys keep the results apart.
            futures = {client.submit(function, *args, pure=False): key for key, args in jobs}
            for future in dask_completed(futures):
                yield futures[future], future.result()
    except OSError as error:
        raise ConfigError(f"--scheduler: cannot reach the Dask scheduler at {scheduler!r}: {error}") from None
    finally:
        if cluster is not None:
            cluster.close()
