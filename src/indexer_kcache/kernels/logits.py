"""Paged MQA logits: every query row of a sequence scored against the keys in the cache.

    logits[b * NEXT_N + i, t] = sum_h w[b * NEXT_N + i, h] * relu(q[b, i, h, :] . K[b, t, :])

Program ``(s, g)`` takes rows ``g * ROWS ..`` of one sequence and a contiguous range of
``chunk`` positions (``s``-th of the sequence), ``BLOCK_N`` keys at a time. Keys are the
dot's M dimension: a tile ``[BLOCK_N, 128]`` times each row's ``q^T [128, heads]`` gives
``[BLOCK_N, heads]``; relu, the row's head weights and a sum over the heads leave one
logit per key. Each key tile is read once for all the program's rows.

Two ways to compute, chosen by ``NATIVE``:

* portable (the CPU interpreter, GPUs without FP8 dots): keys and queries decoded to
  float32 with their scales (``numerics``' exact conversions), one float32 dot;
* native (NVIDIA sm_89 and newer): FP8 keys and e4m3 queries meet in one FP8 dot; bf16
  queries in a bf16 dot (e4m3 and E2M1 values are exact in bf16); per-32-dim scales
  (MXFP4 keys, scaled queries) as four K=32 dots whose float32 partial sums are scaled
  before they are added. MXFP4 keys are decoded in registers, four at a time in 32-bit
  words: an E2M1 code ``c`` becomes the e4m3 byte ``((c & 7) << 2) | ((c & 8) << 4)``,
  the same value times 2**-6 exactly (subnormals included); the 2**6 is folded into the
  head weights. FP8 key scales are positive powers of two, applied once per key after the
  relu and the head sum. Scaled queries are first tried with each head's largest scale
  factored out into its weight and the rest folded into e4m3 query values (``_q_folded``):
  when that is exact for all the program's rows (the usual case for MXFP4 queries), they
  are scored like unscaled e4m3 queries; otherwise with a dot per group.

A NaN scale (UE8M0 byte 255, or an fp32 NaN) gives NaN logits for its key. Positions whose
block id is outside ``[0, num_blocks)`` are never read and score ``-inf``. Nothing outside
the tensors is read or written: every load and store is masked, offsets are int64.
"""

import os

import triton
import triton.language as tl

from ..layout import scale_offset_tl, value_offset_tl
from .numerics import e2m1_to_float, e4m3_to_float, pow2, ue8m0_to_float

# Query forms (``Q_FORM``).
Q_BF16 = 0
Q_E4M3 = 1
Q_E4M3_MX = 2  # e4m3 values with per-32-dim UE8M0 scales
Q_MXFP4 = 3  # packed E2M1 pairs with per-32-dim UE8M0 scales
MAX_ROWS = 4  # query rows a program scores together (the unrolled row slots below)
# The native path decodes MXFP4 keys with inline PTX; under the CPU interpreter (which runs
# no PTX) the same bytes come from integer operations, so that tests can run that path.
_PTX_DECODE: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")

# Both nibbles of four packed bytes at once, as e4m3 bytes: ``$0`` gets the low nibbles
# (elements 2b), ``$1`` the high ones (2b + 1). ``v`` holds a code's magnitude in bits
# 2-4 and its sign in bit 5; adding twice the sign bit's value (3 * 0x20 = 0x20 + 0x40)
# carries it to bit 7 without touching the neighbouring byte.
_E2M1_TO_E4M3_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 v, s;
shl.b32 v, $2, 2;
and.b32 v, v, 0x3C3C3C3C;
and.b32 s, v, 0x20202020;
mad.lo.u32 $0, s, 3, v;
shr.b32 v, $2, 2;
and.b32 v, v, 0x3C3C3C3C;
and.b32 s, v, 0x20202020;
mad.lo.u32 $1, s, 3, v;
}
""")


@triton.jit
def _relu(x):
    """max(x, 0) that keeps NaN (a poisoned key must not score 0)."""
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _e2m1_code_to_e4m3(code):
    """E2M1 code (int32, 0..15) -> the e4m3 byte of the same value times 2**-6."""
    return (((code & 7) << 2) | ((code & 8) << 4)).to(tl.uint8)


@triton.jit
def _mxfp4_group_order(p):
    """Dim (0..31, within a group) that position ``p`` of a decoded key group holds.

    A decoded group is built from 32-bit words of four packed bytes: word ``j`` gives the
    low nibbles of its bytes (dims 8j, 8j+2, 8j+4, 8j+6) then the high ones (8j+1, ...),
    so position 8j + 4w + m holds dim 8j + 2m + w. Queries are loaded in the same order:
    a dot product does not care about the order of its K dimension.
    """
    return (p // 8) * 8 + (p % 4) * 2 + (p // 4) % 2


@triton.jit
def _decode_mxfp4_group(packed):
    """uint8 ``[N, 16]`` packed E2M1 pairs (one 32-dim group of N keys) -> uint8 ``[N, 32]``
    e4m3 bytes (values times 2**-6) in ``_mxfp4_group_order``. NVIDIA only (inline PTX)."""
    N: tl.constexpr = packed.shape[0]
    if _PTX_DECODE:
        low, high = tl.inline_asm_elementwise(
            _E2M1_TO_E4M3_PTX, "=r,=r,r", [packed], dtype=(tl.uint8, tl.uint8), is_pure=True,
            pack=4)
    else:
        codes = packed.to(tl.int32)
        low = _e2m1_code_to_e4m3(codes & 0xF)
        high = _e2m1_code_to_e4m3(codes >> 4)
    words = tl.join(tl.reshape(low, [N, 4, 4]), tl.reshape(high, [N, 4, 4]))  # [N, j, m, w]
    return tl.reshape(tl.permute(words, [0, 1, 3, 2]), [N, 32])


# ------------------------------------------------------------------------------- queries
@triton.jit
def _row_of_sequence(ctx_ptr, ctx_sb, ctx_si, b, i, num_cols, NEXT_N: tl.constexpr,
                     CTX_2D: tl.constexpr):
    """(limit, valid) of query ``i`` of sequence ``b``: it sees ``t < limit``."""
    valid = i < NEXT_N
    if CTX_2D:
        n = tl.load(ctx_ptr + b * ctx_sb + i * ctx_si, mask=valid, other=0).to(tl.int64)
    else:
        n = tl.load(ctx_ptr + b * ctx_sb).to(tl.int64) - NEXT_N + 1 + i
    limit = tl.minimum(tl.maximum(n, 0), num_cols).to(tl.int32)
    return tl.where(valid, limit, 0), valid


@triton.jit
def _q_scale(qs_row, h, group, heads):
    """The float32 scale ``[HP]`` of dims ``32 group ..`` of each head (UE8M0 byte ``group``
    of the head's int32)."""
    word = tl.load(qs_row + h, mask=h < heads, other=0)
    return ue8m0_to_float((word >> (8 * group)) & 0xFF)


@triton.jit
def _q_portable(q_row, qs_row, q_sh, heads, Q_FORM: tl.constexpr, HP: tl.constexpr):
    """float32 ``q^T [128, HP]`` of one query row, scales applied; heads past ``heads``
    are 0."""
    d = tl.arange(0, 128)[:, None]
    h = tl.arange(0, HP)[None, :]
    live = h < heads
    if Q_FORM == 0:  # bf16 bits
        bits = tl.load(q_row + h * q_sh + d, mask=live, other=0).to(tl.int32)
        x = ((bits & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    elif Q_FORM == 3:  # MXFP4: dim d is nibble d % 2 of byte d // 2
        byte = tl.load(q_row + h * q_sh + d // 2, mask=live, other=0).to(tl.int32)
        x = e2m1_to_float((byte >> (4 * (d % 2))) & 0xF)
    else:
        x = e4m3_to_float(tl.load(q_row + h * q_sh + d, mask=live, other=0))
    if Q_FORM >= 2:
        word = tl.load(qs_row + h, mask=live, other=0)
        x = x * ue8m0_to_float((word >> (8 * (d // 32))) & 0xFF)
    return tl.where(live, x, 0.0)


@triton.jit
def _q_native(q_row, q_sh, heads, d, Q_FORM: tl.constexpr, HP: tl.constexpr):
    """``q^T [len(d), HP]`` of one query row, rows ``d`` (dims), in the dot's input type:
    bf16 or e4m3 (MXFP4 values as e4m3 times 2**-6). Scales are not applied."""
    h = tl.arange(0, HP)[None, :]
    live = h < heads
    dd = d[:, None]
    if Q_FORM == 0:
        bits = tl.load(q_row + h * q_sh + dd, mask=live, other=0)
        x = bits.to(tl.bfloat16, bitcast=True)
    elif Q_FORM == 3:
        byte = tl.load(q_row + h * q_sh + dd // 2, mask=live, other=0).to(tl.int32)
        x = _e2m1_code_to_e4m3((byte >> (4 * (dd % 2))) & 0xF).to(tl.float8e4nv, bitcast=True)
    else:
        x = tl.load(q_row + h * q_sh + dd, mask=live, other=0).to(tl.float8e4nv, bitcast=True)
    return x


@triton.jit
def _q_folded(q_row, qs_row, q_sh, heads, d, Q_FORM: tl.constexpr, HP: tl.constexpr):
    """A scaled query row (e4m3 or MXFP4 values with per-32-dim UE8M0 scales) as unscaled
    e4m3 ``q^T [len(d), HP]``, each head's largest scale factored out: returns (values,
    exact, head factor [HP]). ``q = values * head factor`` holds exactly when ``exact`` is
    1: every value times ``2**(its group's exponent - the head's largest)`` (times 2**6 for
    E2M1 values) is an e4m3 number, as it is whenever a head's group exponents lie within
    14 of each other (MXFP4). The head factor, a power of two, goes into the head's
    weight: it commutes with the relu."""
    h = tl.arange(0, HP)[None, :]
    live = h < heads
    word = tl.load(qs_row + h, mask=live, other=0)
    b0 = word & 0xFF
    b1 = (word >> 8) & 0xFF
    b2 = (word >> 16) & 0xFF
    b3 = (word >> 24) & 0xFF
    top = tl.maximum(tl.maximum(b0, b1), tl.maximum(b2, b3))  # [1, HP]
    dd = d[:, None]
    g = dd // 32
    exponent = tl.where(g == 0, b0, tl.where(g == 1, b1, tl.where(g == 2, b2, b3)))
    if Q_FORM == 3:
        byte = tl.load(q_row + h * q_sh + dd // 2, mask=live, other=0).to(tl.int32)
        x = e2m1_to_float((byte >> (4 * (dd % 2))) & 0xF) * 64.0
        factor = ue8m0_to_float(top) * 0.015625  # the 2**6 above
    else:
        x = tl.load(q_row + h * q_sh + dd, mask=live, other=0).to(tl.float8e4nv, bitcast=True)
        x = x.to(tl.float32)
        factor = ue8m0_to_float(top)
    # 2**(exponent - top) for a difference down to -64 (further, nothing stays exact).
    x = x * pow2(tl.maximum(exponent - top, -64))
    values = x.to(tl.float8e4nv)
    exact = tl.min(tl.min(((values.to(tl.float32) == x) | (h >= heads)).to(tl.int32), axis=1),
                   axis=0)
    return values, exact, tl.reshape(factor, [HP])


@triton.jit
def _load_row(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh,
              ctx_ptr, ctx_sb, ctx_si, b, i, heads, num_cols, w_fold,
              NEXT_N: tl.constexpr, CTX_2D: tl.constexpr, Q_FORM: tl.constexpr,
              USE_FP4: tl.constexpr, HP: tl.constexpr, NATIVE: tl.constexpr,
              GROUPED: tl.constexpr, W_BF16: tl.constexpr, FOLD: tl.constexpr):
    """Everything the tile loop needs of query ``i`` of sequence ``b``, as a tuple:
    (limit, valid, weights [HP], q operands..., group scales...). ``FOLD`` (scaled
    queries, native path): the operands of ``_q_folded`` and, last, whether they are exact."""
    limit, valid = _row_of_sequence(ctx_ptr, ctx_sb, ctx_si, b, i, num_cols, NEXT_N, CTX_2D)
    heads = tl.where(valid, heads, 0)  # a row past NEXT_N reads nothing
    q_row = q_ptr + b * q_sb + i * q_si
    qs_row = qs_ptr + b * qs_sb + i * qs_si
    h = tl.arange(0, HP)
    w_raw = tl.load(w_ptr + (b * NEXT_N + i) * w_sr + h * w_sh, mask=h < heads, other=0)
    if W_BF16:
        w = ((w_raw.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    else:
        w = w_raw
    w = w * w_fold
    if FOLD:
        if USE_FP4:
            p = _mxfp4_group_order(tl.arange(0, 32))
            q0, ok0, factor = _q_folded(q_row, qs_row, q_sh, heads, p, Q_FORM, HP)
            q1, ok1, factor = _q_folded(q_row, qs_row, q_sh, heads, p + 32, Q_FORM, HP)
            q2, ok2, factor = _q_folded(q_row, qs_row, q_sh, heads, p + 64, Q_FORM, HP)
            q3, ok3, factor = _q_folded(q_row, qs_row, q_sh, heads, p + 96, Q_FORM, HP)
            return (limit, valid, w * factor, q0, q1, q2, q3, ok0 * ok1 * ok2 * ok3)
        else:
            q, ok, factor = _q_folded(q_row, qs_row, q_sh, heads, tl.arange(0, 128), Q_FORM, HP)
            return (limit, valid, w * factor, q, ok)
    elif not NATIVE:
        return (limit, valid, w, _q_portable(q_row, qs_row, q_sh, heads, Q_FORM, HP))
    elif not GROUPED:
        return (limit, valid, w, _q_native(q_row, q_sh, heads, tl.arange(0, 128), Q_FORM, HP))
    else:
        p = tl.arange(0, 32)
        if USE_FP4:
            p = _mxfp4_group_order(p)
        q0 = _q_native(q_row, q_sh, heads, p, Q_FORM, HP)
        q1 = _q_native(q_row, q_sh, heads, p + 32, Q_FORM, HP)
        q2 = _q_native(q_row, q_sh, heads, p + 64, Q_FORM, HP)
        q3 = _q_native(q_row, q_sh, heads, p + 96, Q_FORM, HP)
        if Q_FORM >= 2:
            return (limit, valid, w, q0, q1, q2, q3, _q_scale(qs_row, h, 0, heads),
                    _q_scale(qs_row, h, 1, heads), _q_scale(qs_row, h, 2, heads),
                    _q_scale(qs_row, h, 3, heads))
        else:
            return (limit, valid, w, q0, q1, q2, q3)


# ---------------------------------------------------------------------------------- keys
@triton.jit
def _load_tile(cache_ptr, page_stride, num_blocks, table_row, t0, hi,
               USE_FP4: tl.constexpr, MX_SCALES: tl.constexpr, LAYOUT: tl.constexpr,
               N_PER_TILE: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
               NATIVE: tl.constexpr, GROUPED: tl.constexpr, Q_FORM: tl.constexpr,
               SCALE_WORDS: tl.constexpr):
    """The keys of positions ``t0 .. t0 + BLOCK_N - 1`` (those below ``hi`` count), as a
    tuple: (readable [BLOCK_N], key scale (FP8, native) or 1, key operands...,
    group scales (MXFP4, native)...)."""
    VALUE_BYTES: tl.constexpr = 64 if USE_FP4 else 128
    t = t0 + tl.arange(0, BLOCK_N)
    in_range = t < hi
    if BLOCK_SIZE % BLOCK_N == 0:
        # The tile lies in one block (t0 is a multiple of BLOCK_N): one block id, one page.
        # Keys of that page past ``hi`` are read too (inside the page) but never written out.
        block = tl.load(table_row + t0 // BLOCK_SIZE).to(tl.int64)
        ok = (block >= 0) & (block < num_blocks)
        readable = t < tl.where(ok, hi, 0)
        page = cache_ptr + tl.where(ok, block, 0) * page_stride  # scalar
        p = t0 % BLOCK_SIZE + tl.arange(0, BLOCK_N)
        rows_page = page
        rows_mask = (p < tl.where(ok, BLOCK_SIZE, 0))[:, None]  # every row of a valid page
    else:
        block = tl.load(table_row + t // BLOCK_SIZE, mask=in_range, other=-1).to(tl.int64)
        readable = in_range & (block >= 0) & (block < num_blocks)
        page = cache_ptr + tl.where(readable, block, 0) * page_stride  # [BLOCK_N]
        p = t % BLOCK_SIZE
        rows_page = page[:, None]
        rows_mask = readable[:, None]
    pc = p[:, None]
    # Scales: the four bytes of a key (contiguous except in the MXFP4 preshuffle layout) as
    # one little-endian int32 when the pages are 4-byte aligned.
    first = scale_offset_tl(p, 0, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE)
    if SCALE_WORDS and LAYOUT != 2:
        word = tl.load((page + first).to(tl.pointer_type(tl.int32)), mask=readable, other=0)
    elif (not USE_FP4) and MX_SCALES:
        word = tl.load(page + first, mask=readable, other=0).to(tl.int32)  # byte 0 suffices
    else:
        i4 = tl.arange(0, 4)[None, :]
        bytes4 = tl.load(rows_page + scale_offset_tl(pc, i4, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE),
                         mask=rows_mask, other=0)
        word = tl.sum(bytes4.to(tl.int32) << (8 * i4), axis=1)
    if USE_FP4:
        if not NATIVE:
            s0 = ue8m0_to_float(word & 0xFF)
            s1 = ue8m0_to_float((word >> 8) & 0xFF)
            s2 = ue8m0_to_float((word >> 16) & 0xFF)
            s3 = ue8m0_to_float((word >> 24) & 0xFF)
            d = tl.arange(0, 128)[None, :]
            byte = tl.load(rows_page + value_offset_tl(pc, d // 2, BLOCK_SIZE, VALUE_BYTES,
                                                       LAYOUT, N_PER_TILE),
                           mask=rows_mask, other=0).to(tl.int32)
            x = e2m1_to_float((byte >> (4 * (d % 2))) & 0xF)
            g = d // 32
            scale = tl.where(g == 0, s0[:, None], tl.where(g == 1, s1[:, None],
                             tl.where(g == 2, s2[:, None], s3[:, None])))
            return (readable, 1.0, x * scale)
        else:
            # Group scales 2**(byte - 127) straight from the byte's bits (one shift and mask
            # each); a byte 255 (NaN) is caught once per key instead: the key's factor,
            # applied after the head sum, is NaN. (A byte 0, which the store never writes,
            # reads as 0 here.)
            s0 = ((word << 23) & 0x7F800000).to(tl.float32, bitcast=True)
            s1 = ((word << 15) & 0x7F800000).to(tl.float32, bitcast=True)
            s2 = ((word << 7) & 0x7F800000).to(tl.float32, bitcast=True)
            s3 = ((word >> 1) & 0x7F800000).to(tl.float32, bitcast=True)
            u = word.to(tl.uint32, bitcast=True)
            poisoned = (((u & 0x7F7F7F7F) + 0x01010101) & u & 0x80808080) != 0  # a byte 255
            key_factor = tl.where(poisoned, float("nan"), 1.0)
            b16 = tl.arange(0, 16)[None, :]
            k0 = _decode_mxfp4_group(tl.load(rows_page + value_offset_tl(
                pc, b16, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE), mask=rows_mask, other=0))
            k1 = _decode_mxfp4_group(tl.load(rows_page + value_offset_tl(
                pc, b16 + 16, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE), mask=rows_mask,
                other=0))
            k2 = _decode_mxfp4_group(tl.load(rows_page + value_offset_tl(
                pc, b16 + 32, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE), mask=rows_mask,
                other=0))
            k3 = _decode_mxfp4_group(tl.load(rows_page + value_offset_tl(
                pc, b16 + 48, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE), mask=rows_mask,
                other=0))
            return (readable, key_factor, _key_operand(k0, Q_FORM), _key_operand(k1, Q_FORM),
                    _key_operand(k2, Q_FORM), _key_operand(k3, Q_FORM), s0, s1, s2, s3)
    else:
        if MX_SCALES:  # four equal UE8M0 bytes
            key_scale = ue8m0_to_float(word & 0xFF)
        else:  # the fp32's bytes
            key_scale = word.to(tl.float32, bitcast=True)
        if not NATIVE:
            d = tl.arange(0, 128)[None, :]
            codes = tl.load(rows_page + value_offset_tl(pc, d, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                        N_PER_TILE),
                            mask=rows_mask, other=0)
            return (readable, 1.0, e4m3_to_float(codes) * key_scale[:, None])
        elif not GROUPED:
            d = tl.arange(0, 128)[None, :]
            codes = tl.load(rows_page + value_offset_tl(pc, d, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                        N_PER_TILE),
                            mask=rows_mask, other=0)
            return (readable, key_scale, _key_operand(codes, Q_FORM))
        else:
            d = tl.arange(0, 32)[None, :]
            k0 = tl.load(rows_page + value_offset_tl(pc, d, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE), mask=rows_mask, other=0)
            k1 = tl.load(rows_page + value_offset_tl(pc, d + 32, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE), mask=rows_mask, other=0)
            k2 = tl.load(rows_page + value_offset_tl(pc, d + 64, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE), mask=rows_mask, other=0)
            k3 = tl.load(rows_page + value_offset_tl(pc, d + 96, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE), mask=rows_mask, other=0)
            return (readable, key_scale, _key_operand(k0, Q_FORM), _key_operand(k1, Q_FORM),
                    _key_operand(k2, Q_FORM), _key_operand(k3, Q_FORM))


@triton.jit
def _key_operand(codes, Q_FORM: tl.constexpr):
    """e4m3 bytes -> the dot's key operand: e4m3, or bf16 (exact) against bf16 queries."""
    x = codes.to(tl.float8e4nv, bitcast=True)
    if Q_FORM == 0:
        x = x.to(tl.bfloat16)
    return x


# ------------------------------------------------------------------------------- scoring
@triton.jit
def _row_scores(tile, row, NATIVE: tl.constexpr, GROUPED: tl.constexpr,
                USE_FP4: tl.constexpr, Q_FORM: tl.constexpr):
    """One logit per key of the tile for one query row: [BLOCK_N] float32."""
    w = row[2]
    if not NATIVE:
        acc = tl.dot(tile[2], row[3], input_precision="ieee", out_dtype=tl.float32)
    elif not GROUPED:
        acc = tl.dot(tile[2], row[3], out_dtype=tl.float32)
    else:
        # The four dots first, then their scaling: the tensor cores run them back to back.
        p0 = tl.dot(tile[2], row[3], out_dtype=tl.float32)
        p1 = tl.dot(tile[3], row[4], out_dtype=tl.float32)
        p2 = tl.dot(tile[4], row[5], out_dtype=tl.float32)
        p3 = tl.dot(tile[5], row[6], out_dtype=tl.float32)
        acc = _scaled(p0, tile, row, 0, USE_FP4, Q_FORM)
        acc += _scaled(p1, tile, row, 1, USE_FP4, Q_FORM)
        acc += _scaled(p2, tile, row, 2, USE_FP4, Q_FORM)
        acc += _scaled(p3, tile, row, 3, USE_FP4, Q_FORM)
    scores = tl.sum(_relu(acc) * w[None, :], axis=1)
    if NATIVE:
        # FP8: the key's scale, a positive power of two; MXFP4: 1, or NaN for a NaN scale.
        scores = scores * tile[1]
    return scores


@triton.jit
def _scaled(part, tile, row, GROUP: tl.constexpr, USE_FP4: tl.constexpr, Q_FORM: tl.constexpr):
    """One 32-dim group's partial dot products [BLOCK_N, HP], times its scales."""
    if USE_FP4:
        part = part * tile[6 + GROUP][:, None]
    if Q_FORM >= 2:
        part = part * row[7 + GROUP][None, :]
    return part


@triton.jit
def _store_row(out_ptr, out_sr, row_index, t, col_hi, scores, readable, row,
               CLEAN: tl.constexpr):
    """Write a row's logits for positions ``t``: the score below its limit (``-inf`` where
    the block id is out of range), ``-inf`` from the limit to ``col_hi`` when ``CLEAN``."""
    limit = row[0]
    seen = t < limit
    value = tl.where(seen & readable, scores, float("-inf"))
    mask = t < tl.where(row[1], col_hi, 0)
    if not CLEAN:
        mask = mask & seen
    tl.store(out_ptr + row_index * out_sr + t, value, mask=mask)


@triton.jit
def _store_inf(out_ptr, out_sr, row_index, t, end, valid):
    tl.store(out_ptr + row_index * out_sr + t, tl.full(t.shape, float("-inf"), tl.float32),
             mask=t < tl.where(valid, end, 0))


@triton.jit
def _load_rows(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, ctx_ptr, ctx_sb,
               ctx_si, b, i0, heads, num_cols, NEXT_N: tl.constexpr, ROWS: tl.constexpr,
               CTX_2D: tl.constexpr, Q_FORM: tl.constexpr, USE_FP4: tl.constexpr,
               HP: tl.constexpr, NATIVE: tl.constexpr, GROUPED: tl.constexpr,
               W_BF16: tl.constexpr, FOLD: tl.constexpr):
    """``_load_row`` of the program's rows ``i0 ..`` (rows past ROWS repeat row 0 and are
    never used); then the largest limit and, when ``FOLD``, whether all fold exactly."""
    # E2M1 values decoded as e4m3 bytes are 2**-6 of themselves: the weights take the 2**6
    # (a query's own is in its head factor when folded).
    w_fold = 1.0
    if NATIVE and USE_FP4:
        w_fold = w_fold * 64.0
    if NATIVE and Q_FORM == 3 and not FOLD:
        w_fold = w_fold * 64.0
    OK: tl.constexpr = 7 if USE_FP4 else 4
    r0 = _load_row(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, ctx_ptr,
                   ctx_sb, ctx_si, b, i0, heads, num_cols, w_fold, NEXT_N, CTX_2D, Q_FORM,
                   USE_FP4, HP, NATIVE, GROUPED, W_BF16, FOLD)
    r1 = r0
    r2 = r0
    r3 = r0
    lmax = r0[0]
    ok = 1
    if FOLD:
        ok = r0[OK]
    if ROWS > 1:
        r1 = _load_row(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh,
                       ctx_ptr, ctx_sb, ctx_si, b, i0 + 1, heads, num_cols, w_fold, NEXT_N,
                       CTX_2D, Q_FORM, USE_FP4, HP, NATIVE, GROUPED, W_BF16, FOLD)
        lmax = tl.maximum(lmax, r1[0])
        if FOLD:
            ok = ok * r1[OK]
    if ROWS > 2:
        r2 = _load_row(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh,
                       ctx_ptr, ctx_sb, ctx_si, b, i0 + 2, heads, num_cols, w_fold, NEXT_N,
                       CTX_2D, Q_FORM, USE_FP4, HP, NATIVE, GROUPED, W_BF16, FOLD)
        lmax = tl.maximum(lmax, r2[0])
        if FOLD:
            ok = ok * r2[OK]
    if ROWS > 3:
        r3 = _load_row(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh,
                       ctx_ptr, ctx_sb, ctx_si, b, i0 + 3, heads, num_cols, w_fold, NEXT_N,
                       CTX_2D, Q_FORM, USE_FP4, HP, NATIVE, GROUPED, W_BF16, FOLD)
        lmax = tl.maximum(lmax, r3[0])
        if FOLD:
            ok = ok * r3[OK]
    return r0, r1, r2, r3, lmax, ok


@triton.jit
def _scan(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr, row_base, col_lo, hi,
          col_hi, r0, r1, r2, r3, ROWS: tl.constexpr, Q_FORM: tl.constexpr,
          USE_FP4: tl.constexpr, MX_SCALES: tl.constexpr, LAYOUT: tl.constexpr,
          N_PER_TILE: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
          NUM_STAGES: tl.constexpr, CLEAN: tl.constexpr, NATIVE: tl.constexpr,
          GROUPED: tl.constexpr, SCALE_WORDS: tl.constexpr):
    """The tile loop over positions ``[col_lo, hi)``: each key tile loaded once, scored and
    written for every row (``-inf`` past a row's limit, up to ``col_hi``, when CLEAN)."""
    lanes = tl.arange(0, BLOCK_N)
    for t0 in tl.range(col_lo, hi, BLOCK_N, num_stages=NUM_STAGES):
        t = t0 + lanes
        tile = _load_tile(cache_ptr, page_stride, num_blocks, table_row, t0, hi, USE_FP4,
                          MX_SCALES, LAYOUT, N_PER_TILE, BLOCK_SIZE, BLOCK_N, NATIVE, GROUPED,
                          Q_FORM, SCALE_WORDS)
        _store_row(out_ptr, out_sr, row_base, t, col_hi,
                   _row_scores(tile, r0, NATIVE, GROUPED, USE_FP4, Q_FORM), tile[0], r0, CLEAN)
        if ROWS > 1:
            _store_row(out_ptr, out_sr, row_base + 1, t, col_hi,
                       _row_scores(tile, r1, NATIVE, GROUPED, USE_FP4, Q_FORM), tile[0], r1,
                       CLEAN)
        if ROWS > 2:
            _store_row(out_ptr, out_sr, row_base + 2, t, col_hi,
                       _row_scores(tile, r2, NATIVE, GROUPED, USE_FP4, Q_FORM), tile[0], r2,
                       CLEAN)
        if ROWS > 3:
            _store_row(out_ptr, out_sr, row_base + 3, t, col_hi,
                       _row_scores(tile, r3, NATIVE, GROUPED, USE_FP4, Q_FORM), tile[0], r3,
                       CLEAN)


# num_cols, chunk and the like vary with every call's shapes: not specialized.
@triton.jit(do_not_specialize=["num_blocks", "max_model_len", "num_cols", "chunk",
                               "tail_chunk", "heads"])
def paged_mqa_logits_kernel(
    q_ptr, q_sb, q_si, q_sh,
    qs_ptr, qs_sb, qs_si,
    w_ptr, w_sr, w_sh,
    cache_ptr, page_stride, num_blocks,
    ctx_ptr, ctx_sb, ctx_si,
    table_ptr, table_sb,
    out_ptr, out_sr,
    max_model_len, num_cols, chunk, tail_chunk, heads,
    NEXT_N: tl.constexpr,
    ROWS: tl.constexpr,
    CTX_2D: tl.constexpr,
    Q_FORM: tl.constexpr,
    W_BF16: tl.constexpr,
    USE_FP4: tl.constexpr,
    MX_SCALES: tl.constexpr,
    LAYOUT: tl.constexpr,
    N_PER_TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CLEAN: tl.constexpr,
    NATIVE: tl.constexpr,
    SCALE_WORDS: tl.constexpr,
):
    """Grid ``(B * ceil(NEXT_N / ROWS), splits)``. Pointers to bf16 or e4m3 data are passed
    as raw bits (int16 / uint8) and reinterpreted here. ``num_cols = min(max_model_len,
    max_blocks * BLOCK_SIZE)``; split ``s`` scores the positions ``[s * chunk, (s + 1) *
    chunk)`` below ``num_cols`` (``chunk`` a multiple of ``BLOCK_N``) and, when ``CLEAN``,
    writes ``-inf`` to its share ``tail_chunk`` of the columns ``[num_cols,
    max_model_len)``. ``SCALE_WORDS``: the cache's address and page stride are multiples of 4
    (a key's four scale bytes load as one int32)."""
    tl.static_assert(ROWS >= 1 and ROWS <= 4)
    tl.static_assert(HP >= 16 and BLOCK_N >= 16)
    tl.static_assert(not (USE_FP4 and LAYOUT == 1), "the tiled layout is FP8 only")
    tl.static_assert(USE_FP4 or LAYOUT != 2, "the preshuffle layout is MXFP4 only")
    # Per-32-dim scales need a dot per group (native path): MXFP4 keys, scaled queries.
    GROUPED: tl.constexpr = NATIVE and (USE_FP4 or Q_FORM >= 2)
    ROW_GROUPS: tl.constexpr = (NEXT_N + ROWS - 1) // ROWS
    pid = tl.program_id(0)
    b = (pid // ROW_GROUPS).to(tl.int64)
    i0 = (pid % ROW_GROUPS) * ROWS
    split = tl.program_id(1)
    col_lo = split * chunk
    col_hi = tl.minimum(col_lo + chunk, num_cols)
    table_row = table_ptr + b * table_sb
    row_base = b * NEXT_N + i0
    if NATIVE and Q_FORM >= 2:
        # Scaled queries: score with the scales folded into the queries (one unscaled dot, as
        # for e4m3 queries) when that is exact for every row, else with a dot per group.
        f0, f1, f2, f3, lmax, ok = _load_rows(
            q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, ctx_ptr, ctx_sb,
            ctx_si, b, i0, heads, num_cols, NEXT_N, ROWS, CTX_2D, Q_FORM, USE_FP4, HP, NATIVE,
            USE_FP4, W_BF16, True)
        hi = tl.minimum(col_hi, lmax)  # positions scored by this program: [col_lo, hi)
        if ok != 0:
            _scan(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr, row_base,
                  col_lo, hi, col_hi, f0, f1, f2, f3, ROWS, 1, USE_FP4, MX_SCALES, LAYOUT,
                  N_PER_TILE, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN, NATIVE, USE_FP4,
                  SCALE_WORDS)
        else:
            r0, r1, r2, r3, lmax, ok = _load_rows(
                q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, ctx_ptr,
                ctx_sb, ctx_si, b, i0, heads, num_cols, NEXT_N, ROWS, CTX_2D, Q_FORM, USE_FP4,
                HP, NATIVE, GROUPED, W_BF16, False)
            _scan(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr, row_base,
                  col_lo, hi, col_hi, r0, r1, r2, r3, ROWS, Q_FORM, USE_FP4, MX_SCALES, LAYOUT,
                  N_PER_TILE, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN, NATIVE, GROUPED,
                  SCALE_WORDS)
    else:
        r0, r1, r2, r3, lmax, ok = _load_rows(
            q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, ctx_ptr, ctx_sb,
            ctx_si, b, i0, heads, num_cols, NEXT_N, ROWS, CTX_2D, Q_FORM, USE_FP4, HP, NATIVE,
            GROUPED, W_BF16, False)
        hi = tl.minimum(col_hi, lmax)
        _scan(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr, row_base, col_lo,
              hi, col_hi, r0, r1, r2, r3, ROWS, Q_FORM, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE,
              BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN, NATIVE, GROUPED, SCALE_WORDS)

    lanes = tl.arange(0, BLOCK_N)
    valid0 = i0 < NEXT_N
    valid1 = i0 + 1 < NEXT_N
    valid2 = i0 + 2 < NEXT_N
    valid3 = i0 + 3 < NEXT_N
    if CLEAN:
        # The rest of the range is past every row's limit; the tile loop above wrote the
        # -inf of its last tile already.
        start = col_lo + tl.cdiv(tl.maximum(hi - col_lo, 0), BLOCK_N) * BLOCK_N
        for t0 in range(start, col_hi, BLOCK_N):
            t = t0 + lanes
            _store_inf(out_ptr, out_sr, row_base, t, col_hi, valid0)
            if ROWS > 1:
                _store_inf(out_ptr, out_sr, row_base + 1, t, col_hi, valid1)
            if ROWS > 2:
                _store_inf(out_ptr, out_sr, row_base + 2, t, col_hi, valid2)
            if ROWS > 3:
                _store_inf(out_ptr, out_sr, row_base + 3, t, col_hi, valid3)
        # Columns past the block table (or every column when num_cols is 0).
        tail_lo = num_cols + split * tail_chunk
        tail_hi = tl.minimum(tail_lo + tail_chunk, max_model_len)
        for t0 in range(tail_lo, tail_hi, BLOCK_N):
            t = t0 + lanes
            _store_inf(out_ptr, out_sr, row_base, t, tail_hi, valid0)
            if ROWS > 1:
                _store_inf(out_ptr, out_sr, row_base + 1, t, tail_hi, valid1)
            if ROWS > 2:
                _store_inf(out_ptr, out_sr, row_base + 2, t, tail_hi, valid2)
            if ROWS > 3:
                _store_inf(out_ptr, out_sr, row_base + 3, t, tail_hi, valid3)
