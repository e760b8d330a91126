"""The ``training.sequence`` section: supervised fine-tuning inputs, their document lengths and packing.

In: the YAML keys ``training.sequence.packing`` (documents concatenated into ``training.seq_len``-token rows, or
each document padded to it), ``lengths`` (fixed, uniform or a histogram of document lengths) with ``length``,
``min_len`` or ``histogram``. Out: the validated spec, and ``length_stats``: the moments of the document lengths
(truncated at seq_len, as tokenizers truncate to model_max_length) that the plan turns into model tokens per row,
the attention work of a row and MFU's model FLOPs.

Sources:
- Padding: Hugging Face's ``padding="max_length"`` pads every sample to model_max_length (the Qwen fine-tuning
  script's preprocess); the linear layers compute the pad tokens. With FlashAttention-2, transformers unpads the
  batch by its attention mask (``_upad_input`` into ``flash_attn_varlen_func``), so attention costs each document
  its own s_i^2.
- Packing: documents concatenated into rows of seq_len (Megatron's GPT dataset, HF ``group_texts``; torchtune's
  PackedDataset with its per-document mask), every row token a document token. Attention per document
  (``flash_attn_varlen_func`` with ``cu_seqlens``, Dao 2023): a row of n documents costs sum s_i^2, not seq_len^2;
  without flash attention the row's full s x s matrix is computed and masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.model.flash_tiles import FLASH_TILE


class SequenceSpec(FrozenSpec):
    """Document lengths of a fine-tuning data set and how they fill a ``seq_len`` row (default: every row one
    document of seq_len tokens, the pretraining case)."""

    packing: bool = Field(default=False, description=(
        "true: documents concatenated into seq_len-token rows (no padding; attention per document with flash "
        "attention's varlen kernel); false: each document padded to seq_len"))
    lengths: Literal["fixed", "uniform", "histogram"] = Field(default="fixed", description=(
        "document length distribution: fixed (every document ``length`` tokens), uniform (min_len..seq_len), or "
        "histogram ([[length, weight], ...]); lengths above seq_len are truncated to it"))
    length: int | None = Field(default=None, ge=1, description="lengths fixed: tokens per document (default seq_len)")
    min_len: int = Field(default=1, ge=1, description="lengths uniform: the shortest document")
    histogram: list[tuple[int, float]] = Field(default_factory=list, description=(
        "lengths histogram: [[tokens, weight], ...], weights relative (e.g. counts of a data set's documents)"))
    split_across_pack: bool = Field(default=True, description=(
        "packing: true: a document that overflows a row continues in the next (Megatron's GPT dataset, HF "
        "group_texts), every row full; false: it starts the next row and the row's tail is padding (torchtune's "
        "PackedDataset default, greedy in data order; the padding is one more sequence of the row)"))

    @property
    def default(self) -> bool:
        """Rows of one seq_len document each: nothing changes from the pretraining step."""
        return not self.packing and self.lengths == "fixed" and self.length is None and self.split_across_pack


@dataclass(frozen=True)
class LengthStats:
    """Moments of the document lengths (tokens, truncated at seq_len): mean E[s], mean square E[s^2], and the
    share of the s_i x s_i score tiles a causal flash kernel computes, weighted by s_i^2."""

    mean: float
    mean_square: float
    causal_share: float


def length_stats(spec: SequenceSpec, seq_len: int) -> LengthStats:
    """The moments of ``spec``'s document lengths truncated at ``seq_len`` (closed sums over the distribution)."""
    if spec.lengths == "uniform":
        return _uniform_stats(min(spec.min_len, seq_len), seq_len)
    if spec.lengths == "fixed":
        lengths, weights = np.array([min(spec.length or seq_len, seq_len)], float), np.array([1.0])
    else:
        lengths = np.minimum(np.array([n for n, _ in spec.histogram], float), seq_len)
        weights = np.array([w for _, w in spec.histogram], float)
    p = weights / weights.sum()
    square = float(p @ lengths**2)
    tiles = np.ceil(lengths / FLASH_TILE)
    causal = float(p @ (lengths**2 * (tiles + 1) / (2 * tiles))) / square  # sim.model.flash_tiles.causal_fraction
    return LengthStats(mean=float(p @ lengths), mean_square=square, causal_share=causal)


@dataclass(frozen=True)
class PackStats:
    """A greedy packed row's long-run averages (``split_across_pack: false``): documents per row, and the padding
    that ends it: its mean, mean square and its causal flash tiles' work (sum of pad^2 x causal_fraction(pad))."""

    documents_per_row: float
    pad_mean: float
    pad_mean_square: float
    pad_causal_work: float


def pack_stats(spec: SequenceSpec, seq_len: int) -> PackStats:
    """Greedy packing without splitting (torchtune ``PackedDataset``, ``split_across_pack=False``: documents are
    appended in data order while they fit; the first that does not starts the next pack, and the pack is padded
    to seq_len, the padding added as one more entry of its ``seq_lens``). With i.i.d. lengths p (truncated at
    seq_len S), rows are renewal cycles: a row that starts with a document of length l visits level x with
    probability f = r * u, where r is the first document's length distribution and u the renewal sequence
    u = 1 / (1 - P(z)) up to z^S (the chance the partial sums hit x); from level x the row closes when the next
    document is longer than S - x, with padding S - x, and that document starts the next row:
    r'(l) = p(l) sum over x > S - l of f(x). r is the fixed point of r -> r' (iterated until it moves less than
    1e-13). Then documents per row = sum f, and the padding's moments follow from f(x) P(L > S - x)."""
    probabilities = _length_probabilities(spec, seq_len)
    size = 1 << int(np.ceil(np.log2(2 * seq_len + 2)))
    renewal = _renewal(probabilities, seq_len, size)
    tail = np.concatenate([np.cumsum(probabilities[::-1])[::-1], [0.0]])  # tail[k] = P(L >= k)
    levels = np.arange(seq_len + 1)
    closes = tail[seq_len - levels + 1]  # P(L > S - x)
    start = probabilities.copy()
    visits = np.zeros(seq_len + 1)
    renewal_spectrum = np.fft.rfft(renewal, size)
    for _ in range(10_000):
        visits = np.maximum(np.fft.irfft(np.fft.rfft(start, size) * renewal_spectrum, size), 0.0)[: seq_len + 1]
        beyond = np.concatenate([np.cumsum(visits[::-1])[::-1], [0.0]])  # beyond[k] = sum of visits[x >= k]
        following = probabilities * beyond[np.minimum(seq_len - levels + 1, seq_len + 1)]
        following[0] = 0.0
        following /= following.sum()
        moved = float(np.abs(following - start).sum())
        start = following
        if moved < 1e-13:
            break
    closing = visits * closes
    closing /= closing.sum()
    pad = (seq_len - levels).astype(float)
    tiles = np.maximum(np.ceil(pad / FLASH_TILE), 1)
    return PackStats(documents_per_row=float(visits.sum()), pad_mean=float(closing @ pad),
                     pad_mean_square=float(closing @ pad**2),
                     pad_causal_work=float(closing @ (pad**2 * (tiles + 1) / (2 * tiles))))


def _length_probabilities(spec: SequenceSpec, seq_len: int) -> np.ndarray:
    """P(L = l) for l = 0..seq_len, lengths truncated at seq_len."""
    probabilities = np.zeros(seq_len + 1)
    if spec.lengths == "uniform":
        low = min(spec.min_len, seq_len)
        probabilities[low:] = 1.0
    elif spec.lengths == "fixed":
        probabilities[min(spec.length or seq_len, seq_len)] = 1.0
    else:
        for length, weight in spec.histogram:
            probabilities[min(length, seq_len)] += weight
    return probabilities / probabilities.sum()


def _renewal(probabilities: np.ndarray, seq_len: int, size: int) -> np.ndarray:
    """u[0..S] with u[0] = 1 and u[x] = sum_l p(l) u[x - l]: 1 / (1 - P(z)) as a power series, by Newton's
    iteration g <- g (2 - (1 - P) g), doubling the correct terms each round (O(S log S))."""
    one_minus = -probabilities.copy()
    one_minus[0] += 1.0
    inverse = np.array([1.0 / one_minus[0]])
    terms = 1
    while terms < seq_len + 1:
        terms = min(2 * terms, seq_len + 1)
        points = min(size, 1 << int(np.ceil(np.log2(2 * terms))))  # the round's products, without wrap-around
        spectrum = np.fft.rfft(inverse, points)
        product = np.fft.irfft(np.fft.rfft(one_minus[:terms], points) * spectrum, points)[:terms]
        correction = -product
        correction[0] += 2.0
        inverse = np.fft.irfft(spectrum * np.fft.rfft(correction, points), points)[:terms]
    return np.maximum(inverse, 0.0)


def _uniform_stats(low: int, high: int) -> LengthStats:
    """``length_stats`` of lengths uniform over low..high in closed sums, grouped by flash tiles (lengths with the
    same tile count n share causal_fraction (n + 1) / 2n), so the work is high / 128 terms, not high."""
    count = high - low + 1
    mean = (low + high) / 2

    def squares(n: np.ndarray) -> np.ndarray:  # 1^2 + ... + n^2
        return n * (n + 1) * (2 * n + 1) / 6

    square = (high * (high + 1) * (2 * high + 1) - (low - 1) * low * (2 * low - 1)) / 6 / count
    tiles = np.arange(-(-low // FLASH_TILE), -(-high // FLASH_TILE) + 1, dtype=np.float64)
    first = np.maximum((tiles - 1) * FLASH_TILE + 1, low)
    last = np.minimum(tiles * FLASH_TILE, high)
    weighted = (squares(last) - squares(first - 1)) * (tiles + 1) / (2 * tiles)
    return LengthStats(mean=mean, mean_square=square, causal_share=float(weighted.sum()) / count / square)


def check_sequence(spec: SequenceSpec, seq_len: int) -> None:
    """The section's rules; each message starts with the field it concerns."""
    if spec.lengths == "histogram":
        if not spec.histogram:
            raise ValueError("training.sequence.histogram: lengths histogram needs [[tokens, weight], ...] rows")
        bad = next(((n, w) for n, w in spec.histogram if n < 1 or w < 0), None)
        if bad is not None:
            raise ValueError(f"training.sequence.histogram: row {list(bad)} needs tokens >= 1 and weight >= 0")
        if sum(w for _, w in spec.histogram) <= 0:
            raise ValueError("training.sequence.histogram: the weights sum to 0")
    elif spec.histogram:
        raise ValueError(f"training.sequence.histogram: needs lengths: histogram (got {spec.lengths})")
    if not spec.split_across_pack and not spec.packing:
        raise ValueError("training.sequence.split_across_pack: false needs packing: true (padded rows hold one "
                         "document each)")
    if spec.length is not None and spec.lengths != "fixed":
        raise ValueError(f"training.sequence.length: needs lengths: fixed (got {spec.lengths})")
    if spec.lengths == "uniform" and spec.min_len > seq_len:
        raise ValueError(f"training.sequence.min_len: {spec.min_len} exceeds training.seq_len {seq_len}")
