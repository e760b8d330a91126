"""Megatron-Core's forced load balancing: the busiest expert-parallel rank's load under random top-k routing.

In: the tokens whose token-expert pairs may land on one EP rank's experts (per micro-batch and MoE layer), the
routed experts E, the router's top-k and the EP ranks the experts are split over. Out: the expected busiest rank's
token-expert pairs / the mean (``busiest_rank_load``), >= 1; the same for the distinct tokens DeepEP's receivers
count (``busiest_receiver_tokens``); and the expected maximum of m independent standard normals both are built on
(``expected_max_normal``).

What the router does (Megatron-Core 1e05700595, the commit the ModelZoo's Qwen3-235B rows ran;
``megatron/core/transformer/moe/router.py`` ``TopKRouter.forward``, ``moe_utils.py`` ``RandomSTE``): with
``--moe-router-force-load-balancing`` the gating logits are replaced by ``logits.clone().normal_(generator=...)``,
i.i.d. N(0, 1) per token and expert, from a generator seeded once with ``42 + global rank`` and never reset, so
every forward call (each MoE layer, each micro-batch, a recomputed layer too) draws new logits, independently on
every rank. ``topk_softmax_with_capacity`` then takes ``torch.topk(logits, k)``: the top k of E i.i.d. normals
are a uniformly random k-subset of the experts, each token independently (group-limited routing,
``--moe-router-num-groups``, is not modelled by the simulator and not covered here). Balanced in expectation,
each rank receiving k/ep of the pairs on average, but not exactly: the busiest rank of a layer gets more.

The closed form. Rank j holds L = E/ep experts; one token sends H_j of its k pairs there, H_j hypergeometric
(population E, L successes, k draws): mean k/ep, variance k (L/E)(1 - L/E)(E - k)/(E - 1). Over n independent
tokens the rank's pairs X_j have mean mu = n k/ep and variance sigma^2 = n Var(H); the ep counts always sum to
n k, so they are exchangeable with correlation -1/(ep - 1). For Gaussian X_j with that correlation,
X_j - mu = sigma (Z_j - Zbar) / sqrt(1 - 1/ep) with Z_j i.i.d. N(0, 1), whose maximum has mean
sigma e_ep / sqrt(1 - 1/ep), e_m = E[max of m i.i.d. N(0, 1)] (the central limit theorem over the n tokens;
tests/test_forced_balance.py holds it against a seeded Monte Carlo of the router: it is 1-3% short of the
simulated excess max/mu - 1 at 256-2,048 pairs per rank, the counts' right skew, and 3-5% short at 16). So

    busiest_rank_load = 1 + e_ep sqrt(Var(H) / n) / (k/ep) / sqrt(1 - 1/ep).

The slowest rank sets each layer's pace: the dispatch and combine all-to-alls are synchronous over the EP group
(every rank's combine waits for the slowest rank's expert GEMMs' outputs), so a layer lasts as long as its busiest
rank's grouped GEMMs, and with new logits per micro-batch and layer each layer pays the expected maximum.
"""

from __future__ import annotations

import math
from functools import cache

# Simpson's rule over [-_SPAN, _SPAN] with _STEPS intervals: e_m to 1e-9 for m <= 10^4 (the integrand's tails
# beyond 12 sigma are below 1e-30).
_SPAN = 12.0
_STEPS = 4800


@cache
def expected_max_normal(m: int) -> float:
    """E[max of ``m`` i.i.d. standard normals] = integral of x m phi(x) Phi(x)^(m-1) dx, by Simpson's rule (0 for
    m = 1; 1/sqrt(pi) for m = 2, 3/(2 sqrt(pi)) for m = 3; the tests hold others to Harter's 1961 table)."""
    if m < 1:
        raise ValueError(f"m: {m} normals; need at least 1")
    if m == 1:
        return 0.0
    h = 2 * _SPAN / _STEPS
    total = 0.0
    for i in range(_STEPS + 1):
        x = -_SPAN + i * h
        weight = 1 if i in (0, _STEPS) else (4 if i % 2 else 2)
        density = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        total += weight * x * m * density * cdf ** (m - 1)
    return total * h / 3


def busiest_rank_load(tokens: float, experts: int, topk: int, ranks: int) -> float:
    """Expected token-expert pairs of the busiest of ``ranks`` EP ranks / the mean, when ``tokens`` tokens each route
    to a uniformly random ``topk``-subset of ``experts`` experts (Megatron-Core's forced load balancing; the
    closed form of the module docstring). 1 with one rank, with topk = experts (every rank gets each token's L
    pairs) or with no tokens."""
    if ranks < 1 or experts % ranks or not 1 <= topk <= experts:
        raise ValueError(f"ranks: {ranks} EP ranks, {experts} experts, top-{topk}: need ranks dividing experts and "
                         "1 <= topk <= experts")
    if ranks == 1 or tokens <= 0:
        return 1.0
    share = 1 / ranks  # L/E: one rank's share of the experts
    pair_variance = topk * share * (1 - share) * (experts - topk) / max(experts - 1, 1)
    mean = topk * share  # pairs per token on one rank
    return 1.0 + expected_max_normal(ranks) * math.sqrt(pair_variance / tokens) / mean / math.sqrt(1 - share)


def busiest_receiver_tokens(tokens: float, experts: int, topk: int, groups: int, receivers: int) -> float:
    """Expected distinct tokens of the busiest of ``receivers`` receivers / the mean, when each receiver counts the
    ``tokens`` tokens (random top-k, as ``busiest_rank_load``) that reach its group of experts, one of ``groups``
    equal groups; what DeepEP moves (a token once per destination node over RDMA, once per destination rank over
    NVLink; sim.network.deepep). Per token, a group is reached with q = 1 - C(E - E/G, k)/C(E, k), and two groups
    both with 1 - 2 C(E - E/G, k)/C(E, k) + C(E - 2E/G, k)/C(E, k); in the Gaussian limit the busiest of m
    receivers with that variance v = q(1 - q) and covariance c gets 1 + e_m sqrt((v - c)/n) / q. Receivers that
    count other tokens (DeepEP's RDMA receivers of another local index) are independent, not correlated by c: the
    form then slightly overstates the maximum. 1 with one group or no tokens."""
    if groups < 1 or experts % groups or not 1 <= topk <= experts or receivers < 1:
        raise ValueError(f"groups: {groups} groups of {experts} experts, top-{topk}, {receivers} receivers: need "
                         "groups dividing experts, 1 <= topk <= experts and a receiver")
    if groups == 1 or tokens <= 0 or receivers == 1:
        return 1.0
    size, total = experts // groups, math.comb(experts, topk)
    miss = math.comb(experts - size, topk) / total  # the token reaches none of one group's experts
    miss_both = math.comb(experts - 2 * size, topk) / total
    reach = 1 - miss
    variance = reach * (1 - reach)
    covariance = (1 - 2 * miss + miss_both) - reach * reach
    return 1.0 + expected_max_normal(receivers) * math.sqrt(max(variance - covariance, 0.0) / tokens) / reach
