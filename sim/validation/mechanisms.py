"""The fidelity mechanisms (issue 22): what each adds to a step, the knob that turns it off, and its source.

In: nothing (a registry). Out: ``MECHANISMS``, one ``Mechanism`` per modelled effect that the validation set
measures: its name, the ``--set`` overrides that switch it off on every validation scenario (so its effect is
measured against the same rows, ``python -m analysis validate --mechanisms``), the scenario knob and its
default, and where its number comes from. The ablation table in ``docs/validation.md`` is generated from here,
so a mechanism is listed exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mechanism:
    name: str
    off: tuple[str, ...]  # overrides (``a.b=value``) that switch it off on any scenario; () = no switch
    knob: str  # the scenario field and its default
    source: str  # where its number comes from
    doc: str = ""  # the note under docs/ that says more
    note: str = ""  # for a mechanism without an off switch: what it moved when it landed


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="attention kernels at their measured rates",
        off=("costs.attention_curves=false",),
        knob="costs.attention_curves (default true), training.attention_backend (auto: cuDNN fused under TE, "
             "FlashAttention-2 in eager PyTorch)",
        source="this project's H100/H200 kernel times (sim calibrate, 2026-11-26: gpu_attention_measurements.csv); "
               "TE get_attention_backend prefers FusedAttention on Hopper+; PyTorch SDPA tries flash first "
               "(pytorch#138907)",
        doc="mechanisms/attention_kernels.md",
    ),
    Mechanism(
        name="eager RMSNorm at its measured traffic",
        off=(),  # a constant of the eager kernels (sim.model.ops.EAGER_RMSNORM_BYTES), not a scenario knob
        knob="sim.model.ops.EAGER_RMSNORM_BYTES (52 bytes per element; fused_kernels false with RMSNorm)",
        source="an H100's LlamaRMSNorm on 8,192 x 4,096 bf16: 1,731 us forward + backward (kernel time, "
               "gpu_eager_measurements.csv)",
        doc="mechanisms/attention_kernels.md",
        note="36 -> 52 bytes per element moved every IBM FSDP row +3..+4% (A100 7B -6.0% -> -2.8%, 70B +8.1% -> "
             "+10.2%; H100 7B -7.1% -> -3.0%)",
    ),
    Mechanism(
        name="end-to-end factor per GPU type",
        off=("costs.end_to_end_factor=1",),
        knob="costs.end_to_end_factor (default: the GPU type's fitted factor, Profile.end_to_end_factor)",
        source="one least-squares factor per GPU type on named fit rows (scripts/fit_default_profiles.py): A100 on "
               "Korthikanti et al. 2022 Table 4 layer times; other GPUs on published.csv rows marked fit",
        doc="mechanisms/end_to_end_calibration.md",
    ),
    Mechanism(
        name="FP8 attention core in BF16",
        off=("training.fp8_attention=true",),
        knob="training.fp8_attention (default false: Megatron-LM --fp8-dot-product-attention off)",
        source="Transformer Engine fp8_autocast covers te.Linear / LayerNormLinear / LayerNormMLP GEMMs only; "
               "DotProductAttention runs FP8 only with fp8_dpa",
    ),
    Mechanism(
        name="FP8 cast/transpose kernels",
        off=("training.fp8_cast_kernels=false",),
        knob="training.fp8_cast_kernels (default true), training.fp8_weight_cache (true: Megatron/NeMo)",
        source="Transformer Engine v1.8 linear.py / layernorm_linear.py / base.py (cast_to_fp8, fp8_cast_transpose);"
               " Megatron core_r0.8 is_first_microbatch weight cache",
        doc="mechanisms/fp8.md",
    ),
    Mechanism(
        name="FP8 GEMMs on the bf16 curve at the peak ratio",
        off=("costs.fp8_gemm=profile",),
        knob="costs.fp8_gemm (default scaled_bf16)",
        source="OpenXLA sm_100 fp8 vs bf16 tables (ratio within 0.12); cuBLASLt H100 fp8 ~1,600 TFLOP/s at 8192^3",
        doc="mechanisms/fp8.md",
    ),
    Mechanism(
        name="FP8 split accumulation in the backward GEMMs",
        off=("costs.fp8_split_accumulation=1",),
        knob="costs.fp8_split_accumulation (default 1.15: dgrad and wgrad FP8 GEMMs x 1.15, forward fast)",
        source="Transformer Engine module/base.py _2X_ACC_FPROP False, _2X_ACC_DGRAD / _2X_ACC_WGRAD True (torchao "
               "Float8LinearConfig: fast accumulation for the output GEMM only); fast over split accumulation "
               "1.1-1.2x (pytorch/ao#2377)",
        doc="mechanisms/fp8.md",
    ),
    Mechanism(
        name="FP8 current scaling: the amax scan before each cast",
        off=(),  # delayed scaling (the default) already has no scan; the rows that set current are torchao's
        knob="training.fp8_recipe (default delayed: TE DelayedScaling; current: TE Float8CurrentScaling, torchao)",
        source="TE tensor/float8_tensor.py Float8CurrentScalingQuantizer (amax scanned from the bf16 input before "
               "the cast); torchao float8 tensor_to_amax",
        doc="mechanisms/fp8.md",
        note="no dense validation row uses it; the TorchTitan FSDP+PP rows (scenarios/validation/fsdp_pp, torchao "
             "Float8) set it: -12.5% -> -11.5% (1F1B), -14.5% -> -13.5% (interleaved)",
    ),
    Mechanism(
        name="NCCL ring protocols and hop latencies across nodes",
        off=(),
        knob="network.protocol (default auto: NCCL's tuner picks LL / LL128 / Simple per call)",
        source="NCCL src/graph/tuning.cc (2.19+) hwLat per protocol (NVLink LL .6 x1.8, LL128 1.9, Simple 3.4 us; "
               "NET 2.7 / 4.0 / 14 us), nInterSteps = nNodes-1 (2x for all-reduce); OpenXLA GB200 tables",
        doc="mechanisms/collectives_at_scale.md",
        note="no off switch (it replaced one fitted latency); when it landed: 53 rows 6.53% -> 6.52% mean abs",
    ),
    Mechanism(
        name="DeepSpeed ZeRO-3 fetch and reduce granularity",
        off=(),
        knob="zero_optimization.stage3_prefetch_bucket_size 5e7, stage3_param_persistence_threshold 1e5, "
             "stage3_max_live_parameters 1e9, reduce_bucket_size 5e8 (DeepSpeed defaults)",
        source="DeepSpeed runtime/zero/partitioned_param_coordinator.py fetch_sub_module, partition_parameters.py, "
               "stage3.py reduce_independent_p_g_buckets_and_remove_grads, zero/config.py",
        doc="mechanisms/zero3_granularity.md",
        note="no validation row runs DeepSpeed ZeRO-3; must-show 2 (tests/test_zero3_scale.py) exercises it",
    ),
    Mechanism(
        name="kernel launch floor and host launch overhead",
        off=("costs.kernel_floor=0", "costs.launch_overhead=0"),
        knob="costs.kernel_floor (1.2 us), costs.launch_overhead (5 us), training.cuda_graphs (false)",
        source="pytorch/pytorch#161104 (1024-element add: 1.1-1.3 us); HolisticTraceAnalysis docs (5-20 us CPU "
               "launch); eager op kernel counts (RMSNorm 8, RoPE 8, SwiGLU 2)",
        doc="mechanisms/kernel_launch.md",
    ),
    Mechanism(
        name="MoE layer pass bound by the host behind the dispatcher's host sync",
        off=("costs.eager_op_overhead=0",),  # moe.host_sync=false is refused on a dense model's scenario
        knob="moe.host_sync (None: every dropless dispatcher syncs, Megatron-Core), costs.eager_op_overhead (32 us), "
             "costs.te_module_overhead (83 us per TE linear module forward)",
        source="Megatron-LM 1e05700595 token_dispatcher.py (cuda_dtoh_stream.synchronize() before the EP "
               "all-to-all; DeepEP's dispatch waits for the received counts); this project's H100 replay of the "
               "MoE layer's eager op sequence (moe_host_measurements.csv: 26-35 us of host per kernel, a pass = "
               "max(kernel, host) within 0.7 ms); TransformerEngine#1191 (Megatron TEColumnParallelLinear forward: "
               "115 us of host, te_module_host_measurements.csv)",
        doc="mechanisms/moe_host_sync.md",
    ),
    Mechanism(
        name="Megatron-Core's own MoE code on the host (router, token dispatcher, unpermute)",
        off=("costs.megatron_moe_host_ops=0",),
        knob="costs.megatron_moe_host_ops (63 eager ops' worth per MoE layer forward, at costs.eager_op_overhead)",
        source="Megatron-LM 1e05700595 megatron/core MoELayer/TopKRouter/MoEAlltoAllTokenDispatcher run on one H100 "
               "and one H200 beside the plain-PyTorch replay (scripts/measure_megatron_moe_host.py, "
               "megatron_moe_host_measurements.csv: 1.3-2.6x the replay's host time for the same parts)",
        doc="mechanisms/moe_host_sync.md",
    ),
    Mechanism(
        name="Megatron-Core's combined 1F1B schedule nodes on the host (moe.a2a_overlap)",
        off=("costs.a2a_overlap_node_overhead=0",),
        knob="costs.a2a_overlap_node_overhead (41 us per schedule-node call: 4 per MoE layer forward, 6 per "
             "backward, under moe.a2a_overlap only)",
        source="Megatron-LM f3e6c5 (lhb8125/Megatron-LM f3e6c55a, the Qwen3 overlap row's moe_dev code) "
               "ScheduleNode / TransformerLayerNode / schedule_chunk_1f1b run on a CPU around small layer functions "
               "against the same functions run plainly (scripts/measure_combined_1f1b_host.py, "
               "combined_1f1b_host_measurements.csv; CUDA calls stubbed: a lower bound)",
        doc="mechanisms/a2a_overlap.md",
    ),
    Mechanism(
        name="forced load balancing: the busiest expert rank under random top-k routing",
        off=(),  # no dense validation row routes tokens; the MoE rows that set it are in scenarios/validation/moe
        knob="moe.force_load_balancing (default false: routing as moe.imbalance states, 1.0 even)",
        source="Megatron-LM 1e05700595 router.py (apply_random_logits under --moe-router-force-load-balancing), "
               "moe_utils.py RandomSTE (i.i.d. normal logits, generator seeded 42 + rank, new every call) and "
               "topk_softmax_with_capacity (torch.topk); the expected maximum of the ep ranks' hypergeometric "
               "pair counts in the Gaussian limit (sim.parallel.forced_balance)",
        doc="mechanisms/forced_load_balancing.md",
        note="no dense validation row uses it; the six MoE rows whose commands passed the flag: Mixtral 8x22B "
             "forced balance +1.5% -> +3.0%, Qwen3-235B ep 32 +6.2% -> +6.6%, ep 32 overlap -12.5% -> -12.0%, "
             "a2a pp 32 -6.6% -> -6.4%, tp 4 -2.1% (host-bound, unchanged), 16k +0.5% -> +0.8%",
    ),
    Mechanism(
        name="FSDP1 gradient kernels per micro-batch (flatten, reduce-dtype cast, pre-division)",
        off=(),  # fsdp.version=2 on every row would give the rows without FSDP an fsdp section
        knob="fsdp.version (default 1: torch.distributed.fsdp.FullyShardedDataParallel; 2: fully_shard, none)",
        source="PyTorch FSDP1 _flat_param.py _get_unflat_views_unaligned (torch.split views: split_with_sizes' "
               "backward copies the gradients into the flat gradient); _runtime_utils.py _post_backward_hook "
               "(grad.to(reduce_dtype)), _reduce_grad (_div_if_needed by _get_gradient_predivide_factor)",
        doc="mechanisms/fsdp_grad_kernels.md",
        note="switched off per scenario by fsdp.version: 2; when it landed (72 rows): 6.70% -> 5.88% mean abs, "
             "-3.83% -> -2.81% signed; MPT-13B on 8 H100 -22.4% -> -10.0%, IBM 7B H100 -14.2% -> -12.0%",
    ),
    Mechanism(
        name="train-metric sync after the step (Composer + torchmetrics)",
        off=("training.train_metric_states=0",),
        knob="training.train_metric_states (default 0; the MPT rows: 4, LanguageCrossEntropy + LanguagePerplexity)",
        source="composer v0.17.2 trainer.py _train_loop (_compute_and_log_metrics every batch); torchmetrics "
               "gather_all_tensors (barrier, world-size zeros_like, all_gather); ProcessGroupNCCL::allgather's "
               "per-rank copies; host costs measured (metric_sync_host_measurements.csv: 7.8 + 6.7 + 0.7 us per rank)",
        doc="mechanisms/train_metric_sync.md",
    ),
    Mechanism(
        name="gradient clipping and the fp16 inf/nan check",
        off=("training.clip_grad=0",),
        knob="training.clip_grad (1.0: Megatron --clip-grad; DeepSpeed gradient_clipping 0)",
        source="Megatron-LM optimizer clip_grads.py (multi-tensor L2 norm + one-float all-reduce over "
               "get_grad_stats_parallel_group); fp16 check in optimizer.py _unscale_main_grads_and_check_for_nan",
        doc="mechanisms/grad_clip.md",
    ),
    Mechanism(
        name="TP collectives in chunks beside their GEMMs (TE userbuffers)",
        off=("parallel.tp_comm_overlap_chunks=1",),
        knob="parallel.tp_comm_overlap (false: Megatron's synchronous collectives; NeMo 24.07 ub_tp_comm_overlap), "
             "parallel.tp_comm_overlap_chunks (default tp)",
        source="Transformer Engine module/base.py initialize_ub (ring_exchange all-gather, pipelined reduce-scatter); "
               "NeMo-Framework-Launcher 24.07 conf/training/tp_overlap/ub_cfg_h100_*.yaml",
        doc="mechanisms/tp_comm_overlap.md",
    ),
    Mechanism(
        name="SMs TE's chunked reduce-scatter takes from the row-parallel GEMM (set_sm_margin)",
        off=("parallel.tp_comm_overlap_sms=0",),
        knob="parallel.tp_comm_overlap_sms (default 16, TE's without a userbuffers config; 0 for PyTorch AsyncTP)",
        source="TE comm_gemm_overlap.cpp (math SMs = SM count - num_comm_sm with set_sm_margin); TE module/base.py "
               "initialize_ub defaults (pipeline num_sm 16, set_sm_margin); NeMo-Framework-Launcher 24.07 "
               "ub_cfg_h100_*.yaml (proj_fprop / fc2_fprop num_sm), set per NeMo row",
        doc="mechanisms/tp_comm_overlap.md",
    ),
    Mechanism(
        name="PyTorch's AsyncTP as it runs (symmetric memory): its copies' order, shard copy, partials' reduction",
        off=("parallel.tp_comm_overlap_method=userbuffers",),
        knob="parallel.tp_comm_overlap_method (default userbuffers; async_tp: sim import torchtitan, with chunk "
             "GEMMs and no SMs taken by default); no dense row uses it: the TorchTitan FSDP+PP rows went -19.0% -> "
             "-16.8% (1F1B), -20.8% -> -18.5% (interleaved)",
        source="torch/distributed/_symmetric_memory/__init__.py (_pipelined_all_gather_and_consume, "
               "_pipelined_produce_and_all2all, reduce_partials); Inductor post_grad micro_pipeline_tp_pass; "
               "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (speed-ups 1.09x / 1.16x)",
        doc="mechanisms/tp_comm_overlap.md",
    ),
    Mechanism(
        name="blocking pipeline sends",
        off=("parallel.overlap_p2p_comm=true",),
        knob="parallel.overlap_p2p_comm (false: Megatron's _communicate waits on every send/receive)",
        source="Megatron-LM core pipeline_parallel/p2p_communication.py _communicate, schedules.py",
        doc="mechanisms/p2p_wait.md",
    ),
    Mechanism(
        name="distributed optimizer: weight all-gather overlapped with the next forward",
        off=("parallel.overlap_param_gather=false",),
        knob="parallel.overlap_param_gather (default false: Megatron-LM; NeMo 24.07 configs set overlap_param_sync "
             "true), parallel.align_param_gather (false: chained, core_r0.8 / Apex without interleaving)",
        source="Megatron-LM core_r0.8 distrib_optimizer.py (forward pre-hook, _finish_param_sync_helper), "
               "schedules.py param_sync_func; Apex DistributedFusedAdam overlap_param_sync",
        doc="mechanisms/distributed_optimizer.md",
    ),
    Mechanism(
        name="gradient buckets reduced during the backward",
        off=("parallel.overlap_grad_reduce=false",),
        knob="parallel.overlap_grad_reduce (default true: PyTorch DDP, NeMo overlap_grad_sync; Megatron-LM CLI "
             "false), parallel.dp_bucket_size",
        source="Megatron-LM core_r0.8 distributed_data_parallel.py (bucket_size None without overlap_grad_reduce), "
               "param_and_grad_buffer.py; PyTorch DDP bucket_cap_mb",
        doc="mechanisms/distributed_optimizer.md",
    ),
    Mechanism(
        name="Megatron's asynchronous TP collectives in the backward need one CUDA hardware queue",
        off=(),  # 1 is every dense row's default already; the one row it moves (32 under moe.a2a_overlap) refuses 1
        knob="parallel.cuda_device_max_connections (None: 32 with moe.a2a_overlap, else 1)",
        source="Megatron-LM megatron/core/tensor_parallel/layers.py (LinearWithGradAccumulationAndAsyncCommunication: "
               "'we rely on CUDA_DEVICE_MAX_CONNECTIONS=1 to ensure that the reduce scatter is scheduled before the "
               "weight gradient computation'); arguments.py's warning for TP with overlap_moe_expert_parallel_comm; "
               "Megatron-Core MoE README (EP A2A overlap requires CUDA_DEVICE_MAX_CONNECTIONS > 1); MoE ModelZoo "
               "Qwen3-235B/DeepSeek-V3 yaml ENV_VARS (32 for the 1F1B overlap)",
        doc="mechanisms/a2a_overlap.md",
        note="when it landed (2026-11-26): Qwen3 ep 32 + 1F1B overlap 15.49 -> 15.78 s (-12.0% -> -10.4%), no "
             "other row moved",
    ),
    Mechanism(
        name="causal flash attention skips the tiles above the diagonal",
        off=("training.causal_attention=false",),
        knob="training.causal_attention (default true: decoder LMs); MFU keeps Megatron's full-matrix FLOPs",
        source="FlashAttention-2 (Dao 2023) Sec. 3.1.1: blocks above the diagonal are skipped, diagonal blocks "
               "computed and masked; 128-token tiles (model.flash_tiles.causal_fraction)",
    ),
)
