"""The share of the s x s score tiles a flash-attention kernel computes: causal (tiles above the diagonal
skipped) and sliding-window (tiles outside the band skipped).

In: a sequence length, a window, and the kernel's tile (``FLASH_TILE``). Out: a fraction of the full matrix's
tiles, which prices the kernel's time (``Op.executed``) while its FLOPs keep Megatron's full-matrix count.
"""

from __future__ import annotations

# FlashAttention-2's tile along the key/value sequence (Dao 2023, Sec. 3.1: block sizes 64 or 128 by head
# dimension; 128 for the head dimension 128 of the presets here).
FLASH_TILE = 128


def causal_fraction(seq_len: int, tile: int = FLASH_TILE) -> float:
    """The share of the s x s score tiles a causal flash-attention kernel computes: of n = ceil(s / tile) tiles per
    row of tiles, the n(n+1)/2 on and below the diagonal (FlashAttention-2, Dao 2023, Sec. 3.1.1: blocks whose
    column indices all exceed their row indices are skipped, "about half of the blocks" at long sequences; the
    diagonal blocks are computed whole and masked). 2048 tokens: 17/32; 8192: 65/128."""
    n = -(-seq_len // tile)
    return (n + 1) / (2 * n)


def window_fraction(seq_len: int, window: int, tile: int = FLASH_TILE) -> float:
    """The share of the s x s score tiles a sliding-window flash-attention kernel computes: query tile i needs the
    key tiles from the one holding token i*tile - window + 1 to its own (FlashAttention-2's window_size, the band
    below the diagonal; tiles wholly outside it are skipped, those it crosses computed and masked). GPT-OSS's
    128-token window at 4096 tokens: (1 + 2 x 31) / 32^2."""
    n = -(-seq_len // tile)
    return sum(i - max(0, (i * tile - window + 1) // tile) + 1 for i in range(n)) / (n * n)
