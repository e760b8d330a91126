"""No listener beyond localhost and none unless asked (issue 27). The Dask executor's local cluster listens on the
loopback address only and serves no dashboard (nor any HTTP route) unless ``--dask-dashboard`` asks for one, whose
link it then prints. (The CPU calibration's rendezvous store and gloo sockets: tests/test_calibrate.py.)"""

from __future__ import annotations

import importlib.util
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sim.cli import main
from sim.explore.executors import DASHBOARD_ADDRESS, LOCAL_HOST, local_cluster_settings

from conftest import SCENARIOS

TINY = SCENARIOS / "tiny.yaml"
needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs dask.distributed")


def test_the_local_cluster_is_configured_on_loopback_without_a_dashboard():
    options, config = local_cluster_settings(2, dashboard=False)
    assert LOCAL_HOST == "127.0.0.1" and options["host"] == LOCAL_HOST
    assert options["n_workers"] == 2 and options["threads_per_worker"] == 1
    assert options["dashboard_address"] is None and options["worker_dashboard_address"] is None
    # dask's scheduler always starts an HTTP server: a random loopback port, and nothing routed on it
    assert options["scheduler_kwargs"] == {"dashboard": False, "dashboard_address": "127.0.0.1:0"}
    assert config == {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}


def test_asking_for_the_dashboard_serves_it_on_loopback():
    options, config = local_cluster_settings(1, dashboard=True)
    assert options["dashboard_address"] == DASHBOARD_ADDRESS == "127.0.0.1:8787"
    assert options["host"] == LOCAL_HOST and "scheduler_kwargs" not in options and config == {}


@pytest.mark.slow
@needs_dask
def test_a_running_local_cluster_listens_on_loopback_and_serves_nothing_over_http():
    import dask.config
    from dask.distributed import LocalCluster

    options, config = local_cluster_settings(1, dashboard=False)
    with dask.config.set(config), LocalCluster(**options) as cluster:
        assert cluster.scheduler.address.startswith("tcp://127.0.0.1:")
        assert all(address.startswith("tcp://127.0.0.1:") for address in cluster.scheduler.workers)
        http = cluster.scheduler.http_server
        assert http.address == "127.0.0.1" and http.port != 8787
        for route in ("/status", "/health", "/metrics", "/info/main/workers.html"):
            with pytest.raises(urllib.error.HTTPError) as refused:  # noqa: PT012
                urllib.request.urlopen(f"http://127.0.0.1:{http.port}{route}", timeout=10)
            assert refused.value.code == 404, route


def test_the_dashboard_flag_needs_the_dask_executor(tmp_path: Path, capsys):
    capsys.readouterr()
    code = main(["sweep", str(TINY), "--grid", "training.microbatches=1", "--dask-dashboard", "-o", str(tmp_path),
                 "--no-plot"])
    assert code == 2
    assert capsys.readouterr().err.strip() == "error: --dask-dashboard: needs --executor dask"


@pytest.mark.slow
@needs_dask
def test_the_dashboard_flag_prints_its_loopback_link(tmp_path: Path, capsys):
    capsys.readouterr()
    assert main(["sweep", str(TINY), "--grid", "training.microbatches=1,2", "--executor", "dask", "-j", "1",
                 "--dask-dashboard", "-o", str(tmp_path), "--no-plot"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Dask dashboard: ")]
    assert len(lines) == 1 and lines[0].startswith("Dask dashboard: http://127.0.0.1:"), lines
