"""Eager PyTorch's element-wise kernels against this project's measurements (an H100 and an H200, kernel time by
PyTorch's profiler, 2026-11-26: ``sim/data/reference/gpu_eager_measurements.csv``; scripts/measure_gpu_kernels.py
--only eager): a Hugging Face Llama 3 8B layer's RMSNorm, rotary embedding and SwiGLU at 8,192 tokens, as the cost
model prices them on the GPU's preset (no end-to-end factor: kernel against kernel)."""

from __future__ import annotations

from importlib import resources

import pandas as pd
import pytest

from sim.costs.models import RooflineCosts, Work
from sim.costs.profile import default_for
from sim.hardware.gpus import GPU_PRESETS
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.ops import EAGER_RMSNORM_BYTES
from sim.model.presets import MODEL_PRESETS

DEVICES = {"H100-SXM": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200"}


def measured(gpu: str, op: str, phase: str = "forward+backward") -> float:
    table = pd.read_csv(resources.files("sim").joinpath("data/reference/gpu_eager_measurements.csv"))
    row = table[(table["device"] == DEVICES[gpu]) & (table["op"] == op) & (table["pass"] == phase)]
    assert len(row) == 1 and row["tokens"].item() == 8192 and row["hidden"].item() == 4096
    return float(row["median_s"].item())


def priced(gpu: str, name: str) -> tuple[float, float]:
    """(forward, forward + backward) seconds of the named op of an eager Llama 3 8B layer on one GPU."""
    costs = RooflineCosts(GPU_PRESETS[gpu], "bf16", default_for(gpu), factor=1.0)
    ops = layer_forward_ops(LayerShape(MODEL_PRESETS["llama3-8b"], 1, 8192, 1, sequence_parallel=False, elem_bytes=2,
                                       flash_attention=True, fused_kernels=False, causal=True))
    op = next(op for block in ops.values() for op in block if op.name == name)
    forward = costs.compute_time(Work((op,), 0.0), "forward")
    return forward, forward + costs.compute_time(Work((op,), 0.0), "backward")


def test_eager_rmsnorm_bytes_are_the_h100s_measured_forward_and_backward():
    """52 bytes per element: the H100's measured forward + backward (1,731 us) within 1%; its forward alone (522 us)
    within 12% (the backward ran 2.3x the forward against the model's 2x). On an H200, with 43% more bandwidth, the
    kernels ran 1,383 us, 20% faster only: the 52 bytes price them 12% short there (the norm is not all bandwidth)."""
    assert EAGER_RMSNORM_BYTES == 52.0
    forward, total = priced("H100-SXM", "input_norm")
    assert total == pytest.approx(measured("H100-SXM", "hf_rmsnorm"), rel=0.01)
    assert forward == pytest.approx(measured("H100-SXM", "hf_rmsnorm", "forward"), rel=0.12)
    _, h200 = priced("H200", "input_norm")
    assert 0.85 < h200 / measured("H200", "hf_rmsnorm") < 0.90


def test_eager_swiglu_matches_its_measured_forward_and_backward():
    """Eager SwiGLU (silu, then the product: 3 reads, 2 writes per element): 1,174 us priced against 1,076 measured
    on the H100 (+9%), 819 against 772 on the H200 (+6%)."""
    for gpu, tolerance in (("H100-SXM", 0.10), ("H200", 0.07)):
        _, total = priced(gpu, "mlp_activation")
        assert total == pytest.approx(measured(gpu, "swiglu"), rel=tolerance)


def test_hugging_faces_bf16_rotary_embedding_costs_less_than_the_fms_fp32_count():
    """The rotary op is priced as FMS's fp32 rotation (36 bytes per element of q and k); Hugging Face's bf16
    apply_rotary_pos_emb ran in 1,146 us on the H100 against the 1,510 priced: a known over-price for HF models,
    kept because the IBM rows run FMS's kernels (unmeasured)."""
    _, total = priced("H100-SXM", "rotary_embedding")
    assert 1.25 < total / measured("H100-SXM", "hf_rope_qk") < 1.40
