"""The fused norm -> RoPE -> quantize -> paged store kernel.

One program handles ``BLOCK_T`` consecutive tokens. Formats and layouts are compile-time
flags; every cache offset comes from ``layout``.
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
    pow2,
    round_to_bf16,
)


@triton.jit
def _store_bytes(page_ptr, p, byte_index, values, mask, BLOCK_SIZE: tl.constexpr,
                 VALUE_BYTES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr):
    """Store value bytes [BLOCK_T, 2, 4, W]; ``byte_index`` [2, 4, W] is the byte in the row."""
    offset = value_offset_tl(p[:, None, None, None], byte_index[None, :, :, :], BLOCK_SIZE,
                             VALUE_BYTES, LAYOUT, N_PER_TILE)
    tl.store(page_ptr[:, None, None, None] + offset, values, mask=mask[:, None, None, None])


@triton.jit
def _store_scales(page_ptr, p, first, scale_bytes, mask, BLOCK_SIZE: tl.constexpr,
                  VALUE_BYTES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr):
    """Store scale bytes [BLOCK_T, W] as the token's scale bytes first .. first + W - 1."""
    W: tl.constexpr = scale_bytes.shape[1]
    i = first + tl.arange(0, W)
    offset = scale_offset_tl(p[:, None], i[None, :], BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
    tl.store(page_ptr[:, None] + offset, scale_bytes, mask=mask[:, None])


@triton.jit
def _split_pairs(half):
    """[T, 2, 4, 8] -> even and odd elements, [T, 2, 4, 4] each (in-thread: no data movement)."""
    T: tl.constexpr = half.shape[0]
    return tl.split(tl.reshape(half.to(tl.float32), [T, 2, 4, 4, 2]))


@triton.jit
def _half_sum_of_squares(x, y):
    """Levels 1-6 of the fixed tree over one 64-element half: [T, 2, 4, 4] pairs -> [T].

    Each level sums an axis of two elements: one addition whatever the hardware's order,
    so every level is exactly the reference's ``x[..., 0::2] + x[..., 1::2]``.
    """
    T: tl.constexpr = x.shape[0]
    s = x * x + y * y  # element pairs
    s = tl.sum(tl.reshape(s, [T, 2, 4, 2, 2]), axis=4)
    s = tl.sum(s, axis=3)  # [T, 2, 4]: 8-element chunks
    s = tl.sum(tl.reshape(s, [T, 2, 2, 2]), axis=3)
    s = tl.sum(s, axis=2)  # [T, 2]: 32-element groups
    return tl.sum(s, axis=1)


@triton.jit
def _fp8_codes(x, y, inv_scale, EXACT_CASTS: tl.constexpr):
    """Scaled e4m3 codes of one half, interleaved back to element order: [T, 2, 4, 8]."""
    T: tl.constexpr = x.shape[0]
    x = x * inv_scale
    y = y * inv_scale
    if EXACT_CASTS:  # the hardware conversion saturates by itself
        x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    codes = tl.join(float_to_e4m3(x, EXACT_CASTS), float_to_e4m3(y, EXACT_CASTS))
    return tl.reshape(codes, [T, 2, 4, 8])


@triton.jit
def _mxfp4_half(x, y):
    """One half's two MXFP4 groups: (packed E2M1 pairs [T, 2, 4, 4], exponents [T, 2])."""
    amax = tl.max(tl.max(tl.maximum(tl.abs(x), tl.abs(y)), axis=3), axis=2)
    e = tl.minimum(tl.maximum(ceil_log2(tl.div_rn(tl.maximum(amax, MXFP4_AMAX_FLOOR), MXFP4_MAX)),
                              -127), 127)
    inv_scale = pow2(-e)[:, :, None, None]
    packed = e2m1_code(x * inv_scale) | (e2m1_code(y * inv_scale) << 4)
    return packed.to(tl.uint8), e


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
    EAGER_LOADS: tl.constexpr,
    EXACT_CASTS: tl.constexpr,
):
    """Each key is two halves of [BLOCK_T, 2, 4, 8]: (token, group of 32, chunk of 8,
    element). A thread owns whole 8-element chunks: one 16-byte load, the GPT-J and E2M1
    pairs inside it, its output bytes contiguous. The high half (dims 64..127) is the RoPE
    half; a group is an MXFP4 scale block.

    ``EAGER_LOADS`` issues the key-row loads together with the slot and position loads
    (latency, at small sizes) instead of after them (no reads of skipped rows: bandwidth,
    at large sizes).
    """
    tl.static_assert(COMPRESS_RATIO == 1 or COMPRESS_RATIO == 2)
    tl.static_assert(not (USE_FP4 and LAYOUT == 1), "the tiled layout is FP8 only")
    tl.static_assert(USE_FP4 or LAYOUT != 2, "the preshuffle layout is MXFP4 only")
    tl.static_assert(LAYOUT != 2 or BLOCK_SIZE % N_PER_TILE == 0)
    tl.static_assert(LAYOUT != 1 or BLOCK_SIZE % 16 == 0)
    VALUE_BYTES: tl.constexpr = 64 if USE_FP4 else 128

    # Token indices are int64 so that every address below is computed in 64 bits.
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = t < num_tokens
    g = tl.arange(0, 2)[:, None, None]
    c = tl.arange(0, 4)[None, :, None]
    element = g * 32 + c * 8 + tl.arange(0, 8)[None, None, :]  # [2, 4, 8], within a half
    row_ptr = k_pre_ptr + t[:, None, None, None] * k_pre_row_stride + element[None]
    if EAGER_LOADS:
        lo = tl.load(row_ptr, mask=in_range[:, None, None, None], other=0.0)
        hi = tl.load(row_ptr + 64, mask=in_range[:, None, None, None], other=0.0)
    slot = tl.load(slot_ptr + t, mask=in_range, other=-1).to(tl.int64)
    pos = tl.load(positions_ptr + t, mask=in_range, other=-1).to(tl.int64)
    w_lo_x, w_lo_y = _split_pairs(tl.load(weight_ptr + element)[None])
    w_hi_x, w_hi_y = _split_pairs(tl.load(weight_ptr + 64 + element)[None])
    group_pos = pos - pos % COMPRESS_RATIO  # pos >= 0 wherever it is used
    # Only group-boundary tokens with an in-range slot and group position are written.
    write = ((slot >= 0) & (slot < num_slots) & (pos >= 0)
             & ((pos + 1) % COMPRESS_RATIO == 0) & (group_pos < max_pos))
    write4 = write[:, None, None, None]
    if not EAGER_LOADS:
        lo = tl.load(row_ptr, mask=write4, other=0.0)
        hi = tl.load(row_ptr + 64, mask=write4, other=0.0)
    # cos/sin of RoPE pair j = 16 * g + 4 * c + q of the high half.
    pair = g * 16 + c * 4 + tl.arange(0, 4)[None, None, :]
    cs_ptr = cos_sin_ptr + group_pos[:, None, None, None] * cos_sin_row_stride + pair[None]
    cos = tl.load(cs_ptr, mask=write4, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + 32, mask=write4, other=0.0).to(tl.float32)
    lo_x, lo_y = _split_pairs(lo)
    hi_x, hi_y = _split_pairs(hi)

    # RMS norm (level 7 of the sum tree adds the halves), then GPT-J RoPE on the high half.
    sum_sq = _half_sum_of_squares(lo_x, lo_y) + _half_sum_of_squares(hi_x, hi_y)
    inv_rms = tl.div_rn(1.0, tl.sqrt_rn(sum_sq * 0.0078125 + eps))[:, None, None, None]
    lo_x = round_to_bf16(lo_x * inv_rms * w_lo_x, EXACT_CASTS)
    lo_y = round_to_bf16(lo_y * inv_rms * w_lo_y, EXACT_CASTS)
    hi_x = round_to_bf16(hi_x * inv_rms * w_hi_x, EXACT_CASTS)
    hi_y = round_to_bf16(hi_y * inv_rms * w_hi_y, EXACT_CASTS)
    hi_x, hi_y = (round_to_bf16(hi_x * cos - hi_y * sin, EXACT_CASTS),
                  round_to_bf16(hi_y * cos + hi_x * sin, EXACT_CASTS))

    page_ptr = cache_ptr + (slot // BLOCK_SIZE) * page_stride
    p = slot % BLOCK_SIZE
    if USE_FP4:
        lo_packed, lo_e = _mxfp4_half(lo_x, lo_y)
        hi_packed, hi_e = _mxfp4_half(hi_x, hi_y)
        packed_index = g * 16 + c * 4 + tl.arange(0, 4)[None, None, :]  # byte within a half
        _store_bytes(page_ptr, p, packed_index, lo_packed, write, BLOCK_SIZE, VALUE_BYTES,
                     LAYOUT, N_PER_TILE)
        _store_bytes(page_ptr, p, 32 + packed_index, hi_packed, write, BLOCK_SIZE, VALUE_BYTES,
                     LAYOUT, N_PER_TILE)
        _store_scales(page_ptr, p, 0, (lo_e + 127).to(tl.uint8), write, BLOCK_SIZE, VALUE_BYTES,
                      LAYOUT, N_PER_TILE)
        _store_scales(page_ptr, p, 2, (hi_e + 127).to(tl.uint8), write, BLOCK_SIZE, VALUE_BYTES,
                      LAYOUT, N_PER_TILE)
    else:
        lo_max = tl.max(tl.max(tl.max(tl.maximum(tl.abs(lo_x), tl.abs(lo_y)), axis=3), axis=2),
                        axis=1)
        hi_max = tl.max(tl.max(tl.max(tl.maximum(tl.abs(hi_x), tl.abs(hi_y)), axis=3), axis=2),
                        axis=1)
        amax = tl.maximum(tl.maximum(lo_max, hi_max), FP8_AMAX_FLOOR)
        e = ceil_log2(tl.div_rn(amax, FP8_MAX))
        inv_scale = pow2(-e)[:, None, None, None]
        _store_bytes(page_ptr, p, element, _fp8_codes(lo_x, lo_y, inv_scale, EXACT_CASTS), write,
                     BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
        _store_bytes(page_ptr, p, 64 + element, _fp8_codes(hi_x, hi_y, inv_scale, EXACT_CASTS),
                     write, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
        i4 = tl.arange(0, 4)[None, :]
        if MX_SCALES:  # four equal UE8M0 bytes
            scale_bytes = tl.broadcast_to((e + 127)[:, None], [BLOCK_T, 4])
        else:  # the fp32 2**e, little-endian
            scale_bytes = (((e + 127) << 23)[:, None] >> (8 * i4)) & 0xFF
        _store_scales(page_ptr, p, 0, scale_bytes.to(tl.uint8), write, BLOCK_SIZE, VALUE_BYTES,
                      LAYOUT, N_PER_TILE)
