"""The page layout of the indexer K cache: the one place its offsets are defined.

A cache is a uint8 tensor ``[num_blocks, block_size, row_bytes]``, possibly a strided
view into larger (padded) pages. Slot ``s`` lives in block ``s // block_size`` at
position ``p = s % block_size``. A block's bytes start at ``block * k_cache.stride(0)``
and are *segregated*: first the value bytes of all its tokens, then their scale bytes,
then whatever padding the page has (never touched)::

    [ values: block_size * VALUE_BYTES ][ scales: block_size * 4 ][ pad ]

How the value (and, for the MXFP4 preshuffle, scale) bytes of one token are spread
inside those regions depends on the layout:

* ``ROW_MAJOR``: token ``p``'s value byte ``d`` at ``p * VALUE_BYTES + d``.
* ``FP8_TILED`` (ROCm, FP8 only): tiles of 16 tokens x 16 bytes.
* ``MXFP4_PRESHUFFLE`` (ROCm, MXFP4 only): the dot-operand order of a paged MXFP4
  MQA-logits kernel whose MFMA N is ``n_per_tile`` (16, 32 or 64).

``value_offset`` and ``scale_offset`` are plain integer arithmetic, so the same source
serves three callers: the pure-torch reference (on int64 tensors), the Triton kernels
(through the ``triton.jit`` wrappers at the bottom, where the layout arguments are
compile-time constants) and the readers.
"""

from __future__ import annotations

import triton
import triton.language as tl

HEAD_DIM = 128
SCALE_BYTES = 4
FP8_VALUE_BYTES = HEAD_DIM
MXFP4_VALUE_BYTES = HEAD_DIM // 2
MXFP4_GROUP = 32
TILE_TOKENS = 16
MXFP4_TILE_CHOICES = (16, 32, 64)

# The cache formats by name, as (use_fp4_cache, mx_scales).
FORMATS = {"fp8": (False, False), "fp8-mx": (False, True), "mxfp4": (True, False)}

ROW_MAJOR = 0
FP8_TILED = 1
MXFP4_PRESHUFFLE = 2


def value_bytes(use_fp4_cache: bool) -> int:
    """Value bytes of one token: 128 FP8 codes or 64 bytes of packed E2M1 pairs."""
    return MXFP4_VALUE_BYTES if use_fp4_cache else FP8_VALUE_BYTES


def cache_row_bytes(use_fp4_cache: bool) -> int:
    """The last dimension of ``k_cache``: value bytes plus 4 scale bytes (132 or 68)."""
    return value_bytes(use_fp4_cache) + SCALE_BYTES


def choose_layout(use_fp4_cache: bool, shuffle: bool, block_size: int) -> int:
    """The layout code for a cache; ``shuffle`` asks for the ROCm order.

    As on ROCm, a block of one token is always row-major (every order agrees there).
    Argument checking (tile divisibility, the MXFP4 tile parameter) is done by the caller.
    """
    if not shuffle or block_size == 1:
        return ROW_MAJOR
    return MXFP4_PRESHUFFLE if use_fp4_cache else FP8_TILED


def value_offset(p, d, BLOCK_SIZE: tl.constexpr, VALUE_BYTES: tl.constexpr,
                 LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr):
    """Byte offset, inside its block, of value byte ``d`` of the token at position ``p``."""
    if LAYOUT == 1:  # FP8_TILED: [p // 16][d // 16][p % 16][d % 16]
        off = (p // 16) * (16 * VALUE_BYTES) + (d // 16) * 256 + (p % 16) * 16 + d % 16
    elif LAYOUT == 2:  # MXFP4_PRESHUFFLE: [p // n][d // 16][p % n][d % 16]
        off = ((p // N_PER_TILE) * (N_PER_TILE * 64) + (d // 16) * (N_PER_TILE * 16)
               + (p % N_PER_TILE) * 16 + d % 16)
    else:  # ROW_MAJOR
        off = p * VALUE_BYTES + d
    return off


def scale_offset(p, i, BLOCK_SIZE: tl.constexpr, VALUE_BYTES: tl.constexpr,
                 LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr):
    """Byte offset, inside its block, of scale byte ``i`` (0..3) of the token at ``p``."""
    if LAYOUT == 2:  # MXFP4_PRESHUFFLE: S_LO = 64 // n scale bytes interleave over n tokens
        off = (BLOCK_SIZE * VALUE_BYTES + (p // N_PER_TILE) * (N_PER_TILE * 4)
               + (i % (64 // N_PER_TILE)) * (N_PER_TILE * (4 // (64 // N_PER_TILE)))
               + (p % N_PER_TILE) * (4 // (64 // N_PER_TILE)) + i // (64 // N_PER_TILE))
    else:
        off = BLOCK_SIZE * VALUE_BYTES + p * 4 + i
    return off


# The same two functions, compiled into the Triton kernels.
value_offset_tl = triton.jit(value_offset)
scale_offset_tl = triton.jit(scale_offset)
