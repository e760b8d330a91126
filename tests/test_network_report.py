"""Predicted busbw against published H100 measurements (analysis.network_report), and the shipped fit."""

import subprocess
import sys
from pathlib import Path

import pytest

from analysis.network_report import median_abs_error, report, to_markdown

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table():
    return report()


def test_one_node_h100_busbw_within_15_percent_median_from_16_mib(table):
    one_node = table[(table["nodes"] == 1) & (table["gpus"] == 8)]
    assert set(one_node["op"]) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert one_node["bytes"].min() == 2**20 and one_node["bytes"].max() == 2**30
    assert median_abs_error(table) < 0.15
    # Every collective on its own, not just pooled.
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        rows = one_node[(one_node["op"] == op) & (one_node["bytes"] >= 16 * 2**20)]
        assert rows["error"].abs().median() < 0.15, op


def test_small_groups_inside_a_node_within_15_percent_median(table):
    for gpus in (2, 4):
        assert median_abs_error(table, gpus=gpus) < 0.15, gpus


def test_busbw_follows_the_nccl_tests_convention(table):
    row = table[(table["op"] == "all_reduce") & (table["nodes"] == 1) & (table["gpus"] == 8)].iloc[-1]
    assert row["measured_busbw_GBps"] == pytest.approx(row["bytes"] / row["seconds"] * 2 * 7 / 8 / 1e9)


def test_two_node_rows_are_reported_with_their_errors(table):
    two = table[table["nodes"] == 2]
    assert len(two) >= 10 and two["error"].notna().all()
    assert "| nccl-tests #290" in to_markdown(table)


def test_shipped_presets_are_a_fresh_fit_of_the_shipped_rows():
    done = subprocess.run([sys.executable, "scripts/fit_network_defaults.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
