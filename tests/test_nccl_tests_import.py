"""``sim calibrate --from-nccl-tests``: nccl-tests stdout -> a profile's link tiers (sim.calibrate.nccl_tests_log
parses, sim.calibrate.nccl_tests_fit fits).

The logs in tests/data/nccl_tests/ are real runs (sources in its README.md); the fitted plateau busbw and
latency are held against each file's own numbers.
"""

import json

import pytest

from sim import runner
from sim.calibrate.nccl_tests_fit import import_logs, tier_of
from sim.calibrate.nccl_tests_log import NcclTestsError, parse
from sim.cli.commands import main
from sim.costs.profile import Profile, default_for, load
from sim.hardware.links import interpolate_log2
from sim.hardware.nodes import NODE_PRESETS
from sim.network.collectives import ring_time
from sim.plan import resolve
from sim.spec.scenario import load_scenario

from conftest import DATA, SCENARIOS

LOGS = DATA / "nccl_tests"
GB200 = LOGS / "gb200_nvl72_all_reduce_perf.log"
HGX = LOGS / "hgx_2host_all_reduce_perf.log"
GB10 = LOGS / "gb10_2host_all_reduce_perf.log"


def test_a_log_gives_its_ranks_hosts_gpu_rows_and_average():
    log = parse(GB200)
    assert (log.test, log.op, log.n, len(log.hosts), log.gpu) == (
        "all_reduce_perf", "all_reduce", 72, 18, "NVIDIA Graphics Device")
    assert [r.nbytes for r in log.rows] == [2 ** e for e in range(29, 34)]
    four_gib = log.rows[3]
    assert four_gib.seconds == pytest.approx({"out-of-place": 10094e-6, "in-place": 10141e-6})
    assert four_gib.busbw == pytest.approx({"out-of-place": 839.16e9, "in-place": 835.32e9})
    assert log.avg_busbw == pytest.approx(745.53e9)
    # nccl-tests' busbw is algbw x 2(n-1)/n for all-reduce (doc/PERFORMANCE.md): the file agrees with itself
    assert four_gib.algbw["out-of-place"] * 2 * 71 / 72 == pytest.approx(four_gib.busbw["out-of-place"], rel=1e-3)
    newer = parse(GB10)  # v2.17+ header: '# nccl-tests version' and '# Collective test starting'
    assert (newer.test, newer.n, newer.hosts, newer.gpu) == ("all_reduce_perf", 2, ("host-a", "host-b"), "NVIDIA GB10")


# The layout nccl-tests printed before v2.13 (src/all_gather.cu print_header and src/common.cu at 51af557^):
# rank lines without 'Group', no 'root' column (and no 'redop' for all-gather), an 'error' column; rows are
# NVIDIA/nccl issue #1435's all_gather_perf -g 2 run (bfloat16, 16 and 32 MiB), laid out that way.
OLD_FORMAT = """\
# nThread 1 nGpus 2 minBytes 16777216 maxBytes 33554432 step: 16777216(bytes) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  12345 on      node1 device  0 [0x18] NVIDIA H100 80GB HBM3
#   Rank  1 Pid  12345 on      node1 device  1 [0x2a] NVIDIA H100 80GB HBM3
#
#                                             out-of-place                       in-place
#       size         count      type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
    16777216       4194304  bfloat16    108.8  154.20   77.10  0e+00    98.19  170.86   85.43  0e+00
    33554432       8388608  bfloat16    183.0  183.33   91.66  0e+00    156.1  214.95  107.48  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 90.42
"""


def test_the_layout_before_v2_13_parses_by_its_header():
    log = parse("all_gather_perf.txt", OLD_FORMAT)  # the test named by the file name (no 'starting' line)
    assert (log.op, log.n, log.hosts) == ("all_gather", 2, ("node1",))
    assert [(r.nbytes, r.dtype, r.seconds["in-place"]) for r in log.rows] == [
        (16777216, "bfloat16", pytest.approx(98.19e-6)), (33554432, "bfloat16", pytest.approx(156.1e-6))]
    assert log.measurements()[1].seconds == pytest.approx(183.0e-6)


def test_one_nvlink_domain_over_many_hosts_fits_the_nvlink_tier_to_the_files_plateau():
    """GB200 NVL72: 72 ranks on 18 hosts are one NVLink domain (the node preset's), so the tier is NVLink; the
    fitted plateau is the file's largest busbw (839.16 GB/s at 4 GiB) within 1%, and the fitted tier gives the
    file's own 4 GiB time back through the ring closed form."""
    node = NODE_PRESETS["gb200-nvl72"]
    result = import_logs([GB200], default_for("GB200"), node)
    (tier,) = result.tiers
    assert tier.tier == "intra_node" and tier.plateau_fitted and not tier.latency_fitted  # no message <= 64 KiB
    assert tier.plateau_busbw == pytest.approx(839.16e9, rel=0.01)
    link = result.profile.link("intra_node", node.intra_node)
    assert (link.base_latency, link.latency) == (node.intra_node.base_latency, node.intra_node.latency)
    for nbytes, seconds in ((2 ** 32, 10094e-6), (2 ** 33, 20299e-6), (2 ** 29, 1806.7e-6)):
        model = link.base_latency + ring_time("all_reduce", nbytes, 72, link.latency, link.bandwidth_at(nbytes))
        assert model == pytest.approx(seconds, rel=0.03)
    in_place = import_logs([GB200], default_for("GB200"), node, placement="in-place").tiers[0]
    assert in_place.measured_busbw == pytest.approx(846.82e9) and in_place.plateau_busbw == pytest.approx(
        846.82e9, rel=0.01)


def test_two_hosts_fit_the_nic_tier_over_the_nodes_nics():
    """16 ranks on 2 hosts: the NIC tier; line rate = 8 NICs x 50 GB/s (dgx-h100), plateau busbw = the file's
    largest (44.41 GB/s) within 1%, so the efficiency is that / 400 GB/s."""
    result = import_logs([HGX], default_for("H100-SXM"), NODE_PRESETS["dgx-h100"])
    (tier,) = result.tiers
    assert tier.tier == "inter_node" and tier.line_rate == 400e9 and tier.hosts == 2
    assert tier.plateau_busbw == pytest.approx(44.41e9, rel=0.01)
    fields = result.profile.inter_node
    assert fields is not None and fields["bandwidth"] == 50e9
    assert fields["efficiency"] == pytest.approx(44.41 / 400, rel=0.01)
    assert result.profile.gemm == default_for("H100-SXM").gemm  # the GEMM curves are the base profile's


def test_small_messages_fit_the_latency_and_keep_the_plateau():
    """DGX Spark's four 8-64 KiB rows are latency: one op, one group size, so alpha stays the base tier's and the
    base latency is the least-squares one, base + 2 alpha = the mean of the four times less their bytes at the
    plateau rate (S for a 2-rank all-reduce, at 0.9 x 25 GB/s; closed form); the plateau they cannot see stays
    the base's."""
    base = Profile.model_validate({**default_for("B200").model_dump(), "inter_node": {
        "bandwidth": 25e9, "latency": 6.6e-6, "base_latency": 20e-6, "efficiency": 0.9}})
    (tier,) = import_logs([GB10], base).tiers
    assert tier.tier == "inter_node" and tier.latency_fitted and not tier.plateau_fitted
    mean = sum(t * 1e-6 - 2 ** k / (0.9 * 25e9) for t, k in ((35.15, 13), (31.67, 14), (39.56, 15), (67.93, 16))) / 4
    assert tier.fit.base_latency + 2 * tier.fit.latency == pytest.approx(mean)
    assert (tier.fit.latency, tier.fit.efficiency) == (6.6e-6, 0.9)


def test_cli_writes_a_profile_the_scenario_runs_with(tmp_path, capsys):
    out = tmp_path / "cal"
    assert main(["calibrate", "--from-nccl-tests", str(HGX), "--node", "dgx-h100", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "inter_node" in printed and "44.41 GB/s" in printed
    profile = load(out / "profile.json")
    assert profile.inter_node is not None and "hgx_2host_all_reduce_perf.log" in profile.source
    # a second import merges: the NVLink tier joins, the NIC tier stays
    assert main(["calibrate", "--from-nccl-tests", str(GB200), "--node", "gb200-nvl72", "-o", str(out)]) == 0
    merged = json.loads((out / "profile.json").read_text())
    assert merged["inter_node"] == profile.inter_node and merged["intra_node"]["bandwidth"] == 900e9
    scenario = load_scenario(SCENARIOS / "llama2-7b_h100-16_fsdp.yaml",
                             ["costs.model=calibrated", f"costs.profile={out / 'profile.json'}"])
    topology = runner.build_topology(resolve(scenario))
    assert topology.inter_node.efficiency == pytest.approx(profile.inter_node["efficiency"])
    assert topology.inter_node.bandwidth_at(2 ** 34) == pytest.approx(
        50e9 * profile.inter_node["efficiency"] * interpolate_log2(
            tuple(map(tuple, profile.inter_node["efficiency_curve"])), 2 ** 34))


@pytest.mark.parametrize(("text", "message"), [
    ("", "no result rows"),
    ("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
     "  1024  256  float  sum  -1  12.5  0.08  0.15  0  12.1  0.08  0.16  0\n", "no '#  Rank N"),
    ("#  Rank  0 Group  0 Pid 1 on h device  0 [0x00] NVIDIA H100 80GB HBM3\n"
     "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
     "  1024  256  float  sum  -1  12.5  0.08  0.15  0  nan  0.08  0.16  0\n", ":3: not a number"),
    ("#  Rank  0 Group  0 Pid 1 on h device  0 [0x00] NVIDIA H100 80GB HBM3\n"
     "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
     "  1024  256  float  sum  -1  12.5  0.08\n", ":3: expected at least 12 columns"),
])
def test_a_bad_file_is_one_line_naming_file_and_line(text, message):
    with pytest.raises(NcclTestsError, match=message) as error:
        parse("all_reduce_perf.log", text)
    assert "\n" not in str(error.value) and str(error.value).startswith("all_reduce_perf.log")


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    unnamed = tmp_path / "run1.txt"
    unnamed.write_text(GB10.read_text().replace("# Collective test starting: all_reduce_perf\n", ""))
    assert main(["calibrate", "--from-nccl-tests", str(unnamed), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "run1.txt" in err and "cannot tell which nccl-tests binary" in err
    assert main(["calibrate", "--from-nccl-tests", str(GB200), "-o", str(tmp_path / "o")]) == 2
    assert "--base PROFILE" in capsys.readouterr().err  # no GPU preset named, no node given
    assert main(["calibrate", "--from-nccl-tests", str(GB200), "--base", str(GB10), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --base:") and "is not JSON" in err


def _log(test: str, n: int, times: list[tuple[int, float]], hosts: int = 1) -> str:
    """An nccl-tests v2.13+ output (src/util.cu's layout) of ``times`` (bytes, seconds), busbw by the nccl-tests
    factor (doc/PERFORMANCE.md)."""
    from sim.calibrate.nccl_tests_log import TESTS
    from sim.network.collectives import bus_factor

    op = TESTS[test]
    lines = ["# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {'node' + str(r * hosts // n):>10s} device {r % 8:2d} "
              f"[0000:{r:02x}:00] NVIDIA H100 80GB HBM3" for r in range(n)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
              "algbw   busbw #wrong"]
    for nbytes, seconds in times:
        algbw = nbytes / seconds / 1e9
        busbw = algbw * bus_factor(op, 2 if op == "send" else n)
        cell = f"{seconds * 1e6:9.3f}  {algbw:8.3f}  {busbw:8.3f}       0"
        lines.append(f"{nbytes:12d}  {nbytes // 4:12d}     float     sum      -1  {cell}  {cell}")
    return "\n".join(lines) + "\n# Avg bus bandwidth    : 1.0\n"


def test_a_closed_form_round_trip_recovers_latency_alpha_and_plateau(tmp_path):
    """All-reduce and all-gather on one node of 8, timed by the ring closed form of a known tier (base 20 us,
    alpha 1.5 us, plateau 80% of 450 GB/s, flat): two step counts (14 and 7) separate base from alpha, and the
    fit gives all three back (to the 1 ns the times are printed with), and a flat curve."""
    base, alpha, rate = 20e-6, 1.5e-6, 0.8 * 450e9
    paths = []
    for test, op in (("all_reduce_perf", "all_reduce"), ("all_gather_perf", "all_gather")):
        times = [(2 ** e, base + ring_time(op, 2 ** e, 8, alpha, rate)) for e in range(10, 31)]
        path = tmp_path / f"{test}.log"
        path.write_text(_log(test, 8, times))
        paths.append(path)
    (tier,) = import_logs(paths, default_for("H100-SXM"), NODE_PRESETS["dgx-h100"]).tiers
    assert tier.tier == "intra_node" and tier.latency_fitted and tier.plateau_fitted
    assert tier.fit.base_latency == pytest.approx(base, rel=1e-4) and tier.fit.latency == pytest.approx(alpha, rel=1e-4)
    assert tier.fit.efficiency == pytest.approx(0.8, rel=1e-4)
    assert all(fraction == pytest.approx(1.0, abs=1e-4) for _, fraction in tier.fit.curve)


def test_the_tier_each_run_describes(tmp_path):
    node = NODE_PRESETS["dgx-h100"]
    one = [(2 ** 20, 1e-4)]
    cases = {"alltoall_perf": (8, 1, "all_to_all"), "all_reduce_perf": (16, 2, "inter_node"),
             "sendrecv_perf": (8, 1, "intra_node"), "reduce_scatter_perf": (8, 1, "intra_node")}
    for test, (n, hosts, expected) in cases.items():
        log = parse(f"{test}.log", _log(test, n, one, hosts))
        assert tier_of(log, node, nvls=False) == expected, test
    reduce = parse("all_reduce_perf.log", _log("all_reduce_perf", 8, one))
    assert (tier_of(reduce, node, nvls=True), tier_of(reduce, node, nvls=False)) == ("nvls", "intra_node")
    across = parse("alltoall_perf.log", _log("alltoall_perf", 16, one, 2))
    assert tier_of(across, node, nvls=False) is None  # not fitted: the model's all-to-all mixes both tiers
    result = import_logs([across], default_for("H100-SXM"), node)
    assert result.tiers == [] and "all-to-all across 2 hosts" in result.skipped[0]


def test_the_runner_takes_a_profiles_nvls_and_all_to_all_tiers(tmp_path):
    """A profile's nvls and all_to_all tiers (what an NVLS all-reduce or an alltoall_perf run fits) replace the
    node preset's in the topology a calibrated run builds; the other tiers stay the preset's."""
    fields = {"nvls": {"efficiency": 0.5, "latency": 3e-6}, "all_to_all": {"efficiency": 0.6, "base_latency": 1e-5}}
    path = tmp_path / "profile.json"
    path.write_text(Profile.model_validate({**default_for("H100-SXM").model_dump(), **fields}).model_dump_json())
    scenario = load_scenario(SCENARIOS / "llama2-7b_h100-8_dp.yaml",
                             ["costs.model=calibrated", f"costs.profile={path}"])
    topology = runner.build_topology(resolve(scenario))
    node = NODE_PRESETS["dgx-h100"]
    assert topology.nvls is not None and (topology.nvls.efficiency, topology.nvls.latency) == (0.5, 3e-6)
    assert topology.nvls.bandwidth == node.nvls.bandwidth
    assert topology.all_to_all_link.efficiency == 0.6 and topology.all_to_all_link.base_latency == 1e-5
    assert topology.intra_node.efficiency == node.intra_node.efficiency


def test_the_issues_spelling_import_nccl_tests_is_the_same_command(tmp_path, capsys):
    """``sim calibrate import-nccl-tests LOG...`` (issue 26's spelling) writes the profile --from-nccl-tests does;
    any other word there is one line naming what is expected."""
    flag, word = tmp_path / "flag", tmp_path / "word"
    assert main(["calibrate", "--from-nccl-tests", str(HGX), "--node", "dgx-h100", "-o", str(flag)]) == 0
    assert main(["calibrate", "import-nccl-tests", str(HGX), "--node", "dgx-h100", "-o", str(word)]) == 0
    assert (word / "profile.json").read_text() == (flag / "profile.json").read_text()
    capsys.readouterr()
    assert main(["calibrate", "import-nccl", str(HGX), "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().startswith(
        "error: calibrate: 'import-nccl " + str(HGX) + "': expected import-nccl-tests LOG...")
