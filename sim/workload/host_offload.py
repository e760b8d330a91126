"""Work on the host and the PCIe copies to it: ZeRO-Offload's Adam step and activation offload.

In: a ``Plan`` (the node's PCIe link, ``offload.host_bandwidth``, weight bytes per parameter, a layer's stashed
bytes), parameters, bytes or a layer, and for the on-GPU copy a cost model. Out: seconds of a host <-> GPU copy
(``pcie_seconds``), of a layer's activations offloaded or brought back (``activation_copy_seconds``) and their copy
into Transformer Engine's buffer (``offload_buffer_copy_seconds``; docs/mechanisms/activation_offload.md), of the
host Adam step (``host_adam_seconds``; Ren et al. ATC 2021) and the weights copied back after it
(``weights_to_gpu_bytes``). The emitters and the estimate read them.
"""

from __future__ import annotations

from sim.costs.models import ADAM_BYTES_PER_PARAM, CostModel
from sim.network.collectives import p2p_time
from sim.plan import Plan


def pcie_seconds(plan: Plan, nbytes: float) -> float:
    """A host <-> GPU copy over the node's PCIe link: latency + bytes / effective rate."""
    pcie = plan.scenario.cluster.pcie
    return p2p_time(nbytes, pcie.latency, pcie.effective_bandwidth)


def activation_copy_seconds(plan: Plan, layer: int) -> float:
    """Activation offload: one PCIe copy of ``layer``'s activations of one micro-batch (to the host after its
    forward, back before its backward; Transformer Engine's CPU offload handler copies every saved tensor of the
    layer, which is what the layer stashes)."""
    return pcie_seconds(plan, plan.stash_bytes(layer))


def offload_buffer_copy_seconds(plan: Plan, layer: int, costs: CostModel) -> float:
    """Activation offload: the on-GPU copy of ``layer``'s saved tensors into Transformer Engine's ping-pong buffer
    before the PCIe copy, on the compute stream (TE 1.x ``AsyncDoubleBufferGroupOffloadHandler.tensor_push``:
    ``tensor_buf.copy_(tensor)`` as each tensor is saved): the stash read and written once through HBM, priced as
    one memory-bound kernel (one per saved tensor in TE; their launches overlap the layer's own kernels)."""
    return costs.memory_time(2 * plan.stash_bytes(layer))


def host_adam_seconds(plan: Plan, params: float) -> float:
    """ZeRO-Offload's Adam on the host: the step's bytes per parameter (sim.costs.models) over the host memory
    bandwidth a GPU gets (``offload.host_bandwidth``)."""
    return ADAM_BYTES_PER_PARAM * params / plan.scenario.offload.host_bandwidth


def weights_to_gpu_bytes(plan: Plan, params: float) -> float:
    """Bytes of updated compute-dtype weights copied back to the GPU after the host step."""
    return params * plan.weight_bytes_per_param
