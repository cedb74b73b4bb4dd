"""The cache format: its numbers and its page layouts, each defined here once.

A cache is a uint8 tensor ``[num_blocks, block_size, row_bytes]``, possibly a strided
view into larger (padded) pages. Slot ``s`` lives in block ``s // block_size`` at
position ``p = s % block_size``. A block's bytes start at ``block * k_cache.stride(0)``
and are *segregated*: first the value bytes of all its tokens, then their scale bytes,
then whatever padding the page has (never touched)::

    [ values: block_size * VALUE_BYTES ][ scales: block_size * SCALE_BYTES ][ pad ]

How the value and scale bytes of one token are spread inside those regions depends on
the layout:

* ``ROW_MAJOR``: token ``p``'s value byte ``d`` at ``p * VALUE_BYTES + d``, its scale
  byte ``i`` at ``p * SCALE_BYTES + i`` of the scale region.
* ``FP8_TILED`` (ROCm, FP8 only): tiles of 16 tokens x 16 bytes; scales row-major.
* ``MXFP4_PRESHUFFLE`` (ROCm, MXFP4 only): the operand order of aiter's paged MXFP4
  MQA-logits kernel, three numbers: ``n_per_tile``, ``d_per_tile``, ``scale_lanes``. A
  page is cut into runs of ``n_per_tile`` tokens; a run stores chunk 0 (``d_per_tile``
  bytes) of every token, then chunk 1, ... (``[chunk, token, byte]``), and its tokens'
  four scales as ``[scale % scale_lanes, token, scale // scale_lanes]``.

``value_offset`` and ``scale_offset`` are plain integer arithmetic, so the same source
serves three callers: the pure-torch reference (on int64 tensors), the Triton kernels
(through ``value_offset_tl``/``scale_offset_tl``, where the layout arguments are
compile-time constants) and the readers.

The constants are plain Python numbers: the reference and the host code compute with
them. Kernels read them as attributes of this module (``layout.HEAD_DIM``), which Triton
resolves to constants when it compiles; the two offset functions, which run in both
worlds, read them by name (see ``_compiled``).
"""

from __future__ import annotations

import types

import triton
import triton.language as tl

# ------------------------------------------------------------------------------ a key
HEAD_DIM = 128  # elements of a key
ROPE_DIM = 64  # the rotated dims: the last ROPE_DIM, as ROPE_DIM // 2 interleaved pairs

# -------------------------------------------------------------------------- formats
SCALE_BYTES = 4  # per token: an fp32 scale, four UE8M0 copies of it, or four block scales
FP8_VALUE_BYTES = HEAD_DIM  # one e4m3fn code per element
MXFP4_VALUE_BYTES = HEAD_DIM // 2  # two E2M1 codes per byte, element 2b in the low nibble
MXFP4_GROUP = 32  # elements per MXFP4 (UE8M0) scale
FP8_MAX = 448.0  # largest e4m3fn magnitude
FP8_AMAX_FLOOR = 1e-4  # a key's amax is at least this (an all-zero key gets a finite scale)
MXFP4_MAX = 6.0  # largest E2M1 magnitude
MXFP4_AMAX_FLOOR = MXFP4_MAX * 2.0**-126  # a group's amax floor: its exponent stays >= -126
UE8M0_BIAS = 127  # a UE8M0 byte is e + 127 for the scale 2**e
# A written key with a non-finite value is stored poisoned: every value code zero and its
# scale NaN, so that it dequantizes to NaN wherever it is read.
FP32_NAN_BITS = 0x7FC00000  # the FP8 fp32 scale of a poisoned key
UE8M0_NAN = 0xFF  # every UE8M0 scale byte of a poisoned key

# The cache formats by name, as (use_fp4_cache, mx_scales).
FORMATS = {"fp8": (False, False), "fp8-mx": (False, True), "mxfp4": (True, False)}

# --------------------------------------------------------------------------- layouts
ROW_MAJOR = 0
FP8_TILED = 1
MXFP4_PRESHUFFLE = 2

TILE_TOKENS = 16  # FP8_TILED: tokens of a tile
TILE_BYTES = 16  # FP8_TILED: bytes of each token in a tile
# MXFP4_PRESHUFFLE: vLLM's order, the default of the two later parameters, is 16-byte
# chunks and scales spread over a 64-lane ROCm wavefront: scale_lanes = 64 // n_per_tile
# (each of the scale_lanes * n_per_tile lanes reading 4 // scale_lanes bytes).
MXFP4_D_PER_TILE = 16
ROCM_WAVEFRONT = 64
# The n_per_tile for which that default is an order (64 // n divides 4): the MFMA N of
# the MQA-logits kernels. With scale_lanes given, any n dividing block_size is one.
MXFP4_TILE_CHOICES = (16, 32, 64)


def value_bytes(use_fp4_cache: bool) -> int:
    """Value bytes of one token: 128 FP8 codes or 64 bytes of packed E2M1 pairs."""
    return MXFP4_VALUE_BYTES if use_fp4_cache else FP8_VALUE_BYTES


def cache_row_bytes(use_fp4_cache: bool) -> int:
    """The last dimension of ``k_cache``: value bytes plus 4 scale bytes (132 or 68)."""
    return value_bytes(use_fp4_cache) + SCALE_BYTES


def choose_layout(use_fp4_cache: bool, shuffle: bool, block_size: int) -> int:
    """The layout code for a cache; ``shuffle`` asks for the ROCm order.

    As on ROCm, a block of one token is always row-major (every order agrees there).
    Argument checking (tile divisibility, the MXFP4 tile parameters) is done by the caller.
    """
    if not shuffle or block_size == 1:
        return ROW_MAJOR
    return MXFP4_PRESHUFFLE if use_fp4_cache else FP8_TILED


def default_scale_lanes(n_per_tile: int) -> int:
    """vLLM's ``scale_lanes`` for a tile of ``n_per_tile`` tokens (0 when n > 64)."""
    return ROCM_WAVEFRONT // n_per_tile


def value_offset(p, d, BLOCK_SIZE: tl.constexpr, VALUE_BYTES: tl.constexpr,
                 LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr,
                 D_PER_TILE: tl.constexpr = MXFP4_D_PER_TILE, SCALE_LANES: tl.constexpr = 0):
    """Byte offset, inside its block, of value byte ``d`` of the token at position ``p``.

    ``N_PER_TILE``, ``D_PER_TILE`` and ``SCALE_LANES`` are the MXFP4 preshuffle's (any
    values elsewhere); ``SCALE_LANES`` 0 stands for vLLM's ``64 // N_PER_TILE``."""
    if LAYOUT == FP8_TILED:  # [p // 16][d // 16][p % 16][d % 16]
        off = ((p // TILE_TOKENS) * (TILE_TOKENS * VALUE_BYTES)
               + (d // TILE_BYTES) * (TILE_TOKENS * TILE_BYTES)
               + (p % TILE_TOKENS) * TILE_BYTES + d % TILE_BYTES)
    elif LAYOUT == MXFP4_PRESHUFFLE:  # [p // n][d // D][p % n][d % D]
        off = ((p // N_PER_TILE) * (N_PER_TILE * VALUE_BYTES)
               + (d // D_PER_TILE) * (N_PER_TILE * D_PER_TILE)
               + (p % N_PER_TILE) * D_PER_TILE + d % D_PER_TILE)
    else:  # ROW_MAJOR
        off = p * VALUE_BYTES + d
    return off


def scale_offset(p, i, BLOCK_SIZE: tl.constexpr, VALUE_BYTES: tl.constexpr,
                 LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr,
                 D_PER_TILE: tl.constexpr = MXFP4_D_PER_TILE, SCALE_LANES: tl.constexpr = 0):
    """Byte offset, inside its block, of scale byte ``i`` (0..3) of the token at ``p``."""
    if LAYOUT == MXFP4_PRESHUFFLE:  # [p // n][i % L][p % n][i // L]
        if SCALE_LANES == 0:
            LANES: tl.constexpr = ROCM_WAVEFRONT // N_PER_TILE
        else:
            LANES: tl.constexpr = SCALE_LANES
        off = (BLOCK_SIZE * VALUE_BYTES + (p // N_PER_TILE) * (N_PER_TILE * SCALE_BYTES)
               + (i % LANES) * (N_PER_TILE * (SCALE_BYTES // LANES))
               + (p % N_PER_TILE) * (SCALE_BYTES // LANES) + i // LANES)
    else:
        off = BLOCK_SIZE * VALUE_BYTES + p * SCALE_BYTES + i
    return off


def _compiled(fn):
    """``triton.jit(fn)`` for a function of this module that reads its constants by name.

    A Triton kernel may read a module global only if it is a ``tl.constexpr`` object, and
    torch cannot compute with those. So the plain function (the reference's) reads the
    plain numbers, and the compiled one runs the same code with each number of this
    module wrapped in ``tl.constexpr`` under the same name. (Triton's CPU interpreter runs
    the plain function: Python reads plain numbers.)"""
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(triton.jit(fn), InterpretedFunction):
        return triton.jit(fn)
    scope = dict(fn.__globals__)
    scope.update((name, tl.constexpr(value)) for name, value in fn.__globals__.items()
                 if name.isupper() and type(value) in (int, float))
    return triton.jit(types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__))


# The same two functions, compiled into the Triton kernels.
value_offset_tl = _compiled(value_offset)
scale_offset_tl = _compiled(scale_offset)
