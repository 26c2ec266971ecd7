"""Which (query, key) pairs attention computes, for the NumPy and JAX trainers (torch-free).

The rule is worker/trainers/torch/model.attention_mask's: never the future (j <= i); local: only inside i's block
of `window` tokens; sliding: only the last `window` tokens, i itself included.

The trainers do not compute a dense (T, T) score matrix for local and sliding attention: they cut
the sequence into blocks of `window` queries, and each block attends to the keys that can matter,
so the work falls with the window:
    full     one block of T queries against all T keys (causal mask)           T * T pairs
    local    T / window blocks, each against its own block's keys              T * window
    sliding  each block against its own and the previous block's keys          T * 2 * window
             (masked so that j <= i and i - j < window)
A sequence that is not a multiple of `window` is padded at the end; a padded key sits in the
future of every real query (masked), a padded query's output is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def dense_mask(kind: str, seq_len: int, window: int) -> np.ndarray:
    """(T, T) bool, True where query i may attend to key j: the reference the blocks are tested against."""
    i = np.arange(seq_len)[:, None]
    j = np.arange(seq_len)[None, :]
    mask = j <= i
    if kind == "local":
        mask &= (i // window) == (j // window)
    elif kind == "sliding":
        mask &= (i - j) < window
    return mask


@dataclass(frozen=True)
class BlockLayout:
    """How a sequence of seq_len tokens is cut into query blocks and which keys each block sees."""

    kind: str
    seq_len: int
    window: int
    block: int  # queries per block (T for full attention, `window` otherwise)
    n_blocks: int
    key_blocks: int  # 1: the block's own keys; 2 (sliding): the previous block's too

    @property
    def padded_len(self) -> int:
        return self.block * self.n_blocks

    @property
    def keys(self) -> int:
        """Keys per query block."""
        return self.key_blocks * self.block

    def mask(self) -> np.ndarray:
        """(n_blocks, block, keys) bool: query i = b * block + r may see key j = (b - key_blocks + 1)
        * block + c when j >= 0 and the dense rule allows (i, j)."""
        b = np.arange(self.n_blocks)[:, None, None]
        i = b * self.block + np.arange(self.block)[None, :, None]
        j = (b - self.key_blocks + 1) * self.block + np.arange(self.keys)[None, None, :]
        allowed = (j >= 0) & (j <= i)
        if self.kind == "local":
            allowed &= (i // self.window) == (j // self.window)
        elif self.kind == "sliding":
            allowed &= (i - j) < self.window
        return allowed

    def additive_mask(self, dtype=np.float32) -> np.ndarray:
        """mask() as 0 where allowed and -inf elsewhere, to add to the scores before the softmax."""
        return np.where(self.mask(), 0.0, -np.inf).astype(dtype)

    def pairs(self) -> int:
        """(query, key) pairs computed per head and sequence, masked ones included: the real cost."""
        return self.padded_len * self.keys


def block_layout(kind: str, seq_len: int, window: int) -> BlockLayout:
    """Blocks of `window` queries for local/sliding attention; one block of the whole sequence for full
    attention, or where the window spans the sequence (then every rule but causality is moot)."""
    if kind == "full" or window >= seq_len:
        return BlockLayout(kind, seq_len, window, seq_len, 1, 1)
    n_blocks = -(-seq_len // window)
    return BlockLayout(kind, seq_len, window, window, n_blocks, 2 if kind == "sliding" else 1)
