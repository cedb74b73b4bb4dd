"""The fused norm -> RoPE -> quantize -> paged store kernel.

One program handles ``BLOCK_T`` consecutive tokens. Each 128-wide key is held as four
[BLOCK_T, 32] tensors: the even and odd elements of its low half (dims 0..63, passed
through RoPE untouched) and of its high half (dims 64..127, rotated in GPT-J pairs).
That split makes the RoPE pairs, the MXFP4 nibble pairs and the first level of the
sum-of-squares tree all the same element-wise operation.

Formats and layouts are compile-time flags; all offsets come from ``layout``.
"""

import triton
import triton.language as tl

from ..layout import scale_offset_tl, value_offset_tl
from .numerics import (
    FP8_AMAX_FLOOR,
    FP8_MAX,
    MXFP4_AMAX_FLOOR,
    MXFP4_MAX,
    ceil_log2,
    e2m1_code,
    float_to_e4m3,
    pair_tree_sum32,
    pow2,
    round_to_bf16,
)


@triton.jit
def _store_values(page_ptr, p, d, values, mask, BLOCK_SIZE: tl.constexpr,
                  VALUE_BYTES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr):
    offset = value_offset_tl(p[:, None], d[None, :], BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
    tl.store(page_ptr[:, None] + offset, values, mask=mask[:, None])


@triton.jit
def _store_scales(page_ptr, p, i, scales, mask, BLOCK_SIZE: tl.constexpr,
                  VALUE_BYTES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr):
    offset = scale_offset_tl(p[:, None], i[None, :], BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
    tl.store(page_ptr[:, None] + offset, scales, mask=mask[:, None])


@triton.jit
def _interleave(x, y):
    """Two [R, 32] tensors -> [R, 64] with x at even and y at odd columns."""
    R: tl.constexpr = x.shape[0]
    return tl.reshape(tl.join(x, y), [R, 64])


@triton.jit
def _mxfp4_groups(x, y, EXACT_CASTS: tl.constexpr):
    """One 64-wide half as even/odd [R, 32] -> (packed bytes [R, 32], scale exponents [R, 2]).

    The half holds two MXFP4 groups of 32 elements: pairs 0..15 and pairs 16..31.
    """
    R: tl.constexpr = x.shape[0]
    pair_max = tl.reshape(tl.maximum(tl.abs(x), tl.abs(y)), [R, 2, 16])
    amax = tl.maximum(tl.max(pair_max, axis=2), MXFP4_AMAX_FLOOR)
    e = tl.minimum(tl.maximum(ceil_log2(tl.div_rn(amax, MXFP4_MAX)), -127), 127)
    inv_scale = pow2(-e)[:, :, None]
    x_codes = e2m1_code(tl.reshape(tl.reshape(x, [R, 2, 16]) * inv_scale, [R, 32]))
    y_codes = e2m1_code(tl.reshape(tl.reshape(y, [R, 2, 16]) * inv_scale, [R, 32]))
    return (x_codes | (y_codes << 4)).to(tl.uint8), e


# Sizes are only compared against: specializing on their values would only add variants.
@triton.jit(do_not_specialize=["max_pos", "num_slots", "num_tokens"])
def indexer_k_store_kernel(
    k_pre_ptr, k_pre_row_stride,
    positions_ptr,
    cos_sin_ptr, cos_sin_row_stride, max_pos,
    weight_ptr, eps,
    cache_ptr, page_stride, num_slots,
    slot_ptr, num_tokens,
    COMPRESS_RATIO: tl.constexpr,
    USE_FP4: tl.constexpr,
    MX_SCALES: tl.constexpr,
    LAYOUT: tl.constexpr,
    N_PER_TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    EXACT_CASTS: tl.constexpr,
):
    tl.static_assert(COMPRESS_RATIO == 1 or COMPRESS_RATIO == 2)
    tl.static_assert(not (USE_FP4 and LAYOUT == 1), "the tiled layout is FP8 only")
    tl.static_assert(USE_FP4 or LAYOUT != 2, "the preshuffle layout is MXFP4 only")
    tl.static_assert(LAYOUT != 2 or BLOCK_SIZE % N_PER_TILE == 0)
    tl.static_assert(LAYOUT != 1 or BLOCK_SIZE % 16 == 0)
    VALUE_BYTES: tl.constexpr = 64 if USE_FP4 else 128

    # Token indices are int64 so that every address below is computed in 64 bits.
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = t < num_tokens
    slot = tl.load(slot_ptr + t, mask=in_range, other=-1).to(tl.int64)
    pos = tl.load(positions_ptr + t, mask=in_range, other=-1).to(tl.int64)
    group_pos = pos - pos % COMPRESS_RATIO  # pos >= 0 wherever it is used
    # Only group-boundary tokens with an in-range slot and group position are written;
    # nothing else is read past this point.
    write = ((slot >= 0) & (slot < num_slots) & (pos >= 0)
             & ((pos + 1) % COMPRESS_RATIO == 0) & (group_pos < max_pos))

    j = tl.arange(0, 32)
    row = k_pre_ptr + t[:, None] * k_pre_row_stride
    cols = tl.arange(0, 64)[None, :]
    lo_x, lo_y = tl.split(tl.reshape(tl.load(row + cols, mask=write[:, None], other=0.0)
                                     .to(tl.float32), [BLOCK_T, 32, 2]))
    hi_x, hi_y = tl.split(tl.reshape(tl.load(row + 64 + cols, mask=write[:, None], other=0.0)
                                     .to(tl.float32), [BLOCK_T, 32, 2]))
    cs = cos_sin_ptr + group_pos[:, None] * cos_sin_row_stride + j[None, :]
    cos = tl.load(cs, mask=write[:, None], other=0.0).to(tl.float32)
    sin = tl.load(cs + 32, mask=write[:, None], other=0.0).to(tl.float32)
    w_lo_x = tl.load(weight_ptr + 2 * j).to(tl.float32)[None, :]
    w_lo_y = tl.load(weight_ptr + 2 * j + 1).to(tl.float32)[None, :]
    w_hi_x = tl.load(weight_ptr + 64 + 2 * j).to(tl.float32)[None, :]
    w_hi_y = tl.load(weight_ptr + 65 + 2 * j).to(tl.float32)[None, :]

    # RMS norm. The sum of squares is the reference's tree: pairs, then halving.
    sum_sq = (pair_tree_sum32(lo_x * lo_x + lo_y * lo_y)
              + pair_tree_sum32(hi_x * hi_x + hi_y * hi_y))
    inv_rms = tl.div_rn(1.0, tl.sqrt_rn(sum_sq * 0.0078125 + eps))[:, None]
    lo_x = round_to_bf16(lo_x * inv_rms * w_lo_x, EXACT_CASTS)
    lo_y = round_to_bf16(lo_y * inv_rms * w_lo_y, EXACT_CASTS)
    hi_x = round_to_bf16(hi_x * inv_rms * w_hi_x, EXACT_CASTS)
    hi_y = round_to_bf16(hi_y * inv_rms * w_hi_y, EXACT_CASTS)
    # GPT-J RoPE on the high half at the group's position.
    rot_x = round_to_bf16(hi_x * cos - hi_y * sin, EXACT_CASTS)
    rot_y = round_to_bf16(hi_y * cos + hi_x * sin, EXACT_CASTS)

    page_ptr = cache_ptr + (slot // BLOCK_SIZE) * page_stride
    p = slot % BLOCK_SIZE
    i = tl.arange(0, 2)
    if USE_FP4:
        lo_bytes, lo_e = _mxfp4_groups(lo_x, lo_y, EXACT_CASTS)
        hi_bytes, hi_e = _mxfp4_groups(rot_x, rot_y, EXACT_CASTS)
        _store_values(page_ptr, p, j, lo_bytes, write, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
        _store_values(page_ptr, p, 32 + j, hi_bytes, write, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                      N_PER_TILE)
        _store_scales(page_ptr, p, i, (lo_e + 127).to(tl.uint8), write, BLOCK_SIZE, VALUE_BYTES,
                      LAYOUT, N_PER_TILE)
        _store_scales(page_ptr, p, 2 + i, (hi_e + 127).to(tl.uint8), write, BLOCK_SIZE,
                      VALUE_BYTES, LAYOUT, N_PER_TILE)
    else:
        amax = tl.max(tl.maximum(tl.maximum(tl.abs(lo_x), tl.abs(lo_y)),
                                 tl.maximum(tl.abs(rot_x), tl.abs(rot_y))), axis=1)
        e = ceil_log2(tl.div_rn(tl.maximum(amax, FP8_AMAX_FLOOR), FP8_MAX))
        inv_scale = pow2(-e)[:, None]
        lo = _interleave(lo_x, lo_y) * inv_scale
        hi = _interleave(rot_x, rot_y) * inv_scale
        lo_bytes = float_to_e4m3(tl.minimum(tl.maximum(lo, -FP8_MAX), FP8_MAX), EXACT_CASTS)
        hi_bytes = float_to_e4m3(tl.minimum(tl.maximum(hi, -FP8_MAX), FP8_MAX), EXACT_CASTS)
        d = tl.arange(0, 64)
        _store_values(page_ptr, p, d, lo_bytes, write, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
        _store_values(page_ptr, p, 64 + d, hi_bytes, write, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                      N_PER_TILE)
        i4 = tl.arange(0, 4)
        if MX_SCALES:  # four equal UE8M0 bytes
            scale_bytes = tl.broadcast_to((e + 127)[:, None], [BLOCK_T, 4])
        else:  # the fp32 2**e, little-endian
            bits = ((e + 127) << 23)[:, None]
            scale_bytes = (bits >> (8 * i4[None, :])) & 0xFF
        _store_scales(page_ptr, p, i4, scale_bytes.to(tl.uint8), write, BLOCK_SIZE, VALUE_BYTES,
                      LAYOUT, N_PER_TILE)
