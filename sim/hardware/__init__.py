"""The hardware a scenario names: GPUs, the links between them, the nodes and fabric they sit in.

Modules: ``frozen`` (``FrozenSpec``, the base of every validated spec), ``dtypes`` (the bytes of a training dtype's
elements and the dtype its parameters are kept in), ``gpus`` (``GpuSpec`` and the GPU presets), ``links``
(``LinkSpec``: one tier of links with its efficiency curve), ``nodes`` (``NodeSpec``, ``FabricSpec``, the node
presets with their fitted link tiers, and each GPU's default node), ``sms`` (compute on the SMs something
else leaves). Every number cites its source; all are SI units
(FLOP/s, bytes, bytes/s, seconds).
"""
