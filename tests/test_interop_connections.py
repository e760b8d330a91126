"""CUDA_DEVICE_MAX_CONNECTIONS through the interop layer: `sim search --emit megatron` exports the value the scenario
was priced at (sim.spec.parallel.cuda_device_max_connections, the rule the Plan reads too), and `sim import megatron`
/ `sim import nemo` read it back from the launch's environment into ``parallel.cuda_device_max_connections``.

Megatron-LM reads the variable from the environment, never from a flag (megatron/training/arguments.py at d98e8a64dd
asserts "1" under tensor or context parallelism before Blackwell; Megatron-Core's MoE README asks for more than 1
under the EP A2A overlap); NeMo-Framework-Launcher exports its config's ``env_vars`` into the job
(nemo_launcher/core/stages.py ``get_env_vars``). docs/mechanisms/a2a_overlap.md, last section.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.cli.commands import main
from sim.errors import ConfigError
from sim.interop.draft import Draft, Options
from sim.interop.emit import emit
from sim.interop.megatron import import_megatron
from sim.interop.megatron_args import read_script
from sim.interop.nemo import import_nemo
from sim.plan import resolve
from sim.spec.parallel import cuda_device_max_connections
from sim.spec.scenario import Scenario, load_scenario, scenario_from_dict

from conftest import DATA, SCENARIOS

TINY = SCENARIOS / "tiny.yaml"
QWEN3_OVERLAP = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-ep32-overlap.yaml"
EXPORT = "export CUDA_DEVICE_MAX_CONNECTIONS="
# A small Megatron-LM command line (one node of 8 GPUs), tp 2 so the queues order its TP collectives.
FLAGS = ("--tensor-model-parallel-size 2 --sequence-parallel --num-layers 4 --hidden-size 256 "
         "--num-attention-heads 8 --seq-length 128 --max-position-embeddings 128 --vocab-size 1024 --bf16 "
         "--micro-batch-size 1 --global-batch-size 8")


def _row(draft: Draft, source: str) -> tuple[str, str, str]:
    row = next(row for row in draft.rows if row.source == source)
    return row.value, row.status, row.target


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("path", "overrides", "queues"), [
    (TINY, [], 1),  # tp 2, no overlap: Megatron-LM's one queue
    (TINY, ["parallel.cuda_device_max_connections=8"], 8),
    (QWEN3_OVERLAP, [], 32),  # moe.a2a_overlap: the MoE ModelZoo's 32
    (QWEN3_OVERLAP, ["moe.a2a_overlap=false"], 1),
    (QWEN3_OVERLAP, ["parallel.cuda_device_max_connections=4"], 4),
])
def test_the_spec_rule_is_the_plans(path: Path, overrides: list[str], queues: int) -> None:
    """One rule, one place: the Plan's value is the spec function's on every branch (field given, the overlap's
    default, the plain default)."""
    scenario = load_scenario(path, overrides)
    assert cuda_device_max_connections(scenario) == queues
    assert resolve(scenario).cuda_device_max_connections == queues


def test_the_overlap_alone_decides_because_the_rules_imply_a_moe_model_with_ep() -> None:
    """The Plan's older rule read ``moe.a2a_overlap and model.is_moe``; the spec function reads the knob alone. The
    rules make them equal: the overlap on a dense model (a non-default ``moe`` section) and at ep 1 are refused."""
    dense = yaml.safe_load(TINY.read_text())
    dense["moe"] = {"a2a_overlap": True}
    with pytest.raises(ConfigError, match=r"^moe: the token-dispatch settings need a MoE model"):
        scenario_from_dict(dense)
    with pytest.raises(ConfigError, match=r"^moe\.a2a_overlap: needs expert parallelism"):
        load_scenario(QWEN3_OVERLAP, ["parallel.ep=1"])


@pytest.mark.parametrize(("path", "overrides", "gpu", "queues"), [
    (TINY, [], "A100-80GB-SXM", 1),
    (QWEN3_OVERLAP, [], "H100-SXM", 32),
    (TINY, ["parallel.cuda_device_max_connections=8"], "A100-80GB-SXM", 8),
    (QWEN3_OVERLAP, ["parallel.cuda_device_max_connections=8"], "H100-SXM", 8),
])
def test_emit_then_import_gives_the_queues_back(path: Path, overrides: list[str], gpu: str, queues: int,
                                                tmp_path: Path) -> None:
    """scenario -> `sim search --emit megatron` -> `sim import megatron`: the script exports the value the scenario
    was priced at, once, before the launch, and the import maps it (mapped, named by the variable) to the same
    field value; the imported scenario prices the same queues and keeps the overlap."""
    scenario = load_scenario(path, overrides)
    text = emit(scenario, "megatron").text
    exports = [line for line in text.splitlines() if line.startswith(EXPORT)]
    assert exports == [f"{EXPORT}{queues}"]
    assert text.index(EXPORT) < text.index("torchrun ")
    draft = import_megatron([str(_script(tmp_path, text))], Options(gpu=gpu))
    back: Scenario = draft.scenario()
    assert back.parallel.cuda_device_max_connections == queues
    assert cuda_device_max_connections(back) == cuda_device_max_connections(scenario) == queues
    assert back.moe.a2a_overlap == scenario.moe.a2a_overlap
    assert _row(draft, "CUDA_DEVICE_MAX_CONNECTIONS") == (str(queues), "mapped",
                                                          f"parallel.cuda_device_max_connections = {queues}")


def test_one_queue_with_the_ep_a2a_overlap_is_refused_in_one_line(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A script exporting CUDA_DEVICE_MAX_CONNECTIONS=1 beside --overlap-moe-expert-parallel-comm (the MoE ModelZoo's
    Qwen3 yaml keeps 1 and comments out the 32 "Used for 1F1B overlap"): `sim import megatron` refuses it with
    `sim check`'s line for the same scenario, blamed on the variable, and writes nothing."""
    text = emit(load_scenario(QWEN3_OVERLAP), "megatron").text.replace(f"{EXPORT}32", f"{EXPORT}1")
    assert "--overlap-moe-expert-parallel-comm" in text
    out = tmp_path / "imported.yaml"
    assert main(["import", "megatron", str(_script(tmp_path, text)), "--gpu", "H100-SXM", "-o", str(out)]) != 0
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and not out.exists()
    rule = ("error: parallel.cuda_device_max_connections: moe.a2a_overlap needs more than 1 hardware queue "
            "(Megatron-Core's requirement; at 1 kernels launch in issue order, which is not modelled)")
    assert error == rule + " (set by CUDA_DEVICE_MAX_CONNECTIONS)"
    # the same scenario written by hand: `sim check` gives the rule's line
    doc = yaml.safe_load(QWEN3_OVERLAP.read_text())
    doc["parallel"]["cuda_device_max_connections"] = 1
    scenario = tmp_path / "one-queue.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    assert main(["check", str(scenario)]) != 0
    assert capsys.readouterr().err.strip() == rule


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "eight", "''", "1e1"])
def test_a_value_that_is_not_a_positive_whole_number_is_refused(value: str, tmp_path: Path) -> None:
    path = _script(tmp_path, f"export CUDA_DEVICE_MAX_CONNECTIONS={value}\ntorchrun pretrain_gpt.py {FLAGS}\n")
    with pytest.raises(ConfigError) as error:
        import_megatron([str(path)], Options(gpu="H100-SXM", gpus=8))
    message = str(error.value)
    assert message.startswith("CUDA_DEVICE_MAX_CONNECTIONS: ") and "not a positive whole number" in message
    assert "\n" not in message


def test_the_environment_is_what_bash_hands_the_launch(tmp_path: Path) -> None:
    """Only what the launched process sees counts: an exported variable (``export NAME=v``, or ``NAME=v`` then
    ``export NAME``), one set before the command on its line (whose command is still read: that line used to be
    dropped as an assignment), the last value set before the launch; a variable the script does not export is
    reported as ignored and leaves the field unset (the simulator's 1)."""
    prefixed = read_script(f"CUDA_DEVICE_MAX_CONNECTIONS=8 NCCL_DEBUG=WARN torchrun pretrain_gpt.py {FLAGS}\n")
    assert prefixed.environment == {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_DEBUG": "WARN"}
    assert prefixed.tokens[:4] == ["torchrun", "pretrain_gpt.py", "--tensor-model-parallel-size", "2"]
    later = read_script("Q=4\nCUDA_DEVICE_MAX_CONNECTIONS=$Q\nexport CUDA_DEVICE_MAX_CONNECTIONS\n"
                        "CUDA_DEVICE_MAX_CONNECTIONS=16\nQUIET=1\n")
    assert later.environment == {"CUDA_DEVICE_MAX_CONNECTIONS": "16"}
    assert later.variables == {"Q": "4", "CUDA_DEVICE_MAX_CONNECTIONS": "16", "QUIET": "1"}
    assert read_script('export A=1 B="x y" # note\n').environment == {"A": "1", "B": "x y"}

    draft = import_megatron([str(_script(tmp_path, f"CUDA_DEVICE_MAX_CONNECTIONS=8 torchrun pretrain_gpt.py "
                                                   f"{FLAGS}\n"))], Options(gpu="H100-SXM", gpus=8))
    s = draft.scenario()
    assert (s.parallel.tp, s.parallel.cuda_device_max_connections) == (2, 8)
    draft = import_megatron([str(_script(tmp_path, "CUDA_DEVICE_MAX_CONNECTIONS=8\nexport NCCL_IB_TIMEOUT=19\n"
                                                   f"torchrun pretrain_gpt.py {FLAGS}\n"))],
                            Options(gpu="H100-SXM", gpus=8))
    s = draft.scenario()
    assert s.parallel.cuda_device_max_connections is None and cuda_device_max_connections(s) == 1
    assert _row(draft, "CUDA_DEVICE_MAX_CONNECTIONS")[:2] == ("8", "ignored")
    assert _row(draft, "NCCL_IB_TIMEOUT") == ("19", "unknown", "")
    # an argument list has no environment: the field stays unset
    assert import_megatron(FLAGS.split(), Options(gpu="H100-SXM", gpus=8)).scenario() \
        .parallel.cuda_device_max_connections is None


@pytest.mark.parametrize(("script", "options"), [
    ("megatron_train_gpt3_175b_distributed.sh",  # export CUDA_DEVICE_MAX_CONNECTIONS=1
     Options(gpu="A100-80GB-SXM", nodes=128, model="gpt3-175b")),
    ("megatron_train_llama3_8b_h100_fp8.sh", Options(gpu="H100-SXM")),  # ...=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
    ("megatron_train_mixtral_8x7b_distributed.sh", Options(gpu="H100-SXM", nodes=8, model="mixtral-8x7b")),
])
def test_megatron_lms_examples_export_one_queue(script: str, options: Options) -> None:
    """Megatron-LM's own example scripts (tests/data/ecosystem/, copied unchanged) each export 1."""
    draft = import_megatron([str(DATA / "ecosystem" / script)], options)
    assert _row(draft, "CUDA_DEVICE_MAX_CONNECTIONS") == ("1", "mapped", "parallel.cuda_device_max_connections = 1")
    assert draft.data["parallel"]["cuda_device_max_connections"] == 1


@pytest.mark.parametrize(("value", "queues"), [(32, 32), ("1", 1), (None, None)])
def test_nemo_env_vars_set_the_queues(value: int | str | None, queues: int | None, tmp_path: Path) -> None:
    """A NeMo-Framework-Launcher training config's ``env_vars`` (exported into the job): its
    CUDA_DEVICE_MAX_CONNECTIONS maps to the field, reported under its key; absent (or null: the launcher drops
    nulls), the field stays unset; a bad value is refused in one line naming the key."""
    config = yaml.safe_load((DATA / "ecosystem" / "nemo_llama2_7b.yaml").read_text())
    config["env_vars"] = {"NVTE_FUSED_ATTN": 1, "CUDA_DEVICE_MAX_CONNECTIONS": value}
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama2-7b"))
    assert draft.scenario().parallel.cuda_device_max_connections == queues
    key = "env_vars.CUDA_DEVICE_MAX_CONNECTIONS"
    if queues is None:
        assert _row(draft, key)[1] == "ignored"
    else:
        assert _row(draft, key) == (str(value), "mapped", f"parallel.cuda_device_max_connections = {queues}")
    config["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] = "many"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"^env_vars\.CUDA_DEVICE_MAX_CONNECTIONS: 'many' is not a positive"):
        import_nemo([str(path)], Options(gpu="H100-SXM", model="llama2-7b"))
