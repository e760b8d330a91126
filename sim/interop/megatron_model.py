"""Megatron-LM's model shape and MoE flags -> the scenario's model fields (and its moe section).

In: ``Args`` (``sim.interop.megatron_args``) with the layout's tp, and the command line's ``Options`` (``--model``:
what the flags do not give). Out: the model fields set on a ``ModelDraft`` with Megatron-LM's defaults written out
where a flag is absent (GELU MLP, 4h or SwiGLU's 8h/3 FFN, LayerNorm, learned positions, tied embeddings, bias, the
vocabulary padded as ``_vocab_size_with_padding`` pads it), Megatron-Core's MoE flags (experts, router top-k,
dispatcher, capacity); a shape Megatron-LM refuses or the simulator cannot model is one line naming the flag.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from sim.interop.draft import Draft, ModelDraft, Options, refuse
from sim.interop.megatron_args import Args


def _padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM's _vocab_size_with_padding: up to a multiple of make_vocab_size_divisible_by x tp."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple



# Multi-head latent attention's widths where a script with --multi-latent-attention omits them (Megatron-LM
# arguments.py at 1e05700595, the MLA group; --q-lora-rank defaults to None: a full query projection)
MLA_DEFAULTS: dict[str, int | None] = {"q_lora_rank": None, "kv_lora_rank": 32, "qk_head_dim": 128,
                                       "qk_pos_emb_head_dim": 64, "v_head_dim": 128}


@dataclass(frozen=True)
class MlaDefaults:
    """The MLA widths the framework builds where its configuration gives none (``widths``, keyed as
    ``MLA_DEFAULTS``), and whose defaults they are (``label``, the report's note)."""

    widths: dict[str, int | None]
    label: str


MEGATRON_MLA = MlaDefaults(MLA_DEFAULTS, "Megatron-LM's default")


def apply_model(draft: Draft, args: Args, options: Options, tp: int, mla: MlaDefaults = MEGATRON_MLA) -> None:
    """The shape flags (with Megatron-LM's defaults where a flag is absent) over ``--model``; ``mla``: the
    multi-head latent attention widths where ``multi_latent_attention`` is on and a width is absent (NeMo's
    config classes have their own, sim.interop.nemo)."""
    model = ModelDraft(draft, options)
    describes = args.has("num_layers") or args.has("hidden_size")

    def shape(key: str, dest: str, value: Any, default: bool = False, note: str = "") -> None:
        model.set(key, value, args.source(dest), args.raw(dest) if args.has(dest) else None, note,
                  "default" if default else "mapped")

    for key, dest in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"),
                      ("num_attention_heads", "num_attention_heads")):
        if args.has(dest):
            shape(key, dest, args.int(dest))
    hidden = model.fields.get("hidden_size")
    if args.flag("swiglu"):
        shape("mlp", "swiglu", "swiglu")
    elif args.flag("squared_relu"):
        shape("mlp", "squared_relu", "squared_relu")
    elif describes:
        shape("mlp", "swiglu", "gelu", True, "no --swiglu: Megatron-LM's GELU MLP")
    if args.has("ffn_hidden_size"):
        shape("ffn_hidden_size", "ffn_hidden_size", args.int("ffn_hidden_size"))
    elif describes and hidden:
        swiglu = model.fields.get("mlp") == "swiglu"
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden  # arguments.py's default
        shape("ffn_hidden_size", "ffn_hidden_size", ffn, True, "Megatron-LM's default for this MLP")
    if args.flag("group_query_attention"):
        groups = args.int("num_query_groups")
        if groups is None:
            raise refuse(f"{args.source('group_query_attention')}: needs --num-query-groups")
        shape("num_kv_heads", "num_query_groups", groups)
    elif args.has("num_query_groups"):
        groups = args.int("num_query_groups")
        heads = model.fields.get("num_attention_heads")
        if draft.framework == "nemo":  # NeMo reads num_query_groups by itself (None: one per head)
            shape("num_kv_heads", "num_query_groups", groups)
        elif groups != heads:
            draft.row(args.source("num_query_groups"), groups, "ignored",
                      "without --group-query-attention Megatron-LM uses one group per head")
    elif describes and args.has("num_attention_heads"):
        shape("num_kv_heads", "num_attention_heads", args.int("num_attention_heads"), True, "multi-head attention")
    if args.has("kv_channels") and hidden and model.fields.get("num_attention_heads"):
        channels = args.int("kv_channels")
        if channels * model.fields["num_attention_heads"] != hidden:
            shape("kv_channels", "kv_channels", channels)
        else:
            draft.row(args.source("kv_channels"), channels, "mapped", "= hidden_size / heads", "model.kv_channels")
    if args.has("normalization"):
        norm = str(args.get("normalization")).lower()
        if norm not in ("layernorm", "rmsnorm"):
            raise refuse(f"{args.source('normalization')}: {norm!r} is not LayerNorm or RMSNorm")
        shape("norm", "normalization", norm)
    elif describes:
        shape("norm", "normalization", "layernorm", True, "Megatron-LM's default LayerNorm")
    if args.has("position_embedding_type"):
        kind = str(args.get("position_embedding_type"))
        if kind not in ("rope", "learned_absolute", "none"):
            raise refuse(f"{args.source('position_embedding_type')}: {kind!r} is not modelled (rope or "
                         "learned_absolute)")
        shape("position_embedding", "position_embedding_type", "rope" if kind != "learned_absolute" else "learned")
    elif describes:
        shape("position_embedding", "position_embedding_type", "learned", True, "Megatron-LM's default "
              "learned_absolute")
    if args.has("untie_embeddings_and_output_weights"):
        shape("tied_embeddings", "untie_embeddings_and_output_weights",
              not args.flag("untie_embeddings_and_output_weights"))
    elif describes:
        shape("tied_embeddings", "untie_embeddings_and_output_weights", True, True, "Megatron-LM ties them")
    if args.has("add_bias_linear"):
        shape("bias", "add_bias_linear", args.flag("add_bias_linear"))
    elif describes:
        shape("bias", "add_bias_linear", True, True, "Megatron-LM's default add_bias_linear")
    if args.flag("qk_layernorm"):
        shape("qk_layernorm", "qk_layernorm", True)
    if args.flag("multi_latent_attention"):  # DeepSeek's MLA: its widths, the framework's defaults where absent
        shape("multi_latent_attention", "multi_latent_attention", True)
        for dest, default in mla.widths.items():
            if args.has(dest):
                shape(dest, dest, _width(args, dest))
            else:
                shape(dest, dest, default, True, mla.label)
    elif args.has("multi_latent_attention"):  # an explicit false (NeMo's key): Megatron's standard attention
        shape("multi_latent_attention", "multi_latent_attention", False)
    if args.flag("add_qkv_bias"):
        shape("add_qkv_bias", "add_qkv_bias", True)
    seq = args.int("seq_length")
    if args.has("max_position_embeddings"):
        shape("max_seq_len", "max_position_embeddings", args.int("max_position_embeddings"))
    elif seq is not None and model.fields.get("max_seq_len") is None:
        shape("max_seq_len", "seq_length", seq, note="no --max-position-embeddings: the sequence length")
    divisible = args.int("make_vocab_size_divisible_by", 128) or 128
    vocab = args.int("vocab_size") if args.has("vocab_size") else model.fields.get("vocab_size")
    if vocab is not None and describes:
        padded = _padded_vocab(vocab, divisible, tp)
        source = args.source("vocab_size") if args.has("vocab_size") else f"{model.base_label} (vocabulary)"
        note = (f"{vocab} padded to a multiple of {divisible} x tp {tp} (Megatron-LM's _vocab_size_with_padding)"
                if padded != vocab else f"a multiple of make_vocab_size_divisible_by {divisible} x tp {tp}")
        model.set("vocab_size", padded, source, vocab, note)
    _moe(draft, args, model)
    model.finish()


def _width(args: Args, dest: str) -> int | None:
    """An MLA width as given: a positive whole number, or none (``q_lora_rank``: null, a full query projection);
    anything else one line naming the flag or key."""
    value = args.get(dest)
    if dest == "q_lora_rank" and str(value).lower() in ("none", "null"):
        return None
    width = args.int(dest)
    if width is None or width < 1:
        raise refuse(f"{args.source(dest)}: {value} is not a width (a positive whole number)")
    return width


def _layer_pattern(value: Any) -> tuple[int, ...] | None:
    """``--moe-layer-freq`` written as a literal list of 0/1 (``[0,1,1]``, one per layer: Megatron-Core's
    moe_freq_type evaluates it) -> that tuple; None for anything else (an expression such as ``[0]*3+[1]*58``)."""
    try:
        parsed = ast.literal_eval(str(value).strip("\"'"))
    except (ValueError, SyntaxError):
        return None
    if isinstance(parsed, list) and parsed and all(flag in (0, 1) and isinstance(flag, int) for flag in parsed):
        return tuple(parsed)
    return None


def _moe(draft: Draft, args: Args, model: ModelDraft) -> None:
    """Megatron-Core's MoE flags: the experts (model fields) and the token dispatcher (moe section)."""
    dest = "num_experts" if args.has("num_experts") else "num_moe_experts"
    for key, field_name in ((dest, "num_moe_experts"), ("moe_router_topk", "moe_router_topk"),
                           ("moe_ffn_hidden_size", "moe_ffn_hidden_size"),
                           ("moe_shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")):
        if args.has(key):
            model.set(field_name, args.int(key), args.source(key), args.raw(key))
    if args.has("moe_layer_freq"):
        freq = args.get("moe_layer_freq")
        pattern = _layer_pattern(freq)
        if isinstance(freq, int) or (isinstance(freq, str) and freq.isdigit()):
            model.set("moe_layer_freq", int(freq), args.source("moe_layer_freq"))
        elif pattern is not None:  # Megatron's list form: one 0/1 per layer
            model.set("moe_layer_freq", pattern, args.source("moe_layer_freq"), freq)
        else:
            raise refuse(f"{args.source('moe_layer_freq')}: only an integer frequency or a list of 0/1 is read "
                         f"(got {freq!r})")
    if args.has("moe_token_dispatcher_type"):
        kind = str(args.get("moe_token_dispatcher_type"))
        if kind not in ("alltoall", "allgather", "flex"):
            raise refuse(f"{args.source('moe_token_dispatcher_type')}: {kind!r} is not modelled (alltoall, "
                         "allgather or flex)")
        backend = str(args.get("moe_flex_dispatcher_backend")) if args.has("moe_flex_dispatcher_backend") else "deepep"
        if kind == "flex" and backend != "deepep":  # Megatron-Core's default backend is deepep
            raise refuse(f"{args.source('moe_flex_dispatcher_backend')}: {backend!r} is not modelled (deepep)")
        draft.put("moe.token_dispatcher", kind, args.source("moe_token_dispatcher_type"))
    # DeepEP's SMs: --moe-deepep-num-sms is deprecated into --moe-flex-dispatcher-num-sms, which wins where both
    # are given (transformer_config.py __post_init__); unset, DeepEP V1 takes 20 (moe.deepep_sms's default)
    given = [(dest, args.int(dest)) for dest in ("moe_flex_dispatcher_num_sms", "moe_deepep_num_sms")
             if args.has(dest)]
    given = [(dest, sms) for dest, sms in given if sms is not None]  # an explicit None is Megatron's default
    if given:
        dest, sms = given[0]
        draft.put("moe.deepep_sms", sms, args.source(dest), note="SMs each DeepEP dispatch/combine holds")
    if args.has("moe_expert_capacity_factor"):
        draft.put("moe.capacity_factor", args.float("moe_expert_capacity_factor"),
                  args.source("moe_expert_capacity_factor"))
    if args.flag("moe_router_enable_expert_bias"):  # the per-expert routing bias (DeepSeek-V3)
        model.set("moe_router_enable_expert_bias", True, args.source("moe_router_enable_expert_bias"))
    if args.flag("moe_pad_expert_input_to_capacity"):
        draft.put("moe.pad_to_capacity", True, args.source("moe_pad_expert_input_to_capacity"))
    # Forced load balancing (benchmarking): random router logits, so the busiest EP rank's load is derived from the
    # layout (sim.parallel.forced_balance); it assumes naive top-k, not group-limited top-k (--moe-router-group-topk)
    if args.flag("moe_router_force_load_balancing"):
        grouped = args.has("moe_router_group_topk")  # has() leaves the flag unread: the report still lists it
        draft.put("moe.force_load_balancing", True, args.source("moe_router_force_load_balancing"),
                  note="random router logits: the busiest EP rank's expected load from random top-k routing"
                  + (" (naive top-k assumed: group-limited top-k is not modelled)" if grouped else ""))
    # EP A2A overlap: the combined 1F1B, which Megatron-Core runs with --delay-wgrad-compute (its wgrad order
    # inside each layer is part of what moe.a2a_overlap models)
    if args.flag("overlap_moe_expert_parallel_comm"):
        draft.put("moe.a2a_overlap", True, args.source("overlap_moe_expert_parallel_comm"))
        args.flag("delay_wgrad_compute")
