"""``sim calibrate``: microbenchmarks on this machine's device, fitted into a profile the simulator uses.

In: a device (``cuda``, or ``cpu`` with the CPU build of torch), a model shape to take GEMM shapes from, and the
number of processes for the collectives (gloo processes on CPU; under ``torchrun`` the launched NCCL group).
Out, in the output directory: ``gemm.csv``, ``copy.csv``, ``collectives.csv`` and ``numerics.csv`` (raw
measurements), and ``profile.json`` (sim.costs.profile: GEMM FLOP/s over size per dtype, copy bandwidth, the link tier
fitted from the collectives), which ``costs: {model: calibrated, profile: DIR/profile.json}`` loads.

torch is imported only inside these modules' functions (the ``calibrate`` extra), never by the simulator.
Modules: ``compute`` (GEMMs, device copy), ``comm`` (torch.distributed collectives), ``numerics`` (fp16/bf16
error and range), ``run`` (orchestration, fitting, files); ``nccl_tests_log`` parses a user's own nccl-tests outputs and
``nccl_tests_fit`` fits the link tiers from them instead (``sim calibrate --from-nccl-tests LOG...``, no torch).
"""
