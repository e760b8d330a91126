"""The ``training.method`` section: full training, LoRA, QLoRA or frozen layers, and their rules.

In: the YAML keys ``training.method`` (full | lora | qlora | frozen), ``training.lora`` (Hugging Face PEFT's
``LoraConfig`` names: r, lora_alpha, target_modules, lora_dropout), ``training.qlora`` (bitsandbytes'
``BitsAndBytesConfig``: bnb_4bit_use_double_quant, and the block size) and ``training.frozen_layers`` /
``frozen_embedding``. Out: validated specs, the resolved ``sim.model.peft.Peft`` the plan reads
(``peft_of``), and the cross-field rules (``check_method``), each a one-line error naming its field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.model.peft import NF4_BLOCK, TARGETS, Peft

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario

Target = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSpec(FrozenSpec):
    """LoRA adapters (Hu et al. 2022), by Hugging Face PEFT's ``LoraConfig`` names."""

    r: int = Field(default=16, ge=1, description="adapter rank")
    lora_alpha: float = Field(default=32.0, gt=0, description="scaling alpha / r (does not change the cost)")
    target_modules: tuple[Target, ...] | None = Field(default=None, min_length=1, description=(
        "projections that get adapters, Llama names (a GELU MLP's fc1/fc2 are up_proj/down_proj); default: every "
        "projection the model has (PEFT's 'all-linear')"))
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, description=(
        "dropout on the adapter input: > 0 adds a dropout kernel and keeps the dropped input for the backward"))


class QloraSpec(FrozenSpec):
    """QLoRA's frozen base (Dettmers et al. 2023): NF4 weights in blocks, constants double-quantised or not."""

    bnb_4bit_use_double_quant: bool = Field(default=True, description="8-bit constants (0.127 bit/param) "
                                            "instead of fp32 ones (0.5 bit/param)")
    blocksize: int = Field(default=NF4_BLOCK, ge=16, description="weights per absmax constant (bitsandbytes: 64)")


def peft_of(scenario: Scenario) -> Peft:
    """The resolved method of a scenario (``Peft()``, full training, by default)."""
    t = scenario.training
    every = tuple(name for name in TARGETS if name != "gate_proj" or scenario.model.mlp == "swiglu")
    targets: tuple[str, ...] = t.lora.target_modules or every
    return Peft(method=t.method, rank=t.lora.r, alpha=t.lora.lora_alpha, targets=tuple(targets),
                dropout=t.lora.lora_dropout, double_quant=t.qlora.bnb_4bit_use_double_quant,
                quant_block=t.qlora.blocksize, frozen_layers=frozenset(t.frozen_layers),
                frozen_embedding=t.frozen_embedding)


def check_method(s: Scenario) -> None:
    """The method's cross-field rules; each message starts with the field it concerns."""
    t, m = s.training, s.model
    if t.method != "frozen" and (t.frozen_layers or t.frozen_embedding):
        raise ValueError(f"training.frozen_layers: needs method: frozen (got {t.method})")
    if t.method == "frozen" and not (t.frozen_layers or t.frozen_embedding):
        raise ValueError("training.frozen_layers: method frozen needs layers to freeze (or frozen_embedding: true)")
    bad = [layer for layer in t.frozen_layers if not 0 <= layer < m.num_layers]
    if bad:
        raise ValueError(f"training.frozen_layers: layer {bad[0]} is outside 0..{m.num_layers - 1}")
    if t.method != "full" and m.is_moe:
        raise ValueError(f"training.method: {t.method} on a mixture-of-experts model is not modelled (use full)")
    if t.method not in ("lora", "qlora"):
        return
    targets = t.lora.target_modules or ()
    if m.mlp != "swiglu" and "gate_proj" in targets:
        raise ValueError(f"training.lora.target_modules: gate_proj needs a SwiGLU MLP (model.mlp is {m.mlp})")
    if len(set(targets)) != len(targets):
        raise ValueError("training.lora.target_modules: a module is listed twice")
    if t.method == "qlora" and t.dtype not in ("bf16", "fp16"):
        raise ValueError(f"training.dtype: QLoRA dequantises NF4 to a 16-bit compute dtype (bf16 or fp16), "
                         f"not {t.dtype}")
    if t.method == "lora" and t.dtype == "fp8":
        raise ValueError("training.dtype: LoRA with FP8 GEMMs is not modelled (use bf16 or fp16)")
    if s.deepspeed is not None and s.parallel.zero >= 3:
        raise ValueError(f"training.method: {t.method} under a DeepSpeed ZeRO-3 block is not modelled (use fsdp or "
                         "parallel.zero: 3)")
