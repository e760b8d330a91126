"""Megatron-LM's command line read: a launch script or an argument list -> argument destinations.

In: a bash launch script (variables, arrays, ``torchrun ... pretrain_gpt.py ...``) or the arguments themselves.
Out: the tokens, then (destination, value, flag as written) per flag as argparse would read them (the flags that
take no value: ``BOOL_FLAGS``; the ``store_false`` ones: ``NEGATED``), and ``Args``, the destinations with typed
accessors that record which were read (a bad value is one line naming the flag). Flag names are Megatron-LM's
(megatron/training/arguments.py); DeepSpeed's HF Trainer arguments and NeMo's keys are read through ``Args`` too.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.interop.draft import refuse
from sim.spec.scenario import read_text

# Flags that take no value (store_true / store_false in arguments.py), so the next token is not theirs.
BOOL_FLAGS = frozenset({
    "sequence_parallel", "group_query_attention", "swiglu", "squared_relu", "use_distributed_optimizer",
    "overlap_grad_reduce", "overlap_param_gather", "bf16", "fp16", "untie_embeddings_and_output_weights",
    "disable_bias_linear", "use_flash_attn", "grad_reduce_in_bf16", "no_overlap_p2p_communication",
    "no_align_param_gather", "tp_comm_overlap", "enable_cuda_graph", "external_cuda_graph", "fp8_param_gather",
    "qk_layernorm", "add_qkv_bias", "moe_grouped_gemm", "use_mcore_models", "mock_data", "apply_layernorm_1p",
    "cross_entropy_loss_fusion", "manual_gc", "calculate_per_token_loss", "no_masked_softmax_fusion",
    "no_create_attention_mask_in_dataloader", "no_mmap_bin_files", "log_throughput", "profile", "no_load_optim",
    "no_load_rng", "no_position_embedding", "moe_pad_expert_input_to_capacity", "use_legacy_models",
    "overlap_param_gather_with_optimizer_step", "no_gradient_accumulation_fusion", "no_bias_swiglu_fusion",
    "no_bias_gelu_fusion", "no_bias_dropout_fusion", "no_rope_fusion", "fp8_dot_product_attention",
    "log_timers_to_tensorboard", "log_memory_to_tensorboard", "log_validation_ppl_to_tensorboard",
    "use_rotary_position_embeddings", "accumulate_allreduce_grads_in_fp32", "ckpt_fully_parallel_load",
    "use_dist_ckpt", "async_save", "moe_router_pre_softmax", "no_persist_layer_norm", "log_params_norm",
    "log_num_zeros_in_grad", "use_cpu_initialization", "distribute_saved_activations", "use_torch_fsdp2",
    "use_precision_aware_optimizer", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "multi_latent_attention", "moe_router_enable_expert_bias", "cpu_offloading",
})
# Flags taking several values (argparse nargs="*"): --recompute-modules layernorm moe_act
LIST_FLAGS = frozenset({"recompute_modules"})
# store_false flags: the destination they clear.
NEGATED = {"no_overlap_p2p_communication": "overlap_p2p_comm", "no_align_param_gather": "align_param_gather",
           "disable_bias_linear": "add_bias_linear", "no_position_embedding": "add_position_embedding",
           "no_gradient_accumulation_fusion": "gradient_accumulation_fusion"}
SHELL_WORDS = frozenset({"(", ")", "[[", "]]", "[", "]", "then", "fi", "else", "do", "done", ";", "&&", "||",
                         "\\", "|"})


# ``cat > NAME <<'TAG'`` ... ``TAG``: a file the script writes before it launches (the userbuffers YAML that
# ``--tp-comm-overlap-cfg`` names, as `sim search --emit megatron` writes it).
HEREDOC = re.compile(r"^[ \t]*cat[ \t]+>[ \t]*(\S+)[ \t]+<<-?[ \t]*['\"]?(\w+)['\"]?[ \t]*\n(.*?)^[ \t]*\2[ \t]*$\n?",
                     re.MULTILINE | re.DOTALL)


def script_files(source: str) -> dict[str, str]:
    """The files a bash launch script writes with a here-document (``cat > NAME <<'EOF'``): name -> text."""
    return {match.group(1).strip("\"'"): match.group(3) for match in HEREDOC.finditer(source)}


# A line that assigns: ``NAME=value``, ``export NAME=value``, ``NAME=value command ...`` (an array, ``NAME=(``, is
# not one: its entries are words).
ASSIGNMENT = re.compile(r"\s*(export\s+)?([A-Za-z_][A-Za-z0-9_]*)=([^(\s][^#]*|)\s*(?:#.*)?$")
# ``export NAME ...``: variables set before, exported.
# names separated by whitespace (one way to split a line: a name-then-optional-space repeat backtracks
# exponentially over a long name when the line does not match, e.g. ``export NAME=value``)
EXPORT = re.compile(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*(?:\s+[A-Za-z_][A-Za-z0-9_]*)*)\s*(?:#.*)?$")
NAME_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)


@dataclass(frozen=True)
class Script:
    """A bash launch script read. ``tokens``: its words, with its simple variables substituted (``script_tokens``).
    ``environment``: what the launched process finds in its environment, name -> value: the variables the script
    exports (``export NAME=value``, or ``NAME=value`` and ``export NAME``) and those set before a command on its
    line (``NAME=value torchrun ...``); a variable set without export stays the shell's (bash semantics):
    ``variables``, every variable the script sets, exported or not."""

    tokens: list[str]
    environment: dict[str, str]
    variables: dict[str, str] = field(default_factory=dict)


def _assignment(line: str) -> tuple[bool, dict[str, str], list[str]] | None:
    """A line that assigns -> (exported, the assignments in order, the command after them: empty for a plain
    assignment); None for any other line. A value that is one shell word is unquoted; a command substitution
    (``$(...)``, backquotes) or a value bash would not read is kept as written (not run)."""
    match = ASSIGNMENT.match(line)
    if not match:
        return None
    exported, name, value = bool(match.group(1)), match.group(2), match.group(3).strip()
    try:
        words = shlex.split(value)
        rest = shlex.split(line[match.start(2):], comments=True)
    except ValueError:
        return exported, {name: value}, []
    if len(words) <= 1 or value.startswith(("$(", "`")):
        return exported, {name: words[0] if len(words) == 1 else value}, []
    assigned: dict[str, str] = {}
    for index, word in enumerate(rest):  # NAME=v NAME2=v2 command args: the leading assignments
        pair = NAME_VALUE.fullmatch(word)
        if pair is None:
            if exported:  # export A=1 B: B exported as it stands
                assigned.setdefault(word, "")
                continue
            return exported, assigned, rest[index:]
        assigned[pair.group(1)] = pair.group(2)
    return exported, assigned, []


def read_script(source: str) -> Script:
    """A bash launch script -> its words and its environment (``Script``). Variables (``${NAME:-default}`` too)
    are substituted line by line as bash would; quoted array entries such as ``"--fp8-format hybrid"`` are split
    into flag and value; the here-documents' bodies are files, not words (``script_files``)."""
    source = HEREDOC.sub("", source)
    source = source.replace("\\\n", " ")
    variables: dict[str, str] = {}
    environment: dict[str, str] = {}

    def substitute(line: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(3)
            default = match.group(2)
            if name in variables:
                return variables[name]
            return default.strip("\"'") if default is not None else match.group(0)
        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, line)

    lines = []
    for line in source.splitlines():
        line = substitute(line)
        export = EXPORT.match(line)
        if export:
            for name in export.group(1).split():
                environment[name] = variables.get(name, "")
            continue
        assigned = _assignment(line)
        if assigned is None:
            lines.append(line)
            continue
        exported, values, command = assigned
        if command:  # NAME=value command ...: the command runs with them in its environment
            environment.update(values)
            lines.append(shlex.join(command))
            continue
        for name, value in values.items():
            variables[name] = value
            if exported or name in environment:  # an exported variable set again stays exported
                environment[name] = value
    try:
        words = shlex.split("\n".join(lines), comments=True)
    except ValueError as error:
        raise refuse(f"script: cannot read it as bash words ({error})") from None
    tokens: list[str] = []
    for word in words:
        if word.startswith("--") and " " in word.strip():
            tokens.extend(word.split())
        else:
            tokens.append(word)
    return Script(tokens, environment, variables)


def script_tokens(source: str) -> list[str]:
    """A bash launch script's words (``read_script``)."""
    return read_script(source).tokens


def parse_tokens(tokens: list[str]) -> list[tuple[str, Any, str]]:
    """``--flag value`` / ``--flag=value`` / ``--bool-flag`` -> (destination, value, flag as written), in order."""
    parsed: list[tuple[str, Any, str]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("--") or token == "--":
            continue
        flag, _, inline = token.partition("=")
        dest = flag[2:].replace("-", "_")
        if inline:
            parsed.append((dest, inline, flag))
            continue
        if dest in BOOL_FLAGS:
            parsed.append((dest, True, flag))
            continue
        if dest in LIST_FLAGS:
            values = []
            while index < len(tokens) and not tokens[index].startswith("--") and tokens[index] not in SHELL_WORDS:
                values.append(tokens[index])
                index += 1
            parsed.append((dest, values, flag))
            continue
        following = tokens[index] if index < len(tokens) else None
        if following is None or following.startswith("--") or following in SHELL_WORDS:
            parsed.append((dest, True, flag))
        else:
            parsed.append((dest, following, flag))
            index += 1
    return parsed


@dataclass
class Args:
    """Argument destinations -> (value, how it was written); which were read."""

    values: dict[str, tuple[Any, str, Any]] = field(default_factory=dict)  # dest -> (value, source, raw)
    read: set[str] = field(default_factory=set)

    def add(self, dest: str, value: Any, source: str, raw: Any = None) -> None:
        self.values[dest] = (value, source, value if raw is None else raw)

    def has(self, dest: str) -> bool:
        return dest in self.values and self.values[dest][0] is not None

    def source(self, dest: str) -> str:
        return self.values[dest][1] if dest in self.values else f"--{dest.replace('_', '-')}"

    def raw(self, dest: str) -> Any:
        return self.values[dest][2] if dest in self.values else None

    def get(self, dest: str, default: Any = None) -> Any:
        self.read.add(dest)
        value = self.values.get(dest, (None, "", None))[0]
        return default if value is None else value

    def flag(self, dest: str, default: bool = False) -> bool:
        value = self.get(dest)
        if value is None:
            return default
        if isinstance(value, str):
            lowered = value.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise refuse(f"{self.source(dest)}: expected true or false (got {value!r})")
            return lowered in ("true", "1", "yes")
        return bool(value)

    def int(self, dest: str, default: int | None = None) -> int | None:
        value = self.get(dest)
        if value is None:
            return default
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise refuse(f"{self.source(dest)}: expected a whole number (got {value!r})") from None
        if number != int(number):
            raise refuse(f"{self.source(dest)}: expected a whole number (got {value!r})")
        return int(number)

    def float(self, dest: str) -> float | None:
        value = self.get(dest)
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise refuse(f"{self.source(dest)}: expected a number (got {value!r})") from None


def read_launch(inputs: list[str]) -> Script:
    """``inputs``: one launch script path (its words and environment), or the arguments themselves (no
    environment: the shell they run in is not given)."""
    if len(inputs) == 1 and not inputs[0].startswith("--"):
        return read_script(read_text(Path(inputs[0]), "megatron"))
    return Script([token for item in inputs for token in (item.split() if item.startswith("--") else [item])], {})


def read_file_argument(inputs: list[str], name: str) -> str | None:
    """The text of a file an argument names (``--tp-comm-overlap-cfg ub_cfg.yaml``): the launch script's
    here-document of that name, else the file beside the script (or, for an argument list, from the working
    directory); None where neither exists."""
    script = Path(inputs[0]) if len(inputs) == 1 and not inputs[0].startswith("--") else None
    if script is not None:
        written = script_files(read_text(script, "megatron")).get(name)
        if written is not None:
            return written
    path = Path(name) if script is None or Path(name).is_absolute() else script.parent / name
    return path.read_text() if path.is_file() else None
