"""The fused norm -> RoPE -> quantize -> paged store kernel.

One program handles ``BLOCK_T`` consecutive tokens (``BLOCK_T`` token pairs when
``compress_ratio`` is 2, or ``RANGES`` ranges of ``BLOCK_T * compress_ratio`` tokens when
``COMPACT``). Formats and layouts are compile-time flags; every cache offset comes from
``layout``.
"""

import triton
import triton.language as tl

from .. import layout
from ..layout import scale_offset_tl, value_offset_tl
from .dependent_launch import hint_l2, wait_for_previous_kernel
from .numerics import (
    E2M1_X4_MIN_PAIRS,
    TRITON_VERSION,
    ceil_log2_of_ratio,
    e2m1_pairs_to_bytes,
    floats_to_e4m3,
    pow2,
    round_to_bf16_pair,
    widen_to_float32,
)


@triton.jit
def _per_token(v):
    """[T] -> [1, 1, T, 1, 1]: a per-token value against a half-key tensor."""
    return v[None, None, :, None, None]


# Triton lays a load or store out by the contiguity of its addresses: here only the last
# axis (a chunk's elements) is contiguous, and the versions break the tie among the other
# four in opposite orders. Through 3.6 the lanes take the group and chunk axes first, so
# that a token's four lanes are in one warp; later versions take them from the right (the
# chunk's low bit, then the tokens), which puts the chunk's high bit across the warps of
# a 16-token program and every reduction over it through shared memory. So there the
# memory operations address the key axes in reverse order (``_rows``), which the same
# tie-break then spreads as 3.6 spreads the natural order; the values keep their order.
REVERSED_ROWS: tl.constexpr = tl.constexpr(TRITON_VERSION >= (3, 7))


@triton.jit
def _rows(x):
    """A key-shaped [g, c_hi, t, c_lo, w] tensor as its memory operations address it (its
    first four axes reversed where ``REVERSED_ROWS``; the permutation is its own
    inverse)."""
    if REVERSED_ROWS:
        x = tl.permute(x, (3, 2, 1, 0, 4))
    return x


@triton.jit
def _load_rows(ptr, mask, other):
    """``tl.load`` of a key-shaped tensor of pointers, laid out as ``_rows`` says."""
    if mask is None:
        value = tl.load(_rows(ptr))
    else:
        value = tl.load(_rows(ptr), mask=_rows(mask), other=other)
    return _rows(value)


@triton.jit
def _store_rows(ptr, value, mask):
    """``tl.store`` of a key-shaped tensor, laid out as ``_rows`` says."""
    tl.store(_rows(ptr), _rows(value), mask=_rows(mask))


@triton.jit
def _index(G_STEP: tl.constexpr, C_STEP: tl.constexpr, W: tl.constexpr):
    """[2, 2, 1, 2, W] index G_STEP * g + C_STEP * c + w, with chunk c = 2 * c_hi + c_lo."""
    g = tl.arange(0, 2)[:, None, None, None, None]
    c_hi = tl.arange(0, 2)[None, :, None, None, None]
    c_lo = tl.arange(0, 2)[None, None, None, :, None]
    return g * G_STEP + (2 * c_hi + c_lo) * C_STEP + tl.arange(0, W)[None, None, None, None, :]


@triton.jit
def _element_index():
    """Element of a half key at [g, c_hi, 0, c_lo, w]: 32 g + 8 (2 c_hi + c_lo) + w."""
    return _index(layout.MXFP4_GROUP, 8, 8)


@triton.jit
def _pair_index():
    """Element pair (MXFP4 byte, RoPE pair) of a half at [g, c_hi, 0, c_lo, q]."""
    return _index(layout.MXFP4_GROUP // 2, 4, 4)


@triton.jit
def _store_bytes(page_ptr, p, byte_index, values, write, finite,
                 BLOCK_SIZE: tl.constexpr, VALUE_BYTES: tl.constexpr, LAYOUT: tl.constexpr,
                 N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr, SCALE_LANES: tl.constexpr):
    """Store a half's value bytes; ``byte_index`` [2, 2, 1, 2, W] is the byte in the row.
    Written tokens get ``values`` if ``finite``, else zeros: a second store over the first,
    by the same threads (same pointers, same layout) and predicated off for finite keys,
    which costs fewer instructions than a select per byte and no program-wide "any
    poisoned?" reduction (a barrier in every program)."""
    ptr = _per_token(page_ptr) + value_offset_tl(_per_token(p), byte_index, BLOCK_SIZE,
                                                 VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE,
                                                 SCALE_LANES)
    # ``finite`` comes from reductions of the key's own tensors: expanded back, it has
    # their layout, and combining the masks there moves no data between threads.
    _store_rows(ptr, values, _per_token(write))
    _store_rows(ptr, tl.zeros_like(values), _per_token(write & ~finite))


@triton.jit
def _store_scales(page_ptr, p, index, scale_bytes, mask, BLOCK_SIZE: tl.constexpr,
                  VALUE_BYTES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr,
                  D_PER_TILE: tl.constexpr, SCALE_LANES: tl.constexpr):
    """Store scale bytes as the tokens' scale bytes ``index``: both of a half key's rank
    (five axes, the token's the third), so that they keep its layout (a tensor of another
    shape is laid out apart, and the per-token values it needs recomputed for it)."""
    offset = scale_offset_tl(_per_token(p), index, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE,
                             D_PER_TILE, SCALE_LANES)
    _store_rows(_per_token(page_ptr) + offset, scale_bytes, _per_token(mask))


@triton.jit
def _split_pairs(half, EXACT_CASTS: tl.constexpr):
    """[2, 2, T, 2, 8] -> even and odd elements as float32, [2, 2, T, 2, 4] each
    (in-thread)."""
    T: tl.constexpr = half.shape[2]
    return tl.split(tl.reshape(widen_to_float32(half, EXACT_CASTS), [2, 2, T, 2, 4, 2]))


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
def _amax_bits_by_group(x, y, SIGNED_LEVELS: tl.constexpr):
    """The bits of max |x|, |y| over each 32-element group: [2, 2, T, 2, 4] -> [2, T] int32.

    The bits of non-negative floats order as integers as the floats do, and a NaN's lie
    above +inf's: the group's bits are below ``INF_BITS`` iff its elements are all finite,
    and are otherwise those of its amax (a NaN's, or the canonical NaN's). The float levels
    keep a NaN; the integer levels cannot drop it, as a float max may."""
    if SIGNED_LEVELS:
        # Where the native four-byte E2M1 encode follows: it takes |x| as an operand
        # modifier, and were |x| an operand here too, the compiler would compute it once
        # for both, an instruction a value. So the pair's max keeps the sign of x * y, and
        # a mask drops it.
        bits = _max_abs_keeping_sign(x, y).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    else:
        m = tl.maximum(tl.abs(x), tl.abs(y), propagate_nan=tl.PropagateNan.ALL)
        bits = m.to(tl.int32, bitcast=True)
    return tl.max(tl.max(tl.max(bits, axis=4), axis=3), axis=1)


_MAX_ABS_KEEPING_SIGN_PTX: tl.constexpr = tl.constexpr("max.NaN.xorsign.abs.f32 $0, $1, $2;")


@triton.jit
def _max_abs_keeping_sign(a, b):
    """max(|a|, |b|) (NaN if either is) with the sign of a * b: one instruction."""
    return tl.inline_asm_elementwise(_MAX_ABS_KEEPING_SIGN_PTX, "=r,r,r", [a, b],
                                     dtype=tl.float32, is_pure=True, pack=1)


INF_BITS: tl.constexpr = tl.constexpr(0x7F800000)  # float32 +inf
# A poisoned key's MXFP4 or MX scale word: four UE8M0 NaN bytes (0xFF), as an int32.
NAN_SCALE_WORD: tl.constexpr = tl.constexpr(-1)


@triton.jit
def _fp8_codes(x, y, inv_scale, EXACT_CASTS: tl.constexpr):
    """Scaled e4m3 codes of one half, interleaved back to element order: [2, 2, T, 2, 8]."""
    T: tl.constexpr = x.shape[2]
    x = x * inv_scale
    y = y * inv_scale
    if EXACT_CASTS:  # the hardware conversion saturates by itself
        x = tl.minimum(tl.maximum(x, -layout.FP8_MAX), layout.FP8_MAX)
        y = tl.minimum(tl.maximum(y, -layout.FP8_MAX), layout.FP8_MAX)
    return floats_to_e4m3(tl.reshape(tl.join(x, y), [2, 2, T, 2, 8]), EXACT_CASTS)


@triton.jit
def _mxfp4_exponents(amax_bits):
    """Scale exponents ``e`` [2, T] of a half's two groups from their amax bits [2, T]: the
    scale 2**e >= amax / 6 bounds every scaled value by 6, as ``e2m1_code`` needs."""
    amax = tl.maximum(amax_bits.to(tl.float32, bitcast=True), layout.MXFP4_AMAX_FLOOR)
    e = ceil_log2_of_ratio(amax, layout.MXFP4_MAX)
    return tl.minimum(tl.maximum(e, -layout.UE8M0_BIAS), layout.UE8M0_BIAS)  # a UE8M0 byte: 0..254


@triton.jit
def _mxfp4_codes(x, y, e, EXACT_CASTS: tl.constexpr):
    """One half's packed E2M1 pairs [2, 2, T, 2, 4] of its groups' scales 2**e [2, T]."""
    return e2m1_pairs_to_bytes(x, y, e[:, None, :, None, None], EXACT_CASTS)


@triton.jit
def _written(slot, pos, num_slots, max_pos, COMPRESS_RATIO: tl.constexpr):
    """Whether each token writes: a group boundary with an in-range slot and group position.

    In unsigned compares (a negative index is huge): 0 <= slot < num_slots, and pos >= 0
    with pos % ratio == ratio - 1 (the ratio is 1 or 2) and group position pos - (ratio - 1)
    < max_pos."""
    tl.static_assert(COMPRESS_RATIO == 1 or COMPRESS_RATIO == 2)
    pos_end = max_pos.to(tl.int64) + (COMPRESS_RATIO - 1)
    return ((slot.to(tl.uint64) < num_slots.to(tl.uint64))
            & ((pos & (COMPRESS_RATIO - 1)) == COMPRESS_RATIO - 1)
            & (pos.to(tl.uint64) < pos_end.to(tl.uint64)))


@triton.jit
def _load_key(k_pre_ptr, k_pre_row_stride, t, element, mask):
    """The low and high halves of the key rows of tokens ``t`` ([T]), where ``mask``."""
    row_ptr = k_pre_ptr + _per_token(t) * k_pre_row_stride + element
    return (_load_rows(row_ptr, _per_token(mask), 0.0),
            _load_rows(row_ptr + layout.HEAD_DIM // 2, _per_token(mask), 0.0))


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
    LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
    SCALE_LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr,
    EXACT_CASTS: tl.constexpr, GROUP_SCALES: tl.constexpr,
):
    """Everything after the key rows are loaded, for BLOCK_T tokens (one per lane pair).
    ``w_lo``/``w_hi`` are the weight's halves or, when BLOCK_T > 8, both the weight's
    pointer (the halves are loaded here)."""
    VALUE_BYTES: tl.constexpr = layout.MXFP4_VALUE_BYTES if USE_FP4 else layout.FP8_VALUE_BYTES
    HALF: tl.constexpr = layout.HEAD_DIM // 2
    tl.static_assert(layout.ROPE_DIM == HALF, "the high half is the rotated one")
    element = _element_index()
    group_pos = pos - (COMPRESS_RATIO - 1)  # of a token that writes (see _written)
    # cos/sin of RoPE pair j = 16 g + 4 c + q of the high half.
    cs_ptr = cos_sin_ptr + _per_token(group_pos) * cos_sin_row_stride + _pair_index()
    cos = widen_to_float32(_load_rows(cs_ptr, _per_token(write), 0.0), EXACT_CASTS)
    sin = widen_to_float32(_load_rows(cs_ptr + layout.ROPE_DIM // 2, _per_token(write), 0.0),
                           EXACT_CASTS)
    lo_x, lo_y = _split_pairs(lo, EXACT_CASTS)
    hi_x, hi_y = _split_pairs(hi, EXACT_CASTS)
    if lo.dtype != tl.bfloat16:  # float32 or float16 keys: first rounded to bf16
        lo_x, lo_y = round_to_bf16_pair(lo_x, lo_y, EXACT_CASTS)
        hi_x, hi_y = round_to_bf16_pair(hi_x, hi_y, EXACT_CASTS)

    # RMS norm (level 7 of the sum tree adds the halves), then GPT-J RoPE on the high half.
    sum_sq = _half_sum_of_squares(lo_x, lo_y) + _half_sum_of_squares(hi_x, hi_y)
    inv_rms = _per_token(tl.div_rn(1.0, tl.sqrt_rn(sum_sq * (1.0 / layout.HEAD_DIM) + eps)))
    if BLOCK_T > 8:
        # Loaded at the keys' shape, so in their layout: a load at the weight's own shape
        # would be laid out apart and moved through shared memory (barriers).
        KEYS: tl.constexpr = [2, 2, BLOCK_T, 2, 8]
        w_lo = _load_rows(tl.broadcast_to(w_lo + element, KEYS), None, None)
        w_hi = _load_rows(tl.broadcast_to(w_hi + HALF + element, KEYS), None, None)
    w_x, w_y = _split_pairs(w_lo, EXACT_CASTS)
    lo_x, lo_y = round_to_bf16_pair(lo_x * inv_rms * w_x, lo_y * inv_rms * w_y, EXACT_CASTS)
    w_x, w_y = _split_pairs(w_hi, EXACT_CASTS)
    hi_x, hi_y = round_to_bf16_pair(hi_x * inv_rms * w_x, hi_y * inv_rms * w_y, EXACT_CASTS)
    hi_x, hi_y = round_to_bf16_pair(hi_x * cos - hi_y * sin, hi_y * cos + hi_x * sin,
                                    EXACT_CASTS)

    # A key with a NaN or an infinity is stored poisoned: value codes zero, scales NaN.
    SIGNED_LEVELS: tl.constexpr = (USE_FP4 and not EXACT_CASTS
                                   and lo_x.numel >= E2M1_X4_MIN_PAIRS)
    lo_bits = _amax_bits_by_group(lo_x, lo_y, SIGNED_LEVELS)
    hi_bits = _amax_bits_by_group(hi_x, hi_y, SIGNED_LEVELS)
    key_bits = tl.max(tl.maximum(lo_bits, hi_bits), axis=0)
    finite = key_bits < INF_BITS
    # Unsigned: the slot of a token that writes is not negative (see _written).
    unsigned_slot = slot.to(tl.uint64)
    page_ptr = cache_ptr + (unsigned_slot // BLOCK_SIZE).to(tl.int64) * page_stride
    p = (unsigned_slot % BLOCK_SIZE).to(tl.int64)
    if USE_FP4:
        lo_e = _mxfp4_exponents(lo_bits)
        lo_packed = _mxfp4_codes(lo_x, lo_y, lo_e, EXACT_CASTS)
        hi_e = _mxfp4_exponents(hi_bits)
        hi_packed = _mxfp4_codes(hi_x, hi_y, hi_e, EXACT_CASTS)
        packed_index = _pair_index()  # byte within a half
        _store_bytes(page_ptr, p, packed_index, lo_packed, write, finite, BLOCK_SIZE, VALUE_BYTES,
                     LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES)
        _store_bytes(page_ptr, p, VALUE_BYTES // 2 + packed_index, hi_packed, write, finite,
                     BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES)
        if GROUP_SCALES:  # each group's byte from its own exponent
            g = tl.arange(0, 2)[:, None, None, None, None]  # scale byte g of a half
            lo_scales = tl.where(finite[None, :], lo_e + layout.UE8M0_BIAS, layout.UE8M0_NAN)
            hi_scales = tl.where(finite[None, :], hi_e + layout.UE8M0_BIAS, layout.UE8M0_NAN)
            _store_scales(page_ptr, p, g, lo_scales[:, None, :, None, None].to(tl.uint8), write,
                          BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES)
            _store_scales(page_ptr, p, 2 + g, hi_scales[:, None, :, None, None].to(tl.uint8),
                          write, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE,
                          SCALE_LANES)
        else:
            # Scale byte g of the low half is byte g of the word, of the high half byte
            # 2 + g: summed over the group axis (disjoint bits), as the key's amax is reduced.
            g = tl.arange(0, 2)[:, None]
            biased = ((lo_e + layout.UE8M0_BIAS) << (8 * g)
                      | (hi_e + layout.UE8M0_BIAS) << (8 * g + 16))
            scale_word = tl.where(finite, tl.sum(biased, axis=0), NAN_SCALE_WORD)
    else:
        key_amax = key_bits.to(tl.float32, bitcast=True)
        e = ceil_log2_of_ratio(tl.maximum(key_amax, layout.FP8_AMAX_FLOOR), layout.FP8_MAX)
        inv_scale = _per_token(pow2(-e))
        _store_bytes(page_ptr, p, element, _fp8_codes(lo_x, lo_y, inv_scale, EXACT_CASTS), write,
                     finite, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE,
                     D_PER_TILE, SCALE_LANES)
        _store_bytes(page_ptr, p, HALF + element, _fp8_codes(hi_x, hi_y, inv_scale, EXACT_CASTS),
                     write, finite, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE,
                     D_PER_TILE, SCALE_LANES)
        if MX_SCALES:  # four equal UE8M0 bytes
            scale_word = tl.where(finite, (e + layout.UE8M0_BIAS) * 0x01010101, NAN_SCALE_WORD)
        else:  # the fp32 2**e
            scale_word = tl.where(finite, (e + 127) << 23, layout.FP32_NAN_BITS)
    if not GROUP_SCALES:
        # The four scale bytes, little-endian, from one word a token, after the values: a
        # tensor of the keys' rank whose token axis holds what the reductions left, so
        # nothing moves between threads where a thread stores at most one byte.
        i4 = tl.arange(0, layout.SCALE_BYTES)[None, None, None, None, :]
        scale_bytes = (_per_token(scale_word) >> (8 * i4)) & 0xFF
        _store_scales(page_ptr, p, i4, scale_bytes.to(tl.uint8), write, BLOCK_SIZE, VALUE_BYTES,
                      LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES)


@triton.jit
def _compacted_lanes(incl, slot, pos, start, batch, BLOCK_T: tl.constexpr):
    """Lane j of batch b takes the (b * BLOCK_T + j)-th written token of a range whose
    inclusive running count of written tokens is ``incl``: its index is the number of
    tokens whose count is at most b * BLOCK_T + j. Returns (token, slot, position, live)."""
    RANGE: tl.constexpr = incl.shape[0]
    rank = batch * BLOCK_T + tl.arange(0, BLOCK_T)
    src = tl.sum((incl[None, :] <= rank[:, None]).to(tl.int32), axis=1)
    src = tl.minimum(src, RANGE - 1)  # lanes past the last written token (not live)
    live = rank < tl.max(incl, axis=0)
    return start + src, tl.gather(slot, src, 0), tl.gather(pos, src, 0), live


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
    D_PER_TILE: tl.constexpr,
    SCALE_LANES: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    EAGER_LOADS: tl.constexpr,
    COMPACT: tl.constexpr,
    RANGES: tl.constexpr,
    EXACT_CASTS: tl.constexpr,
    USE_PDL: tl.constexpr,
    HINT_AHEAD: tl.constexpr,
    GROUP_SCALES: tl.constexpr,
):
    """A key is two 64-element halves, each held as [2, 2, BLOCK_T, 2, 8]: (group of 32,
    high bit of the 8-element chunk, token, low bit of the chunk, element). The loads lay
    them out (``_rows``): the chunk's eight elements and its low bit in registers, the
    group and high-chunk axes on four lanes of one warp, the tokens on the rest (eight a
    warp), then on the warps. So per-token work (the norm's division, the scale exponent,
    addresses) is done by four lanes, and every reduction over a key is in-thread or a
    shuffle, none through shared memory (``tests/test_store_parity.py``, "one warp");
    one token a warp (latency-bound launches) spreads it over the warp's lanes. Each
    reduction level sums an axis of two, so the tree is the same whatever the spread.
    The high half is the RoPE half; a group is an MXFP4 scale block.

    ``k_pre`` may be bf16, float32 or float16; rows of the latter two are rounded to bf16
    as they are loaded.

    ``EAGER_LOADS`` (for latency-bound launches): a program handles BLOCK_T consecutive
    tokens and issues their key-row loads together with the slot and position loads, so
    that with ``compress_ratio`` 2 it also reads the rows of tokens it skips.

    ``COMPACT``: a program walks ``RANGES`` consecutive ranges of ``BLOCK_T *
    compress_ratio`` tokens. It loads a range's slots and positions while it encodes the
    previous range, so the key-row loads wait for no index load of their own; it then
    hands the range's written tokens to its lanes in order, each lane encoding one, in
    batches of BLOCK_T (one batch for a range with at most BLOCK_T of them). Rows of
    skipped tokens are never read, and no lane encodes a token that is not stored.

    Otherwise, ``compress_ratio`` 1: the same as eager, with each row loaded once its token
    is known to write. ``compress_ratio`` 2: a program covers 2 * BLOCK_T tokens as BLOCK_T
    pairs and does the work only for the tokens that write, about one per pair: a lane pair
    takes the odd token of its pair if it writes, else the even one; pairs where both write
    (positions not consecutive) get a second pass, which re-reads the slots and positions
    rather than keep them live through the first. Rows of skipped tokens are never read.

    A written key with a NaN or an infinity after the norm and the rotation is stored
    poisoned: every value code zero, the scale NaN (fp32 ``0x7FC00000`` or UE8M0 ``0xFF``).

    ``HINT_AHEAD`` > 0 (pairs, NVIDIA only): a program first hints the slots and positions
    of the program that many further on into L2.

    ``GROUP_SCALES`` (MXFP4): store each group's scale byte from its own exponent, instead
    of the token's four from one word. Triton lays the word's bytes out apart (through
    shared memory) where a thread would store more than one of them (BLOCK_T * 4 > 32 *
    num_warps), and the ratio-1 program of 32 tokens on 2 warps then needs more registers
    than with the bytes kept by group (BENCHMARKS.md, "The store").

    ``USE_PDL`` (programmatic dependent launch, sm_90+): the program waits for the previous
    kernel in the stream before touching memory, and lets the next one start launching.
    """
    tl.static_assert(COMPRESS_RATIO == 1 or COMPRESS_RATIO == 2)
    tl.static_assert(not (USE_FP4 and LAYOUT == layout.FP8_TILED), "the tiled layout is FP8 only")
    tl.static_assert(USE_FP4 or LAYOUT != layout.MXFP4_PRESHUFFLE,
                     "the preshuffle layout is MXFP4 only")
    tl.static_assert(LAYOUT != layout.MXFP4_PRESHUFFLE or (
        BLOCK_SIZE % N_PER_TILE == 0 and layout.MXFP4_VALUE_BYTES % D_PER_TILE == 0
        and layout.SCALE_BYTES % SCALE_LANES == 0))
    tl.static_assert(LAYOUT != layout.FP8_TILED or BLOCK_SIZE % layout.TILE_TOKENS == 0)
    tl.static_assert(not (COMPACT and EAGER_LOADS))
    wait_for_previous_kernel(USE_PDL)  # everything below may read what it wrote
    element = _element_index()
    # Latency-bound launches (few tokens per program) start the weight's load first, off
    # the critical path; bandwidth-bound ones load it where it is used, from the bare
    # pointer: values or per-element addresses would hold registers through the program.
    if BLOCK_T <= 8:
        w_lo = tl.load(weight_ptr + element)
        w_hi = tl.load(weight_ptr + layout.HEAD_DIM // 2 + element)
    else:
        w_lo = weight_ptr
        w_hi = weight_ptr
    # Token indices are int64 so that every address below is computed in 64 bits.
    lane = tl.arange(0, BLOCK_T).to(tl.int64)
    if COMPACT:
        # One loop over batches, so that the encode is compiled once: a second copy in the
        # loop would keep more of what the compiler hoists out of it live through both.
        RANGE: tl.constexpr = BLOCK_T * COMPRESS_RATIO
        first = tl.program_id(0).to(tl.int64) * (RANGE * RANGES)
        end = tl.minimum(first + RANGE * RANGES, num_tokens)  # the program's tokens end here
        r = tl.arange(0, RANGE).to(tl.int64)
        slot = _load_index(slot_ptr, first + r, first + r < end)
        pos = _load_index(positions_ptr, first + r, first + r < end)
        next_slot = _load_index(slot_ptr, first + RANGE + r, first + RANGE + r < end)
        next_pos = _load_index(positions_ptr, first + RANGE + r, first + RANGE + r < end)
        it = 0  # the range
        batch = 0  # the batch of its written tokens
        while it < RANGES:
            start = first + it * RANGE
            incl = tl.cumsum(_written(slot, pos, num_slots, max_pos, COMPRESS_RATIO).to(tl.int32),
                             axis=0)
            num_written = tl.max(incl, axis=0)
            if num_written > 0:
                t, lane_slot, lane_pos, live = _compacted_lanes(incl, slot, pos, start, batch,
                                                                BLOCK_T)
                lo, hi = _load_key(k_pre_ptr, k_pre_row_stride, t, element, live)
                _norm_rope_quant_store(lo, hi, lane_slot, lane_pos, live, w_lo, w_hi,
                                       cos_sin_ptr, cos_sin_row_stride, eps, cache_ptr,
                                       page_stride, COMPRESS_RATIO, USE_FP4, MX_SCALES, LAYOUT,
                                       N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_T,
                                       EXACT_CASTS, GROUP_SCALES)
            if (batch + 1) * BLOCK_T < num_written:
                batch += 1  # the range's next batch: more writers than lanes
            else:  # the next range, whose indices were loaded during this one's encode
                it += 1
                batch = 0
                slot = next_slot
                pos = next_pos
                t_next = first + (it + 1) * RANGE + r
                next_slot = _load_index(slot_ptr, t_next, t_next < end)
                next_pos = _load_index(positions_ptr, t_next, t_next < end)
    elif COMPRESS_RATIO == 1 or EAGER_LOADS:
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
                               cos_sin_row_stride, eps, cache_ptr, page_stride, COMPRESS_RATIO,
                               USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES,
                               BLOCK_SIZE, BLOCK_T, EXACT_CASTS, GROUP_SCALES)
    else:
        if HINT_AHEAD > 0:
            # The slots and positions of the program HINT_AHEAD on, into L2: its first
            # round trip then ends on chip (a hint: nothing is read into the program).
            LINES: tl.constexpr = max(2 * BLOCK_T // 16, 1)  # 16 int64 indices a line
            ahead = (tl.program_id(0).to(tl.int64) + HINT_AHEAD) * (2 * BLOCK_T) + 16 * tl.arange(
                0, LINES)
            hint_l2(slot_ptr + ahead, ahead < num_tokens)
            hint_l2(positions_ptr + ahead, ahead < num_tokens)
        t_even = tl.program_id(0).to(tl.int64) * (2 * BLOCK_T) + 2 * lane
        slot_even, pos_even, slot_odd, pos_odd = _load_pair_indices(
            slot_ptr, positions_ptr, t_even, num_tokens)
        write_even = _written(slot_even, pos_even, num_slots, max_pos, COMPRESS_RATIO)
        write_odd = _written(slot_odd, pos_odd, num_slots, max_pos, COMPRESS_RATIO)
        write = write_odd | write_even
        lo, hi = _load_key(k_pre_ptr, k_pre_row_stride, tl.where(write_odd, t_even + 1, t_even),
                           element, write)
        # Reduced at the keys' rank, so that the per-token values keep their layout.
        second_pass = tl.max(tl.reshape(_per_token((write_odd & write_even).to(tl.int32)),
                                        [BLOCK_T]), axis=0) > 0
        _norm_rope_quant_store(lo, hi, tl.where(write_odd, slot_odd, slot_even),
                               tl.where(write_odd, pos_odd, pos_even), write, w_lo, w_hi,
                               cos_sin_ptr, cos_sin_row_stride, eps, cache_ptr, page_stride,
                               COMPRESS_RATIO, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE,
                               D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_T, EXACT_CASTS,
                               GROUP_SCALES)
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
                                   N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_T,
                                   EXACT_CASTS, GROUP_SCALES)
