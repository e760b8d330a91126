"""``sim search --emit torchtitan / deepspeed``: the kernels the scenario priced (the loss, the attention kernel,
FP8's weight cast cache) written as the framework's settings, or refused in one line naming the field, never
dropped. Each case is a round trip: the scenario emitted and imported back (``sim import``) gives the same field.

TorchTitan (the TOML job config at pytorch/torchtitan e347b1e5e, the last commit before its move to Python configs):
the loss is ``cross_entropy_loss`` (torchtitan/components/loss.py: ``F.cross_entropy(pred.float(), ...)``, compiled
when ``[compile] enable`` with "loss" in ``components``); the attention is the model flavor's SDPA (no setting in
the TOML); FP8 weights are cast once per FSDP all-gather with ``[quantize.linear.float8]
enable_fsdp_float8_all_gather`` (torchao's fsdp_pre_all_gather). DeepSpeed under the HF Trainer: the script's
``--attn_implementation`` (eager / sdpa / flash_attention_2) and the Trainer's ``--use_liger_kernel`` (Liger's fused
linear cross entropy; transformers integrations/liger.py at dd7a585c07).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.errors import ConfigError
from sim.interop.deepspeed import import_deepspeed
from sim.interop.draft import Draft, Options
from sim.interop.emit import emit
from sim.interop.torchtitan import import_torchtitan
from sim.spec.scenario import Scenario, load_scenario

from conftest import ROOT

DATA = ROOT / "tests" / "data" / "ecosystem"
FSDP = ROOT / "scenarios" / "llama2-7b_h100-16_fsdp.yaml"  # FSDP FULL_SHARD over 16 H100, flash attention
DDP = ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml"  # DDP over 8 H100, flash attention
KERNELS = ("cross_entropy", "flash_attention", "attention_backend", "fused_kernels", "fused_norm_rope", "dtype",
           "fp8_weight_cache", "fp8_recipe")


def _torchtitan(scenario: Scenario, tmp_path: Path, model: str | None = "llama2-7b") -> tuple[str, Draft]:
    text = emit(scenario, "torchtitan").text
    path = tmp_path / "job.toml"
    path.write_text(text)
    return text, import_torchtitan([str(path)], Options(gpu=scenario.cluster.gpu.name,
                                                        gpus=scenario.cluster.num_gpus, model=model))


def _deepspeed(scenario: Scenario, tmp_path: Path) -> tuple[str, Draft]:
    emitted = emit(scenario, "deepspeed")
    path = tmp_path / "ds_config.json"
    path.write_text(emitted.text)
    trainer = emitted.launch.split()[6:]  # the training script's arguments, after `deepspeed ... train.py`
    return emitted.launch, import_deepspeed([str(path), *trainer], Options(
        gpu=scenario.cluster.gpu.name, gpus=scenario.cluster.num_gpus, model="llama2-7b"))


def _refused(scenario: Scenario, framework: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        emit(scenario, framework)
    assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)


def _kernels(s: Scenario) -> tuple[Any, ...]:
    return tuple(getattr(s.training, field) for field in KERNELS)


# --- TorchTitan -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "components", "loss", "compiled"), [
    ([], '["model", "loss"]', "fused", True),  # the default: model and loss compiled (Inductor fuses the upcast)
    (["training.cross_entropy=hf"], '["model"]', "hf", True),  # an eager loss: .float(), then log_softmax in fp32
    (["training.fused_kernels=false"], '["loss"]', "fused", False),  # eager model, compiled loss
    (["training.fused_kernels=false", "training.cross_entropy=hf"], None, "hf", False),  # all eager: no [compile]
])
def test_torchtitan_emit_runs_the_loss_the_scenario_priced(overrides: list[str], components: str | None, loss: str,
                                                           compiled: bool, tmp_path: Path) -> None:
    """TorchTitan's loss upcasts the logits (``pred.float()``) before ``F.cross_entropy``: eager, the fp32 copy and
    log_softmax's output are what ``training.cross_entropy: hf`` prices; compiled (``[compile] components`` with
    "loss"), Inductor fuses the upcast into the reductions and no fp32 logits are held (``fused``). The emitter
    wrote ``components = ["model", "loss"]`` whenever fused_kernels and no [compile] otherwise, and the importer
    took every TorchTitan run as ``fused``: an eager run was priced without its 12 bytes per logit."""
    text, draft = _torchtitan(load_scenario(FSDP, overrides), tmp_path)
    lines = text.splitlines()
    if components is None:
        assert "[compile]" not in lines
    else:
        assert f"components = {components}" in lines
    back = draft.scenario()
    assert (back.training.cross_entropy, back.training.fused_kernels) == (loss, compiled)


def test_torchtitan_emit_refuses_megatrons_loss() -> None:
    """Megatron-Core's unfused vocab-parallel cross entropy (``megatron``) is no TorchTitan loss: one line."""
    _refused(load_scenario(FSDP, ["training.cross_entropy=megatron"]), "torchtitan", "training.cross_entropy: ")


@pytest.mark.parametrize("name", ["torchtitan_llama3_8b.toml", "torchtitan_llama3_70b.toml",
                                  "torchtitan_llama3_405b.toml"])
def test_torchtitan_imported_tomls_round_trip_their_kernels(name: str, tmp_path: Path) -> None:
    """TorchTitan's own llama3 TOMLs (8B eager, 70B eager, 405B compiled with Float8 and FSDP float8 all-gathers):
    imported, emitted and imported again, the loss, attention, kernel fusion and FP8 fields come back the same."""
    first = import_torchtitan([str(DATA / name)], Options(gpu="H100-SXM", gpus=64)).scenario()
    _, draft = _torchtitan(first, tmp_path, model=None)
    assert _kernels(draft.scenario()) == _kernels(first)


def test_torchtitan_tomls_loss_and_fp8_weight_cache() -> None:
    """The eager 8B TOML runs TorchTitan's upcast loss (``hf``); the 405B one compiles it (``fused``) and gathers
    its Float8 weights in FP8 with precomputed scales, so each weight is cast once per all-gather of its
    1/dp_shard shard, not per micro-batch as a whole (``fp8_weight_cache: true``, the NeMo rows' setting)."""
    eager = import_torchtitan([str(DATA / "torchtitan_llama3_8b.toml")], Options(gpu="H100-SXM", gpus=64))
    assert eager.scenario().training.cross_entropy == "hf"
    draft = import_torchtitan([str(DATA / "torchtitan_llama3_405b.toml")], Options(gpu="H100-SXM", gpus=64))
    s = draft.scenario()
    assert (s.training.cross_entropy, s.training.fp8_weight_cache, s.training.fp8_recipe) == ("fused", True,
                                                                                               "current")
    row = next(row for row in draft.rows if row.source == "quantize.linear.float8.enable_fsdp_float8_all_gather")
    assert row.status == "mapped" and row.target == "training.fp8_weight_cache = true"


def test_torchtitan_emit_attention() -> None:
    """The TOML has no attention-kernel setting (the flavor's SDPA: torchtitan/models/attention.py), so cuDNN's fused
    attention asked for explicitly is refused in one line; ``flash_attention: false`` is every scenario's default,
    so it is not refused: the TOML says in a comment that TorchTitan runs SDPA's flash kernel there."""
    _refused(load_scenario(FSDP, ["training.attention_backend=fused"]), "torchtitan",
             "training.attention_backend: fused")
    text = emit(load_scenario(FSDP, ["training.flash_attention=false"]), "torchtitan").text
    assert any(line.startswith("# attention: ") and "flash_attention false" in line for line in text.splitlines())


@pytest.mark.parametrize(("base", "overrides", "gathered", "cache"), [
    (FSDP, ["training.dtype=fp8"], True, True),  # the field's default: cast once, before the FP8 all-gather
    (FSDP, ["training.dtype=fp8", "training.fp8_weight_cache=false"], False, False),  # Float8Linear casts per forward
    (DDP, ["training.dtype=fp8", "training.fp8_weight_cache=false", "cluster.nodes=2", "parallel.dp=16"], False,
     False),
])
def test_torchtitan_emit_writes_the_fp8_weight_cast(base: Path, overrides: list[str], gathered: bool, cache: bool,
                                                    tmp_path: Path) -> None:
    """FP8 weights cast once and reused (``fp8_weight_cache``) are TorchTitan's FSDP float8 all-gather with
    precomputed scales ([quantize.linear.float8] at e347b1e5e): each weight's shard is cast before it is
    gathered, not the whole weight in every forward as Float8Linear alone does. The emitter wrote neither, so a
    cached scenario ran (and imported back) uncached."""
    text, draft = _torchtitan(load_scenario(base, overrides), tmp_path)
    lines = text.splitlines()
    # torchao has no delayed scaling: the recipe's default (delayed) is named in a comment, the run is current scaling
    assert any(line.startswith("# fp8: ") and "fp8_recipe delayed" in line for line in lines)
    assert draft.scenario().training.fp8_recipe == "current"
    assert ("enable_fsdp_float8_all_gather = true" in lines) is gathered
    assert ("precompute_float8_dynamic_scale_for_fsdp = true" in lines) is gathered
    assert draft.scenario().training.fp8_weight_cache is cache


def test_torchtitan_emit_refuses_the_fp8_weight_cache_without_fsdp() -> None:
    """Without sharded data parallelism there is no FSDP all-gather to cast the weights before, and Float8Linear
    casts each weight in every forward: a cached FP8 DDP layout is refused in one line naming the field."""
    _refused(load_scenario(DDP, ["training.dtype=fp8", "cluster.nodes=2", "parallel.dp=16"]), "torchtitan",
             "training.fp8_weight_cache: ")


# --- DeepSpeed under the HF Trainer -----------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "written", "flash"), [
    (["training.flash_attention=false"], "--attn_implementation eager", False),
    ([], "--attn_implementation sdpa", True),
    (["training.attention_backend=flash"], "--attn_implementation sdpa", True),
])
def test_deepspeed_emit_writes_the_attention_implementation(overrides: list[str], written: str, flash: bool,
                                                            tmp_path: Path) -> None:
    """The training script's ``--attn_implementation`` (transformers: eager, sdpa by default, flash_attention_2):
    the emitter wrote none, so an unfused-attention scenario (flash_attention false, the field's default) ran and
    imported back as SDPA's flash kernel."""
    launch, draft = _deepspeed(load_scenario(DDP, overrides), tmp_path)
    assert written in launch
    back = draft.scenario().training
    assert back.flash_attention is flash
    if flash:  # SDPA's (or flash-attn's) FlashAttention, whatever `auto` would resolve to
        assert back.attention_backend == "flash"


def test_deepspeed_emit_refuses_cudnn_attention() -> None:
    """transformers has no cuDNN attention implementation to ask for (SDPA tries FlashAttention-2 first): one line."""
    _refused(load_scenario(DDP, ["training.attention_backend=fused"]), "deepspeed",
             "training.attention_backend: fused")


@pytest.mark.parametrize(("overrides", "liger", "loss"), [
    ([], True, "fused"),  # the default: Liger's fused linear cross entropy holds no logits
    (["training.cross_entropy=hf"], False, "hf"),  # transformers' ForCausalLMLoss
])
def test_deepspeed_emit_runs_the_loss_the_scenario_priced(overrides: list[str], liger: bool, loss: str,
                                                          tmp_path: Path) -> None:
    """The HF Trainer computes transformers' loss (``hf``) unless ``--use_liger_kernel`` patches the model with
    Liger's kernels, whose fused linear cross entropy never materialises the logits (``fused``; with Liger's RMSNorm
    and RoPE kernels, ``fused_norm_rope``). The emitter wrote neither, so every default (fused) scenario ran and
    imported back as ``hf``: 12 bytes per logit it had not priced."""
    launch, draft = _deepspeed(load_scenario(DDP, overrides), tmp_path)
    assert ("--use_liger_kernel" in launch.split()) is liger
    back = draft.scenario()
    assert back.training.cross_entropy == loss
    assert back.training.fused_norm_rope is (True if liger else None)


@pytest.mark.parametrize(("overrides", "message"), [
    (["training.cross_entropy=megatron"], "training.cross_entropy: "),
    (["training.fused_norm_rope=false"], "training.fused_norm_rope: "),  # Liger would fuse them with the loss
])
def test_deepspeed_emit_refuses_a_loss_the_trainer_cannot_run(overrides: list[str], message: str) -> None:
    _refused(load_scenario(DDP, overrides), "deepspeed", message)


def test_deepspeed_imported_config_round_trips_its_kernels(tmp_path: Path) -> None:
    """The HF guide's ZeRO-3 config with the Trainer's arguments, imported (``hf`` loss, SDPA flash attention),
    emitted and imported again: the same loss and attention fields."""
    trainer = "--per_device_train_batch_size 4 --gradient_accumulation_steps 2 --bf16 --max_seq_length 4096"
    first = import_deepspeed([str(DATA / "deepspeed_hf_zero3.json"), *trainer.split()],
                             Options(gpu="H100-SXM", gpus=8, model="llama2-7b")).scenario()
    _, draft = _deepspeed(first, tmp_path)
    assert _kernels(draft.scenario()) == _kernels(first)


def test_torchtitan_emit_names_the_cudnn_attention_auto_priced(tmp_path: Path) -> None:
    """``attention_backend: auto`` with fused kernels (every bundled scenario's default) is priced on cuDNN's fused
    attention (sim.costs.models.resolve_attention_backend); the TOML has no attention setting and imports back as
    FlashAttention-2 (`sim import torchtitan` reads the December 2024 SDPA order), so the TOML says so in a comment
    naming the field, as for unfused attention. The emitter wrote nothing: the llama2-7b FSDP scenario's round trip
    changed its attention kernel unannounced (its step +10% on flash)."""
    scenario = load_scenario(FSDP)
    assert (scenario.training.attention_backend, scenario.training.fused_kernels) == ("auto", True)
    text, draft = _torchtitan(scenario, tmp_path)
    notes = [line for line in text.splitlines() if line.startswith("# attention: ")]
    assert len(notes) == 1 and "attention_backend auto" in notes[0], notes
    assert draft.scenario().training.attention_backend == "flash"
    flash = emit(load_scenario(FSDP, ["training.attention_backend=flash"]), "torchtitan").text
    assert not any(line.startswith("# attention: ") for line in flash.splitlines())
