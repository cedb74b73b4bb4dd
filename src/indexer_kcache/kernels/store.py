"""The fused norm -> RoPE -> quantize -> paged store kernel.

One program handles ``BLOCK_T`` consecutive tokens (``BLOCK_T`` token pairs when
``compress_ratio`` is 2). Formats and layouts are compile-time flags; every cache offset
comes from ``layout``.
"""

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from ..layout import scale_offset_tl, value_offset_tl
from .numerics import (
    FP8_AMAX_FLOOR,
    FP8_MAX,
    MXFP4_AMAX_FLOOR,
    MXFP4_MAX,
    ceil_log2_of_ratio,
    e2m1_pair,
    float_to_e4m3,
    pow2,
    round_to_bf16_pair,
)


@triton.jit
def _per_token(v):
    """[T] -> [1, 1, T, 1, 1]: a per-token value against a half-key tensor."""
    return v[None, None, :, None, None]


@triton.jit
def _index(G_STEP: tl.constexpr, C_STEP: tl.constexpr, W: tl.constexpr):
    """[2, 2, 1, 2, W] index G_STEP * g + C_STEP * c + w, with chunk c = 2 * c_hi + c_lo."""
    g = tl.arange(0, 2)[:, None, None, None, None]
    c_hi = tl.arange(0, 2)[None, :, None, None, None]
    c_lo = tl.arange(0, 2)[None, None, None, :, None]
    return g * G_STEP + (2 * c_hi + c_lo) * C_STEP + tl.arange(0, W)[None, None, None, None, :]


@triton.jit
def _store_bytes(page_ptr, p, byte_index, values, mask, BLOCK_SIZE: tl.constexpr,
                 VALUE_BYTES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr):
    """Store a half's value bytes; ``byte_index`` [2, 2, 1, 2, W] is the byte in the row."""
    offset = value_offset_tl(_per_token(p), byte_index, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                             N_PER_TILE)
    tl.store(_per_token(page_ptr) + offset, values, mask=_per_token(mask))


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
    """[2, 2, T, 2, 8] -> even and odd elements, [2, 2, T, 2, 4] each (in-thread)."""
    T: tl.constexpr = half.shape[2]
    return tl.split(tl.reshape(half.to(tl.float32), [2, 2, T, 2, 4, 2]))


@triton.jit
def _half_sum_of_squares(x, y):
    """Levels 1-6 of the fixed tree over one 64-element half: [2, 2, T, 2, 4] pairs -> [T].

    Element 32 g + 16 c_hi + 8 c_lo + 2 q + b sits at [g, c_hi, t, c_lo, q] (b: x or y), so
    summing the axes from the lowest bit up is the adjacent-pairs tree. Each level sums an
    axis of two elements: one addition whatever the hardware's order, exactly the
    reference's ``x[..., 0::2] + x[..., 1::2]``.
    """
    T: tl.constexpr = x.shape[2]
    s = x * x + y * y  # b
    s = tl.sum(tl.reshape(s, [2, 2, T, 2, 2, 2]), axis=5)  # q bit 0
    s = tl.sum(s, axis=4)  # q bit 1
    s = tl.sum(s, axis=3)  # c_lo
    s = tl.sum(s, axis=1)  # c_hi
    return tl.sum(s, axis=0)  # g


@triton.jit
def _amax_by_group(x, y):
    """max |x|, |y| over each 32-element group: [2, 2, T, 2, 4] -> [2, T]."""
    m = tl.maximum(tl.abs(x), tl.abs(y))
    return tl.max(tl.max(tl.max(m, axis=4), axis=3), axis=1)


@triton.jit
def _fp8_codes(x, y, inv_scale, EXACT_CASTS: tl.constexpr):
    """Scaled e4m3 codes of one half, interleaved back to element order: [2, 2, T, 2, 8]."""
    T: tl.constexpr = x.shape[2]
    x = x * inv_scale
    y = y * inv_scale
    if EXACT_CASTS:  # the hardware conversion saturates by itself
        x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    codes = tl.join(float_to_e4m3(x, EXACT_CASTS), float_to_e4m3(y, EXACT_CASTS))
    return tl.reshape(codes, [2, 2, T, 2, 8])


@triton.jit
def _mxfp4_half(x, y, EXACT_CASTS: tl.constexpr):
    """One half's two MXFP4 groups: (packed E2M1 pairs [2, 2, T, 2, 4], exponents [2, T]).
    The scale 2**e >= amax / 6 bounds every scaled value by 6, as ``e2m1_code`` needs."""
    amax = tl.maximum(_amax_by_group(x, y), MXFP4_AMAX_FLOOR)
    e = tl.minimum(tl.maximum(ceil_log2_of_ratio(amax, MXFP4_MAX), -127), 127)
    inv_scale = pow2(-e)[:, None, :, None, None]
    packed = e2m1_pair(x * inv_scale, y * inv_scale, EXACT_CASTS)
    return packed.to(tl.uint8), e


@triton.jit
def _written(slot, pos, num_slots, max_pos, COMPRESS_RATIO: tl.constexpr):
    """Whether each token writes: a group boundary with an in-range slot and group position."""
    group_pos = pos - pos % COMPRESS_RATIO  # only used where pos >= 0
    return ((slot >= 0) & (slot < num_slots) & (pos >= 0)
            & ((pos + 1) % COMPRESS_RATIO == 0) & (group_pos < max_pos))


@triton.jit
def _load_key(k_pre_ptr, k_pre_row_stride, t, element, mask):
    """The low and high halves of the key rows of tokens ``t`` ([T]), where ``mask``."""
    row_ptr = k_pre_ptr + _per_token(t) * k_pre_row_stride + element
    return (tl.load(row_ptr, mask=_per_token(mask), other=0.0),
            tl.load(row_ptr + 64, mask=_per_token(mask), other=0.0))


@triton.jit
def _load_index(ptr, t, in_range):
    return tl.load(ptr + t, mask=in_range, other=-1).to(tl.int64)


@triton.jit
def _load_pair_indices(slot_ptr, positions_ptr, t_even, num_tokens):
    """Slots and positions of the token pairs (t_even, t_even + 1)."""
    t_odd = t_even + 1
    return (_load_index(slot_ptr, t_even, t_even < num_tokens),
            _load_index(positions_ptr, t_even, t_even < num_tokens),
            _load_index(slot_ptr, t_odd, t_odd < num_tokens),
            _load_index(positions_ptr, t_odd, t_odd < num_tokens))


@triton.jit
def _norm_rope_quant_store(
    lo, hi, slot, pos, write, w_lo, w_hi,
    cos_sin_ptr, cos_sin_row_stride, eps, cache_ptr, page_stride,
    COMPRESS_RATIO: tl.constexpr, USE_FP4: tl.constexpr, MX_SCALES: tl.constexpr,
    LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, EXACT_CASTS: tl.constexpr,
):
    """Everything after the key rows are loaded, for BLOCK_T tokens (one per lane pair).
    ``w_lo``/``w_hi`` are the weight's halves or, when BLOCK_T > 8, both the weight's
    pointer (the halves are loaded here)."""
    VALUE_BYTES: tl.constexpr = 64 if USE_FP4 else 128
    element = _index(32, 8, 8)  # within a half
    group_pos = pos - pos % COMPRESS_RATIO
    # cos/sin of RoPE pair j = 16 g + 4 c + q of the high half.
    cs_ptr = cos_sin_ptr + _per_token(group_pos) * cos_sin_row_stride + _index(16, 4, 4)
    cos = tl.load(cs_ptr, mask=_per_token(write), other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + 32, mask=_per_token(write), other=0.0).to(tl.float32)
    lo_x, lo_y = _split_pairs(lo)
    hi_x, hi_y = _split_pairs(hi)

    # RMS norm (level 7 of the sum tree adds the halves), then GPT-J RoPE on the high half.
    sum_sq = _half_sum_of_squares(lo_x, lo_y) + _half_sum_of_squares(hi_x, hi_y)
    inv_rms = _per_token(tl.div_rn(1.0, tl.sqrt_rn(sum_sq * 0.0078125 + eps)))
    if BLOCK_T > 8:
        w_lo = tl.load(w_lo + element)
        w_hi = tl.load(w_hi + 64 + element)
    w_x, w_y = _split_pairs(w_lo)
    lo_x, lo_y = round_to_bf16_pair(lo_x * inv_rms * w_x, lo_y * inv_rms * w_y, EXACT_CASTS)
    w_x, w_y = _split_pairs(w_hi)
    hi_x, hi_y = round_to_bf16_pair(hi_x * inv_rms * w_x, hi_y * inv_rms * w_y, EXACT_CASTS)
    hi_x, hi_y = round_to_bf16_pair(hi_x * cos - hi_y * sin, hi_y * cos + hi_x * sin,
                                    EXACT_CASTS)

    page_ptr = cache_ptr + (slot // BLOCK_SIZE) * page_stride
    p = slot % BLOCK_SIZE
    if USE_FP4:
        lo_packed, lo_e = _mxfp4_half(lo_x, lo_y, EXACT_CASTS)
        hi_packed, hi_e = _mxfp4_half(hi_x, hi_y, EXACT_CASTS)
        packed_index = _index(16, 4, 4)  # byte within a half
        _store_bytes(page_ptr, p, packed_index, lo_packed, write, BLOCK_SIZE, VALUE_BYTES,
                     LAYOUT, N_PER_TILE)
        _store_bytes(page_ptr, p, 32 + packed_index, hi_packed, write, BLOCK_SIZE, VALUE_BYTES,
                     LAYOUT, N_PER_TILE)
        _store_scales(page_ptr, p, 0, tl.trans(lo_e + 127).to(tl.uint8), write, BLOCK_SIZE,
                      VALUE_BYTES, LAYOUT, N_PER_TILE)
        _store_scales(page_ptr, p, 2, tl.trans(hi_e + 127).to(tl.uint8), write, BLOCK_SIZE,
                      VALUE_BYTES, LAYOUT, N_PER_TILE)
    else:
        lo_max = tl.max(_amax_by_group(lo_x, lo_y), axis=0)
        hi_max = tl.max(_amax_by_group(hi_x, hi_y), axis=0)
        e = ceil_log2_of_ratio(tl.maximum(tl.maximum(lo_max, hi_max), FP8_AMAX_FLOOR), FP8_MAX)
        inv_scale = _per_token(pow2(-e))
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
    USE_PDL: tl.constexpr,
):
    """A key is two 64-element halves, each held as [2, 2, BLOCK_T, 2, 8]: (group of 32,
    high bit of the 8-element chunk, token, low bit of the chunk, element). Triton spreads
    the axes over lanes and warps from the right: with 16 tokens a warp, two lanes share a
    token, each holding four 16-byte chunks per half, so per-token work (the norm's
    division, the scale exponent, addresses) is done by two lanes and all but one level of
    the reductions are in-thread; 32 tokens over 4 warps split each token's chunks between
    two warps as well (half the registers, so more warps in flight, for one reduction
    level through shared memory); one token a warp spreads it over all 32 lanes (the
    shortest chain for latency-bound launches). Each reduction level sums an axis of two,
    so the tree is the same whatever the spread. The high half is the RoPE half; a group
    is an MXFP4 scale block.

    ``EAGER_LOADS`` (for latency-bound launches): a program handles BLOCK_T consecutive
    tokens and issues their key-row loads together with the slot and position loads, so
    that with ``compress_ratio`` 2 it also reads the rows of tokens it skips.

    Otherwise, ``compress_ratio`` 1: the same, with each row loaded once its token is known
    to write. ``compress_ratio`` 2: a program covers 2 * BLOCK_T tokens as BLOCK_T pairs and
    does the work only for the tokens that write, about one per pair: a lane pair takes the
    odd token of its pair if it writes, else the even one; pairs where both write
    (positions not consecutive) get a second pass, which re-reads the slots and positions
    rather than keep them live through the first. Rows of skipped tokens are never read.

    ``USE_PDL`` (programmatic dependent launch, sm_90+): the program waits for the previous
    kernel in the stream before touching memory, and lets the next one start launching.
    """
    tl.static_assert(COMPRESS_RATIO == 1 or COMPRESS_RATIO == 2)
    tl.static_assert(not (USE_FP4 and LAYOUT == 1), "the tiled layout is FP8 only")
    tl.static_assert(USE_FP4 or LAYOUT != 2, "the preshuffle layout is MXFP4 only")
    tl.static_assert(LAYOUT != 2 or BLOCK_SIZE % N_PER_TILE == 0)
    tl.static_assert(LAYOUT != 1 or BLOCK_SIZE % 16 == 0)
    if USE_PDL:  # everything below may read what the previous kernel wrote
        tl_cuda.gdc_wait()
        tl_cuda.gdc_launch_dependents()
    element = _index(32, 8, 8)  # within a half
    # Latency-bound launches (few tokens per program) start the weight's load first, off
    # the critical path; bandwidth-bound ones load it where it is used, from the bare
    # pointer: values or per-element addresses would hold registers through the program.
    if BLOCK_T <= 8:
        w_lo = tl.load(weight_ptr + element)
        w_hi = tl.load(weight_ptr + 64 + element)
    else:
        w_lo = weight_ptr
        w_hi = weight_ptr
    # Token indices are int64 so that every address below is computed in 64 bits.
    lane = tl.arange(0, BLOCK_T).to(tl.int64)
    if COMPRESS_RATIO == 1 or EAGER_LOADS:
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + lane
        in_range = t < num_tokens
        if EAGER_LOADS:
            lo, hi = _load_key(k_pre_ptr, k_pre_row_stride, t, element, in_range)
        slot = _load_index(slot_ptr, t, in_range)
        pos = _load_index(positions_ptr, t, in_range)
        write = _written(slot, pos, num_slots, max_pos, COMPRESS_RATIO)
        if not EAGER_LOADS:
            lo, hi = _load_key(k_pre_ptr, k_pre_row_stride, t, element, write)
        _norm_rope_quant_store(lo, hi, slot, pos, write, w_lo, w_hi, cos_sin_ptr,
                               cos_sin_row_stride, eps, cache_ptr, page_stride, COMPRESS_RATIO, USE_FP4,
                               MX_SCALES, LAYOUT, N_PER_TILE, BLOCK_SIZE, BLOCK_T, EXACT_CASTS)
    else:
        t_even = tl.program_id(0).to(tl.int64) * (2 * BLOCK_T) + 2 * lane
        slot_even, pos_even, slot_odd, pos_odd = _load_pair_indices(
            slot_ptr, positions_ptr, t_even, num_tokens)
        write_even = _written(slot_even, pos_even, num_slots, max_pos, COMPRESS_RATIO)
        write_odd = _written(slot_odd, pos_odd, num_slots, max_pos, COMPRESS_RATIO)
        write = write_odd | write_even
        lo, hi = _load_key(k_pre_ptr, k_pre_row_stride, tl.where(write_odd, t_even + 1, t_even),
                           element, write)
        second_pass = tl.max((write_odd & write_even).to(tl.int32), axis=0) > 0
        _norm_rope_quant_store(lo, hi, tl.where(write_odd, slot_odd, slot_even),
                               tl.where(write_odd, pos_odd, pos_even), write, w_lo, w_hi,
                               cos_sin_ptr, cos_sin_row_stride, eps, cache_ptr, page_stride,
                               COMPRESS_RATIO, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE,
                               BLOCK_SIZE, BLOCK_T, EXACT_CASTS)
        if second_pass:
            # Re-read the (cached) indices rather than keep them live through the first
            # pass: the register budget of one pass is what sets the programs in flight.
            slot_even, pos_even, slot_odd, pos_odd = _load_pair_indices(
                slot_ptr, positions_ptr, t_even, num_tokens)
            both = (_written(slot_even, pos_even, num_slots, max_pos, COMPRESS_RATIO)
                    & _written(slot_odd, pos_odd, num_slots, max_pos, COMPRESS_RATIO))
            lo, hi = _load_key(k_pre_ptr, k_pre_row_stride, t_even, element, both)
            _norm_rope_quant_store(lo, hi, slot_even, pos_even, both, w_lo, w_hi,
                                   cos_sin_ptr, cos_sin_row_stride, eps, cache_ptr,
                                   page_stride, COMPRESS_RATIO, USE_FP4, MX_SCALES, LAYOUT,
                                   N_PER_TILE, BLOCK_SIZE, BLOCK_T, EXACT_CASTS)
