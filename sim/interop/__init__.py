"""Launch configurations in and out: ``sim import`` and ``sim search --emit`` (issue 26).

In: a user's own launch configuration (a Megatron-LM ``pretrain_gpt.py`` command line or launch script, a NeMo
YAML config, a DeepSpeed ``ds_config.json`` with the Hugging Face Trainer's arguments, a TorchTitan TOML) plus the
cluster and model options the file does not say. Out: a scenario dict that ``sim.spec.scenario`` validates, and a
report with one row per flag or key: mapped (to which scenario field), a framework default written out, unmapped
(with the reason), ignored (harmless: logging, paths, learning rate) or unknown. Contradictory settings are refused
with one line naming the flag. ``emit`` goes the other way: a scenario's layout as each framework's flags.

Modules: ``draft`` (the scenario being built and its report; cluster and model options), ``megatron_args`` (a
launch script or argument list read into argument destinations), ``megatron`` (their mapping, shared with NeMo,
whose keys are Megatron's argument names; the model's shape and MoE flags in ``megatron_model``), ``nemo``,
``deepspeed``, ``torchtitan``, ``emit``. Only ``sim.cli`` imports this package. See docs/ecosystem.md.
"""
