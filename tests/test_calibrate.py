"""sim calibrate on the CPU (gloo, 2 processes), the profiles it writes, and costs: calibrated.

The GPU path runs the same code with CUDA events and NCCL; its tests are marked ``gpu`` and skipped here.
"""

import contextlib
import importlib.util
import json
import os
import socket
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

# torch is imported by the tests that use it, not here: importing it takes over a second, which every
# pytest-xdist worker would pay while collecting, whether or not it runs these tests.
if importlib.util.find_spec("torch") is None:
    pytest.skip("could not import 'torch'", allow_module_level=True)

from sim import runner  # noqa: E402
from sim.calibrate.run import LOOPBACK, gloo_environment, listening_socket, resolve_device  # noqa: E402
from sim.cli.commands import main  # noqa: E402
from sim.costs.profile import load  # noqa: E402
from sim.errors import ConfigError  # noqa: E402
from sim.model.flash_tiles import causal_fraction  # noqa: E402
from sim.network.collectives import bus_factor  # noqa: E402
from sim.spec.scenario import load_scenario  # noqa: E402

from conftest import SCENARIOS  # noqa: E402

# The calibration run (torch, two spawned gloo processes: about 6 s) is shared by the tests below that read it:
# they are slow, and under pytest-xdist (--dist loadgroup) this module runs on one worker, so it runs once.
pytestmark = pytest.mark.xdist_group("calibration")


LISTENERS: set[tuple[str, int]] = set()  # (local address, port) of every socket listening during the run


def _tree(root: int) -> set[int]:
    """``root`` and its live descendants (Linux /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    """Listening TCP sockets (IPv4 and IPv6) that these processes hold: /proc/net/tcp* rows in state 0A (LISTEN)
    whose inode is one of their descriptors."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*") if Path(f"/proc/{pid}/fd").is_dir() else []:
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    address, port = fields[1].split(":")
                    found.add((address, int(port, 16)))
    return found


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    """The quick CPU calibration, run once; meanwhile a thread records every socket it listens on."""
    out = tmp_path_factory.mktemp("calibration")
    done = threading.Event()

    def watch():
        while not done.is_set():
            LISTENERS.update(_listening(_tree(os.getpid())))
            done.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    if Path("/proc/net/tcp").is_file():
        watcher.start()
    try:
        assert main(["calibrate", "--device", "cpu", "--quick", "-o", str(out)]) == 0
    finally:
        done.set()
    return out


# 127.0.0.1 as /proc/net/tcp writes it (little-endian hex) and ::1 / ::ffff:127.0.0.1 as /proc/net/tcp6 does.
LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="reads listening sockets from Linux's /proc")
def test_the_cpu_collectives_listen_on_localhost_only(calibration):
    """Issue 27: the rendezvous store and gloo's sockets are on the loopback address (the store used to listen on
    every interface, on a port picked by a bind/close/rebind race)."""
    assert LISTENERS, "the watcher saw no listening socket: the store and gloo listen while the collectives run"
    assert {address for address, _ in LISTENERS} <= LOOPBACK_HEX, LISTENERS


def test_the_store_socket_and_gloo_interface_are_loopback():
    sock = listening_socket()
    with sock:
        assert sock.getsockname()[0] == LOOPBACK == "127.0.0.1"
    interface = gloo_environment()["GLOO_SOCKET_IFNAME"]
    assert interface in {name for _, name in socket.if_nameindex()} and interface.startswith("lo")


def calibrated_tiny(profile_path):
    return load_scenario(SCENARIOS / "tiny.yaml", ["costs.model=calibrated", f"costs.profile={profile_path}"])


@pytest.mark.slow
def test_quick_cpu_run_writes_raw_measurements_and_a_profile(calibration):
    names = {p.name for p in calibration.iterdir()}
    assert {"gemm.csv", "attention.csv", "copy.csv", "collectives.csv", "numerics.csv", "profile.json"} <= names
    gemm = pd.read_csv(calibration / "gemm.csv")
    assert set(gemm["dtype"]) == {"fp32", "bf16", "fp16"}
    assert (gemm["achieved_flops_per_s"] > 0).all() and (gemm["median_s"] > 0).all()
    assert (gemm["p10_s"] <= gemm["median_s"]).all() and (gemm["median_s"] <= gemm["p90_s"]).all()
    assert {"qkv_proj", "mlp_up.wgrad", "square256"} <= set(gemm["name"])  # the layer's GEMMs and the sweep
    assert (pd.read_csv(calibration / "copy.csv")["bandwidth_Bps"] > 0).all()
    profile = load(calibration / "profile.json")
    import torch
    assert profile.device.kind == "cpu" and profile.device.versions["torch"] == torch.__version__
    assert profile.gemm_rate("bf16", 1e6) > 0 and profile.intra_node is not None
    # The attention sweep (the CPU's math backend): forward and backward rows per shape, and their curves.
    attention = pd.read_csv(calibration / "attention.csv")
    assert set(attention["phase"]) == {"forward", "backward"} and set(attention["backend"]) == {"math"}
    forward = attention[attention["phase"] == "forward"]
    # the executed tiles' count the cost model prices (Op.executed_flops): 4 h s^2 d x causal_fraction(s)
    tiles = forward["seq_len"].map(causal_fraction)
    counted = 4.0 * forward["heads"] * forward["seq_len"] ** 2 * forward["head_dim"] * tiles
    assert ((forward["flops"] / counted - 1).abs() < 1e-12).all()
    assert profile.attention["math"].rate("backward", forward["flops"].max()) > 0


@pytest.mark.slow
def test_busbw_follows_nccl_tests_from_the_timed_algbw(calibration):
    comm = pd.read_csv(calibration / "collectives.csv")
    assert set(comm["op"]) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send"}
    assert (comm["n"] == 2).all()
    for row in comm.itertuples():
        assert row.algbw_Bps == pytest.approx(row.bytes / row.median_s)
        assert row.busbw_Bps == pytest.approx(row.algbw_Bps * bus_factor(row.op, row.n))


@pytest.mark.slow
def test_a_scenario_runs_on_the_profile_and_follows_its_numbers(calibration, tmp_path):
    before = runner.run(calibrated_tiny(calibration / "profile.json"))
    data = json.loads((calibration / "profile.json").read_text())
    for curve in data["gemm"].values():
        curve["rate"] = [[flops, rate * 4] for flops, rate in curve["rate"]]
    data["copy_bandwidth"] *= 4
    faster = tmp_path / "faster.json"
    faster.write_text(json.dumps(data))
    after = runner.run(calibrated_tiny(faster))

    def compute_s(result):
        rows = result.trace[result.trace["stream"] == "compute"]
        return float((rows["end_s"] - rows["start_s"]).sum())

    # Every kernel is max(FLOPs / GEMM rate, bytes / copy bandwidth): 4x both is exactly a quarter of the
    # compute, whatever this machine measured (a test on the step alone would depend on its load).
    assert compute_s(after) == pytest.approx(compute_s(before) / 4, rel=1e-9)
    assert after.summary.step_time_s < before.summary.step_time_s


@pytest.mark.slow
def test_a_profile_lacking_the_dtype_is_a_clear_error(calibration, tmp_path):
    data = json.loads((calibration / "profile.json").read_text())
    del data["gemm"]["bf16"]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="costs.profile: .* has no bf16 GEMM measurements"):
        calibrated_tiny(partial)
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ConfigError, match="is not a clustersim profile"):
        calibrated_tiny(tmp_path / "other.json")


@pytest.mark.slow
def test_numerics_report(calibration):
    rows = pd.read_csv(calibration / "numerics.csv")
    value = lambda dtype, check: float(  # noqa: E731
        rows[(rows["dtype"] == dtype) & rows["check"].str.startswith(check)]["value"].iloc[0])
    fp16_dot, bf16_dot = value("fp16", "dot product"), value("bf16", "dot product")
    assert 0 < fp16_dot < bf16_dot < 0.05  # bf16 keeps 8 mantissa bits, fp16 11
    assert value("fp16", "largest finite") == 65504 and value("fp16", "overflow") == float("inf")
    assert value("fp16", "underflow") == 0 and value("fp16", "smallest subnormal") == pytest.approx(2**-24)
    assert value("fp16", "gradient 1e-8 without") == 0  # vanishes
    assert value("fp16", "gradient 1e-8 with loss scale") == pytest.approx(1e-8, rel=1e-3)  # survives
    assert value("bf16", "gradient 1e-8 without") == pytest.approx(1e-8, rel=1e-2)  # fp32's range


def test_the_device_defaults_to_what_torch_sees_and_a_missing_one_is_one_line(monkeypatch):
    import torch

    assert resolve_device("cpu") == "cpu"
    assert resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^calibrate: --device cuda but torch sees no GPU \(use --device cpu\)"):
            resolve_device("cuda")
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(ConfigError, match=r"^calibrate: needs PyTorch: pip install 'clustersim\[calibrate\]'"):
        resolve_device("cpu")


@pytest.mark.gpu
def test_gpu_gemms_are_timed_with_cuda_events_against_the_dense_peak(tmp_path):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert main(["calibrate", "--device", "cuda", "--quick", "--no-collectives", "-o", str(tmp_path)]) == 0
    gemm = pd.read_csv(tmp_path / "gemm.csv")
    assert gemm["efficiency"].notna().all() and (gemm["efficiency"] > 0).all() and (gemm["efficiency"] <= 1).all()
    assert load(tmp_path / "profile.json").device.kind == "cuda"
