"""The input boundary (issue 27): every malformed input is one ``error: FIELD: RULE`` line and a non-zero exit, never a
traceback; results no GPU can produce are refused, not printed. One regression test per traceback class that the
seeded mutation run found (RecursionError in the loader and in ``--set``; TypeError/AttributeError in the link
defaults; UnicodeDecodeError; YAML parser/constructor errors in ``--set``; ZeroDivisionError from a zero peak), and
one per accepted-but-wrong case (zero fixed costs: MFU above 1; NaN/inf numbers; disagreeing batch fields)."""

from pathlib import Path

import pytest

from sim.cli import main
from sim.explore.sweep import parse_axis
from sim.spec.scenario import MAX_DEPTH

from conftest import ROOT, SCENARIOS

TINY = SCENARIOS / "tiny.yaml"


def one_error_line(capsys, *argv: str) -> str:
    """Run ``sim ARGV`` in process; assert a non-zero exit with exactly one ``error:`` line and no traceback."""
    capsys.readouterr()
    code = main([*argv])
    out, err = capsys.readouterr()
    assert code != 0, out
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_deeply_nested_yaml_is_refused_by_depth_not_recursion(tmp_path, capsys):
    deep = TINY.read_bytes() + b"\nextra: " + b"[" * 900 + b"]" * 900 + b"\n"
    line = one_error_line(capsys, "check", write(tmp_path / "deep.yaml", deep))
    assert line.endswith(f"nested deeper than {MAX_DEPTH} levels")


def test_deeply_nested_set_value_is_refused(capsys):
    line = one_error_line(capsys, "check", str(TINY), "--set", "parallel.tp=" + "[" * 900)
    assert line == f"error: --set parallel.tp: nested deeper than {MAX_DEPTH} levels"


def test_moderately_nested_values_are_still_reported_by_their_field(capsys):
    line = one_error_line(capsys, "check", str(TINY), "--set", "parallel.tp=" + "[" * 5 + "]" * 5)
    assert line.startswith("error: parallel.tp: ")


@pytest.mark.parametrize("value, field", [
    ("８", "cluster.gpus_per_node"),  # a non-ASCII digit (fullwidth eight)
    ("[1, 2]", "cluster.gpu"),
    ("5", "cluster.gpu"),
])
def test_wrongly_typed_cluster_fields_name_their_field(capsys, value, field):
    line = one_error_line(capsys, "check", str(TINY), "--set", f"{field}={value}", "--set", "network=contention")
    assert line.startswith(f"error: {field}: ")


def test_a_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    latin = TINY.read_text().replace("tiny-gpt", "tiny-gpt\xe9").encode("latin-1")
    line = one_error_line(capsys, "check", write(tmp_path / "latin.yaml", latin))
    assert "is not UTF-8 text (byte " in line and line.startswith("error: scenario: ")


def test_a_utf8_bom_is_accepted(tmp_path, capsys):
    path = write(tmp_path / "bom.yaml", b"\xef\xbb\xbf" + TINY.read_bytes())
    assert main(["check", path]) == 0


@pytest.mark.parametrize("value", ["{", "!!python/object/apply:os.system [ls]", "[1, 2"])
def test_set_values_that_are_not_safe_yaml_are_one_line(capsys, value):
    line = one_error_line(capsys, "check", str(TINY), "--set", f"schedule={value}")
    assert line.startswith("error: --set schedule: not valid YAML")


def test_a_zero_peak_is_refused_before_any_division(capsys):
    line = one_error_line(capsys, "check", str(TINY), "--set", "cluster.gpu.peak_flops.bf16=0")
    assert line == "error: cluster.gpu.peak_flops.bf16: Input should be greater than 0"


@pytest.mark.parametrize("setting, field", [
    ("variation.slowdown={0: .nan}", "variation.slowdown.0"),
    ("variation.slowdown={0: .inf}", "variation.slowdown.0"),
    ("training.seq_len=.nan", "training.seq_len"),
    ("cluster.gpu.matmul_efficiency=.nan", "cluster.gpu.matmul_efficiency"),
])
def test_nan_and_infinite_numbers_are_refused(capsys, setting, field):
    line = one_error_line(capsys, "check", str(TINY), "--set", setting)
    assert line.startswith(f"error: {field}: ")


def test_disagreeing_batch_fields_are_refused(capsys):
    # tiny: global_batch 8 = 8 micro-batches x dp 1 x micro_batch 1; 2 micro-batches describe another step.
    line = one_error_line(capsys, "check", str(TINY), "--set", "training.microbatches=2")
    assert line == ("error: training.microbatches: 2 disagrees with global_batch 8: global_batch = "
                    "microbatches*dp*micro_batch needs microbatches = 8")
    line = one_error_line(capsys, "check", str(TINY), "--set", "training.global_batch=1000",
                          "--set", "training.microbatches=2")
    assert line.startswith("error: training.microbatches: 2 disagrees with global_batch 1000")


def test_zero_fixed_costs_are_refused(capsys):
    line = one_error_line(capsys, "check", str(TINY), "--set", 'costs={model: fixed, forward: "0 s", backward: "0 s"}')
    assert line == "error: costs.forward: Input should be greater than 0 (and 1 more problem)"  # backward too


def test_fixed_costs_faster_than_the_peak_are_refused(tmp_path, capsys):
    line = one_error_line(capsys, "run", str(TINY), "-o", str(tmp_path / "o"), "--no-plot", "--set",
                          'costs={model: fixed, forward: "1 ns", backward: "1 ns"}', "--set", "network=ideal")
    assert line.startswith("error: costs.forward: the given layer times run the model's kernels at HFU ")


def test_a_long_name_is_refused_quickly_by_its_bound(tmp_path, capsys):
    text = TINY.read_text().replace("name: tiny\n", "name: " + "x" * 100_000 + "\n")
    line = one_error_line(capsys, "check", write(tmp_path / "long.yaml", text.encode()))
    assert line == "error: name: String should have at most 200 characters"


def test_a_key_with_a_newline_stays_on_one_line(tmp_path, capsys):
    text = TINY.read_text() + '"bad\\nkey": 1\n'
    line = one_error_line(capsys, "check", write(tmp_path / "newline.yaml", text.encode()))
    assert line == "error: 'bad\\nkey': unknown key"


def test_a_directory_given_as_scenario_says_so(capsys):
    line = one_error_line(capsys, "check", str(SCENARIOS))
    assert line == f"error: scenario: {str(SCENARIOS)!r} is a directory, not a file"


@pytest.mark.parametrize("profile, rule", [("/", "cannot read '/'"), ("/dev/zero", "is larger than 16 MiB")])
def test_a_profile_path_that_is_not_a_profile_names_the_field(capsys, profile, rule):
    line = one_error_line(capsys, "check", str(TINY), "--set", f"costs={{model: calibrated, profile: {profile}}}")
    assert line.startswith("error: costs.profile: ") and rule in line


@pytest.mark.parametrize("attention, rule", [
    ({"Flash": {"forward": [[1e9, 1e14]], "backward": [[1e9, 1e14]]}}, "attention.Flash.[key]: Input should be"),
    ({"flash": {"forward": [], "backward": [[1e9, 1e14]]}}, "attention.flash.forward: Tuple should have at least 1"),
    ({"fused": {"forward": [[1e9, 0.0]], "backward": [[1e9, 1e14]]}}, "attention.fused.forward.0.1: Input should be "
                                                                       "greater than 0"),
])
def test_a_profiles_attention_curves_are_checked(tmp_path, capsys, attention, rule):
    """A misspelt backend was ignored (its kernel priced on the GEMM curve without a word), and an empty curve
    read 1 FLOP/s: a 1 TFLOP forward priced at 6.6e11 s on an H100."""
    import json

    data = json.loads((ROOT / "sim" / "data" / "profiles" / "H100.json").read_text()) | {"attention": attention}
    path = write(tmp_path / "profile.json", json.dumps(data).encode())
    line = one_error_line(capsys, "check", str(TINY), "--set", f"costs={{model: calibrated, profile: {path}}}")
    assert line.startswith("error: costs.profile: ") and rule in line


def test_rich_markup_in_a_name_or_path_is_printed_as_text(tmp_path, capsys):
    out = tmp_path / "o[/x]"
    assert main(["run", str(TINY), "-o", str(out), "--no-plot", "--set", 'name="[/oops]"']) == 0
    printed = capsys.readouterr().out.replace("\n", "")  # a narrow console wraps the long path
    assert printed.startswith("[/oops]: ") and f"wrote {out}/" in printed


def test_bundled_scenarios_stay_clean(capsys):
    for path in sorted(ROOT.glob("scenarios/*.yaml")):
        assert main(["check", str(path)]) == 0, path


def test_a_rerun_into_the_same_directory_leaves_no_file_of_the_earlier_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(TINY), "-o", str(out), "--no-plot"]) == 0
    (out / "notes.txt").write_text("mine")  # a file sim run did not write is kept
    assert main(["run", str(TINY), "-o", str(out), "--no-plot", "--format", "csv"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "scenario.resolved.yaml", "summary.json",
                                                     "trace.csv"]


def test_an_output_path_that_is_a_file_is_refused_before_the_run(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    line = one_error_line(capsys, "run", str(TINY), "-o", str(target))
    assert line == f"error: -o: {str(target)!r} is a file, not a directory"


def test_a_scenario_larger_than_the_bound_is_refused_unread(tmp_path, capsys):
    big = TINY.read_text() + "# " + "x" * 300_000 + "\n"
    path = write(tmp_path / "big.yaml", big.encode())
    line = one_error_line(capsys, "check", path)
    assert line == f"error: scenario: {path!r} is larger than 256 KiB"


def test_a_grid_axis_written_as_a_yaml_list_is_that_axis(tmp_path, capsys):
    """``--grid 'parallel.tp=[1,2]'`` was a YAML traceback (the list was split at its comma); now it is the axis."""
    assert parse_axis("parallel.tp=[1,2]") == ("parallel.tp", [1, 2])
    assert parse_axis("schedule=[1f1b, gpipe]") == ("schedule", ["1f1b", "gpipe"])
    assert main(["sweep", str(TINY), "--grid", "training.microbatches=[2,4]", "-o", str(tmp_path / "s"),
                 "--no-plot"]) == 0
    assert "2 points: 2 ok" in capsys.readouterr().out
    line = one_error_line(capsys, "sweep", str(TINY), "--grid", "parallel.tp=[1,2", "-o", str(tmp_path / "t"))
    assert line.startswith("error: --grid parallel.tp: not valid YAML")
    line = one_error_line(capsys, "sweep", str(TINY), "--grid", "parallel.tp=[]", "-o", str(tmp_path / "u"))
    assert line == "error: --grid parallel.tp: expected a non-empty list of values, e.g. [1, 2]"


def test_rich_markup_in_a_sweep_directory_is_printed_as_text(tmp_path, capsys):
    out = tmp_path / "o[/x]"
    for _ in range(2):  # the second run prints the resuming line with the path too
        assert main(["sweep", str(TINY), "--grid", "training.microbatches=1,2", "-o", str(out), "--no-plot"]) == 0
    printed = capsys.readouterr().out.replace("\n", "")
    assert f"wrote {out}/" in printed and f"already in {out}/results.csv" in printed


def test_an_infinite_step_from_extreme_gpu_fields_is_one_line_and_no_summary(tmp_path, capsys):
    """Overriding GPU fields could give ``step_time_s: inf`` with exit 0; now the result is refused, unwritten."""
    line = one_error_line(capsys, "run", str(TINY), "-o", str(tmp_path), "--no-plot", "--set",
                          "cluster.gpu.hbm_bandwidth=1e-300 B/s")
    assert line.startswith("error: result: step time inf s is not a finite positive time")
    assert not (tmp_path / "summary.json").exists()


def test_an_empty_or_huge_grid_and_a_top_below_one_are_one_line_errors(tmp_path, capsys):
    """A reversed range (64..1) was an empty axis and a sweep of 0 points, exit 0; a huge one (1..100000000) was
    built as a list of 10^8 values before anything ran (sim search --only tp=1..10000000: 15 s and 0.9 GB; 10^8: a
    hang) and a grid's product likewise; sim search --top 0 said no layout fits, --top -5 ran (found in review9)."""
    line = one_error_line(capsys, "sweep", str(TINY), "--grid", "parallel.tp=64..1", "-o", str(tmp_path / "a"))
    assert line == "error: --grid 'parallel.tp=64..1': a range a..b needs a <= b"
    line = one_error_line(capsys, "sweep", str(TINY), "--grid", "parallel.tp=1..100000000", "-o", str(tmp_path / "b"))
    assert line == ("error: --grid 'parallel.tp=1..100000000': 100,000,000 values, over the 100,000 points a sweep "
                    "runs")
    line = one_error_line(capsys, "sweep", str(TINY), "--grid", "training.micro_batch=1..1000", "--grid",
                          "training.global_batch=1..1000", "-o", str(tmp_path / "c"))
    assert line == ("error: --grid: 1,000,000 points (1,000 x 1,000), over the 100,000 points a sweep runs; narrow "
                    "an axis")
    line = one_error_line(capsys, "search", str(TINY), "--only", "tp=1..100000000", "-o", str(tmp_path / "d"))
    assert line.startswith("error: --only 'tp=1..100000000': 100,000,000 values, over the 100,000")
    for top in ("0", "-5"):
        line = one_error_line(capsys, "search", str(TINY), "--top", top, "-o", str(tmp_path / "e"))
        assert line == f"error: --top: {top} layouts; simulate at least 1"
