"""Paged MQA logits: every query row of a sequence scored against the keys in the cache.

    logits[b * NEXT_N + i, t] = sum_h w[b * NEXT_N + i, h] * relu(q[b, i, h, :] . K[b, t, :])

Program ``(s, g)`` takes rows ``g * ROWS ..`` of one sequence and a contiguous range of
``chunk`` positions (``s``-th of the sequence), ``BLOCK_N`` keys at a time. Keys are the
dot's M dimension: a tile ``[BLOCK_N, 128]`` times ``q^T [128, heads]`` gives ``[BLOCK_N,
heads]``; relu, the row's head weights and a sum over the heads leave one logit per key.
Each key tile is read once for all the program's rows.

Two ways to compute, chosen by ``NATIVE``:

* portable (the CPU interpreter, GPUs without FP8 dots): keys and queries decoded to
  float32 with their scales (``numerics``' exact conversions), one float32 dot;
* native (NVIDIA sm_89 and newer): FP8 keys and e4m3 queries meet in FP8 dots; bf16
  queries in bf16 dots (e4m3 and E2M1 values are exact in bf16). FP8 key scales are
  positive powers of two, applied once per key after the relu and the head sum. Scaled
  queries are first tried with each head's largest scale factored out into its weight and
  the rest folded into e4m3 query values: when that is exact for all the program's rows
  (the usual case for MXFP4 queries), they are scored like unscaled e4m3 queries;
  otherwise folded into bf16 and scored like bf16 queries in the stacked form (all the
  program's rows at once, else row by row), and per 32-dim group where that fails too,
  or in the row-by-row form.

The native path has two launch forms (``VARIANT``):

* ``VARIANT_ROWS``: a dot per query row; MXFP4 keys decoded four codes at a time (an E2M1
  code ``c`` becomes the e4m3 byte ``((c & 7) << 2) | ((c & 8) << 4)``, the same value
  times 2**-6, the 2**6 in the weights) and scored as four K=32 dots whose partial sums
  are scaled per group before they are added.
* ``VARIANT_STACKED``: the rows' queries side by side in one dot (``ROWS * HP`` columns);
  MXFP4 keys decoded by table lookups (``_FP4_WORD_PTX`` to e4m3, ``_FP4_BF16_PTX`` to
  bf16 against bf16 queries) straight into the registers the tensor cores read
  (``_dot_row``, ``_fp4_dim``), each key's group scales folded into the decoded values
  relative to its largest, or with ``PROGRAM_FOLD`` relative to one exponent of the
  program (``_fold_reference``), that scale applied after the head sum
  (``_tile_scores``): one K=128 dot a tile. A key the fold cannot take exactly (group
  exponents too far apart, or outside the program's window) scores NaN, and its program
  scores its rows again per group (``_rescan_rows``).

A NaN scale (UE8M0 byte 255, or an fp32 NaN) gives NaN logits for its key. Positions whose
block id is outside ``[0, num_blocks)`` score ``-inf`` (block 0, or nothing, is read in
their place). Nothing outside the tensors is read or written; offsets are int64.
"""

import triton
import triton.language as tl

from ..layout import cache_row_bytes, scale_offset_tl, value_offset_tl
from .dependent_launch import hint_l2, wait_for_previous_kernel
from .numerics import e2m1_to_float, e4m3_to_float, pow2, ue8m0_to_float

# Bytes of a cached key (values and scale), FP8 and MXFP4.
ROW_BYTES_FP8: tl.constexpr = tl.constexpr(cache_row_bytes(False))
ROW_BYTES_FP4: tl.constexpr = tl.constexpr(cache_row_bytes(True))
# Query forms (``Q_FORM``).
Q_BF16 = 0
Q_E4M3 = 1
Q_E4M3_MX = 2  # e4m3 values with per-32-dim UE8M0 scales
Q_MXFP4 = 3  # packed E2M1 pairs with per-32-dim UE8M0 scales
MAX_ROWS = 4  # query rows a program scores together (the unrolled row slots below)
# Launch forms (``VARIANT``): 0 scores row by row, MXFP4 keys per group; 1 stacks the rows'
# queries into one dot and folds MXFP4 keys' group scales into their decoded values.
VARIANT_ROWS = 0
VARIANT_STACKED = 1
# MXFP4 keys fold exactly while a key's group exponents lie within FP4_FOLD_SPAN - 1 of
# each other: the largest group decodes to E2M1 times 2**(FP4_FOLD_SPAN - 6) (6 * 2**6 =
# 384 is the largest e4m3 number of that form), the smallest kept to times 2**-5 (0.5
# times it is e4m3's smallest normal).
FP4_FOLD_SPAN = 12
FP4_FOLD_TOP: tl.constexpr = tl.constexpr(FP4_FOLD_SPAN)
# Against e4m3 queries a program folds its MXFP4 keys relative to one reference exponent
# ``ref`` (``_fold_reference``): FP4_FOLD_HEADROOM above the largest group exponent of its
# first tile, so that a group of exponent e decodes to E2M1 times 2**(FP4_FOLD_SPAN - 6 +
# e - ref), exact for e in [ref - FP4_FOLD_SPAN + 1, ref]; the factor 2**(ref - 127) is
# the same for every key. A group outside that window decodes to e4m3 NaN bytes.
FP4_FOLD_HEADROOM: tl.constexpr = tl.constexpr(2)
_E4M3_NAN_WORD: tl.constexpr = tl.constexpr(0x7F7F7F7F)
# Against bf16 queries MXFP4 keys decode straight to bf16, E2M1 times 2**(6 + e_g - max e):
# exact while 0.5 times that is a normal bf16 (>= 2**-126), i.e. e_g - max e >= -131.
BF16_FOLD_SPAN: tl.constexpr = tl.constexpr(132)
# The native path decodes MXFP4 keys, and its one-row programs store their logits, with
# inline PTX; under the CPU interpreter (which runs no PTX) the same bytes come from integer
# operations and the logits from ``tl.store``, so that tests can run that path. (Triton's
# own reading of TRITON_INTERPRET: "true", "yes" and "on" count too.)
_PTX: tl.constexpr = tl.constexpr(not triton.knobs.runtime.interpret)

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
    if _PTX:
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
        # Clamped before the subtraction: an int64 context near its minimum must not wrap.
        n = tl.maximum(tl.load(ctx_ptr + b * ctx_sb).to(tl.int64), 0) - NEXT_N + 1 + i
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
def _fold_exponents(word, dd):
    """Of scale words [1, N] (four UE8M0 bytes, byte ``j`` for dims ``32 j ..``): each
    column's largest byte [1, N], and the byte of the group of dims ``dd`` [K, 1], [K, N]."""
    top = tl.maximum(tl.maximum(word & 0xFF, (word >> 8) & 0xFF),
                     tl.maximum((word >> 16) & 0xFF, (word >> 24) & 0xFF))
    return top, (word >> (8 * (dd // 32))) & 0xFF


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
    dd = d[:, None]
    top, exponent = _fold_exponents(word, dd)
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
               N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
               SCALE_LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
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
    first = scale_offset_tl(p, 0, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES)
    if SCALE_WORDS and LAYOUT != 2:
        word = tl.load((page + first).to(tl.pointer_type(tl.int32)), mask=readable, other=0)
    elif (not USE_FP4) and MX_SCALES:
        word = tl.load(page + first, mask=readable, other=0).to(tl.int32)  # byte 0 suffices
    else:
        i4 = tl.arange(0, 4)[None, :]
        bytes4 = tl.load(rows_page + scale_offset_tl(pc, i4, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE, D_PER_TILE, SCALE_LANES),
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
                                                       LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES),
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
                pc, b16, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES),
                mask=rows_mask, other=0))
            k1 = _decode_mxfp4_group(tl.load(rows_page + value_offset_tl(
                pc, b16 + 16, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES),
                mask=rows_mask, other=0))
            k2 = _decode_mxfp4_group(tl.load(rows_page + value_offset_tl(
                pc, b16 + 32, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES),
                mask=rows_mask, other=0))
            k3 = _decode_mxfp4_group(tl.load(rows_page + value_offset_tl(
                pc, b16 + 48, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES),
                mask=rows_mask, other=0))
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
                                                        N_PER_TILE, D_PER_TILE, SCALE_LANES),
                            mask=rows_mask, other=0)
            return (readable, 1.0, e4m3_to_float(codes) * key_scale[:, None])
        elif not GROUPED:
            d = tl.arange(0, 128)[None, :]
            codes = tl.load(rows_page + value_offset_tl(pc, d, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                        N_PER_TILE, D_PER_TILE, SCALE_LANES),
                            mask=rows_mask, other=0)
            return (readable, key_scale, _key_operand(codes, Q_FORM))
        else:
            d = tl.arange(0, 32)[None, :]
            k0 = tl.load(rows_page + value_offset_tl(pc, d, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE, D_PER_TILE, SCALE_LANES),
                         mask=rows_mask, other=0)
            k1 = tl.load(rows_page + value_offset_tl(pc, d + 32, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE, D_PER_TILE, SCALE_LANES),
                         mask=rows_mask, other=0)
            k2 = tl.load(rows_page + value_offset_tl(pc, d + 64, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE, D_PER_TILE, SCALE_LANES),
                         mask=rows_mask, other=0)
            k3 = tl.load(rows_page + value_offset_tl(pc, d + 96, BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                                                     N_PER_TILE, D_PER_TILE, SCALE_LANES),
                         mask=rows_mask, other=0)
            return (readable, key_scale, _key_operand(k0, Q_FORM), _key_operand(k1, Q_FORM),
                    _key_operand(k2, Q_FORM), _key_operand(k3, Q_FORM))


@triton.jit
def _key_operand(codes, Q_FORM: tl.constexpr):
    """e4m3 bytes -> the dot's key operand: e4m3, or bf16 (exact) against bf16 queries."""
    x = codes.to(tl.float8e4nv, bitcast=True)
    if Q_FORM == 0:
        x = x.to(tl.bfloat16)
    return x


# An f16 pair converted from e4m3 (a normal number or zero, its low 7 mantissa bits zero)
# -> the bf16 pair of the same values: the exponent and mantissa bits moved down by 3 read
# as a bf16 of the value times 2**-112 (both exponents count from the field's bottom;
# nothing of the other half moves in, its low bits being zero), then one exact bf16 multiply
# by 2**112 (0x7780). Instead of two f16 -> bf16 conversions, which run at a quarter rate.
# The multiply is an fma with -0.0 added (the same result, sign of zero included):
# mul.bf16x2 needs sm_90, fma.bf16x2 sm_80.
_F16_TO_BF16_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 t, s, c, z;
shr.b32 t, $1, 3;
and.b32 s, $1, 0x80008000;
and.b32 t, t, 0x0FFF0FFF;
or.b32 t, t, s;
mov.b32 c, 0x77807780;
mov.b32 z, 0x80008000;
fma.rn.bf16x2 $0, t, c, z;
}
""")


@triton.jit
def _key_dot(keys, q_op):
    """``keys @ q_op`` in float32 (the stacked form's dots). The interpreter multiplies
    bf16 operands as their integer bits: there they are widened first (exact)."""
    if not _PTX and keys.dtype == tl.bfloat16:
        return tl.dot(keys.to(tl.float32), q_op.to(tl.float32), input_precision="ieee",
                      out_dtype=tl.float32)
    return tl.dot(keys, q_op, out_dtype=tl.float32)


@triton.jit
def _key_operand_v1(codes, Q_FORM: tl.constexpr):
    """``_key_operand`` of the stacked form: e4m3 bytes to bf16 through f16 (one conversion
    a pair, then ``_F16_TO_BF16_PTX``)."""
    x = codes.to(tl.float8e4nv, bitcast=True)
    if Q_FORM == 0:
        if _PTX:
            x = tl.inline_asm_elementwise(_F16_TO_BF16_PTX, "=r,r", [x.to(tl.float16)],
                                          dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
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
          N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
          SCALE_LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
          NUM_STAGES: tl.constexpr, CLEAN: tl.constexpr, NATIVE: tl.constexpr,
          GROUPED: tl.constexpr, SCALE_WORDS: tl.constexpr):
    """The tile loop over positions ``[col_lo, hi)``: each key tile loaded once, scored and
    written for every row (``-inf`` past a row's limit, up to ``col_hi``, when CLEAN)."""
    lanes = tl.arange(0, BLOCK_N)
    for t0 in tl.range(col_lo, hi, BLOCK_N, num_stages=NUM_STAGES):
        t = t0 + lanes
        tile = _load_tile(cache_ptr, page_stride, num_blocks, table_row, t0, hi, USE_FP4,
                          MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE,
                          BLOCK_N, NATIVE, GROUPED, Q_FORM, SCALE_WORDS)
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


# ------------------------------------------------------------- stacked rows (VARIANT 1)
# The second form of the native path: one dot per key tile for all the program's query
# rows (their queries side by side, ``ROWS * HP`` columns), and MXFP4 keys decoded straight
# into the registers the tensor cores read, with each key's group scales folded into the
# decoded values. See the module docstring.


@triton.jit
def _fp4_tables(k):
    """The e4m3 bytes of the eight E2M1 magnitudes times ``2**(k - 6)`` for an int32 ``k``
    in ``[1, FP4_FOLD_TOP]``, as two little-endian words (magnitudes 0-3, 4-7): ``0.5 *
    2**(k - 6)`` is the normal number of exponent field ``k``, and every byte steps by
    ``8 k`` (one exponent step each) with ``k``."""
    return k * 0x08080800 + 0x0C080000, k * 0x08080808 + 0x1C181410


# One 32-bit word of packed E2M1 pairs (elements 0-7, element 2i in the low nibble of byte
# i) and the lookup table of its 32-dim group (``_fp4_tables``) -> two words of e4m3 bytes,
# elements 0-3 and 4-7 in order. ``prmt`` looks the magnitudes up (a nibble of the
# selector picks one of the eight table bytes; the sign bit is masked off, as it would
# select a sign fill); the signs come from the nibbles' top bits, moved to bit 7 of their
# bytes: those of the odd elements already are in place (bits 7, 15, ...), those of the
# even ones are after a shift by 4.
_FP4_WORD_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 m, mh, u, a, b, s0, s1;
and.b32 m, $2, 0x77777777;
prmt.b32 a, $3, $4, m;
shr.b32 mh, m, 16;
prmt.b32 b, $3, $4, mh;
shl.b32 u, $2, 4;
prmt.b32 s0, $2, u, 0x1504;
prmt.b32 s1, $2, u, 0x3726;
lop3.b32 $0, a, s0, 0x80808080, 0xF8;
lop3.b32 $1, b, s1, 0x80808080, 0xF8;
}
""")


@triton.jit
def _fp4_word(word, t_lo, t_hi):
    """``_FP4_WORD_PTX`` on int32 tensors (elementwise); integer operations under the
    interpreter."""
    if _PTX:
        low, high = tl.inline_asm_elementwise(
            _FP4_WORD_PTX, "=r,=r,r,r,r", [word, t_lo, t_hi], dtype=(tl.int32, tl.int32),
            is_pure=True, pack=1)
    else:
        low = tl.zeros_like(word)
        high = tl.zeros_like(word)
        for i in tl.static_range(8):
            code = (word >> (4 * i)) & 0xF
            m = code & 7
            table = tl.where(m < 4, t_lo, t_hi)
            byte = ((table >> (8 * (m & 3))) & 0xFF) | ((code & 8) << 4)
            if i < 4:
                low = low | (byte << (8 * i))
            else:
                high = high | (byte << (8 * (i - 4)))
    return low, high


# The bf16 form of the decode (against bf16 queries). A group's table holds the bf16 bits
# of the eight E2M1 magnitudes times ``2**x``: their high bytes in two words (magnitudes
# 0-3, 4-7) and their low bytes in two more. ``_BF16_TABLES_PTX`` builds them from ``$4 =
# x << 7`` (an add to a bf16's exponent field; bf16 bits of 0.5 .. 6 are 0x3F00 .. 0x40C0,
# two to a word, magnitude 0 staying 0): $0/$1 the high bytes, $2/$3 the low ones.
_BF16_TABLES_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 w01, w23, w45, w67;
shl.b32 w01, $4, 16;
add.s32 w01, w01, 0x3F000000;
mad.lo.s32 w23, $4, 0x00010001, 0x3FC03F80;
mad.lo.s32 w45, $4, 0x00010001, 0x40404000;
mad.lo.s32 w67, $4, 0x00010001, 0x40C04080;
prmt.b32 $0, w01, w23, 0x7531;
prmt.b32 $1, w45, w67, 0x7531;
prmt.b32 $2, w01, w23, 0x6420;
prmt.b32 $3, w45, w67, 0x6420;
}
""")
# One word of packed E2M1 pairs (``$4``) and its group's tables (``$5, $6`` high bytes,
# ``$7, $8`` low bytes) -> four words of bf16 pairs, elements (0, 1), (2, 3), (4, 5), (6, 7).
# Two lookups give four high and four low bytes, two ``prmt`` interleave them; each code's
# sign (bit 3 of its nibble) goes to bit 15 of its bf16: the even codes' from the word
# shifted by 4, the odd ones' from the word itself, a byte each picked into place.
_FP4_BF16_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 m, mh, ha, la, hb, lb, u, s;
and.b32 m, $4, 0x77777777;
shr.b32 mh, m, 16;
prmt.b32 ha, $5, $6, m;
prmt.b32 la, $7, $8, m;
prmt.b32 hb, $5, $6, mh;
prmt.b32 lb, $7, $8, mh;
shl.b32 u, $4, 4;
prmt.b32 $0, la, ha, 0x5140;
prmt.b32 s, u, $4, 0x4000;
lop3.b32 $0, $0, s, 0x80008000, 0xF8;
prmt.b32 $1, la, ha, 0x7362;
prmt.b32 s, u, $4, 0x5010;
lop3.b32 $1, $1, s, 0x80008000, 0xF8;
prmt.b32 $2, lb, hb, 0x5140;
prmt.b32 s, u, $4, 0x6020;
lop3.b32 $2, $2, s, 0x80008000, 0xF8;
prmt.b32 $3, lb, hb, 0x7362;
prmt.b32 s, u, $4, 0x7030;
lop3.b32 $3, $3, s, 0x80008000, 0xF8;
}
""")


@triton.jit
def _bf16_tables(x):
    """``_BF16_TABLES_PTX`` for int32 ``x`` (elementwise): (high bytes 0-3, 4-7, low bytes
    0-3, 4-7); integer operations under the interpreter."""
    step = x << 7
    if _PTX:
        h_lo, h_hi, l_lo, l_hi = tl.inline_asm_elementwise(
            _BF16_TABLES_PTX, "=r,=r,=r,=r,r", [step], dtype=(tl.int32,) * 4, is_pure=True,
            pack=1)
    else:
        h_lo = tl.zeros_like(x)
        h_hi = tl.zeros_like(x)
        l_lo = tl.zeros_like(x)
        l_hi = tl.zeros_like(x)
        for m in tl.static_range(1, 8):
            # The bf16 bits of magnitude m: 0.5 (m = 1), else 2**(m // 2 - 1) (1 + (m % 2) / 2).
            if m == 1:
                bits = 0x3F00 + step
            else:
                bits = (((126 + m // 2) << 7) | ((m % 2) << 6)) + step
            high = ((bits >> 8) & 0xFF) << (8 * (m % 4))
            low = (bits & 0xFF) << (8 * (m % 4))
            if m < 4:
                h_lo = h_lo | high
                l_lo = l_lo | low
            else:
                h_hi = h_hi | high
                l_hi = l_hi | low
    return h_lo, h_hi, l_lo, l_hi


@triton.jit
def _fp4_word_bf16(word, h_lo, h_hi, l_lo, l_hi):
    """``_FP4_BF16_PTX`` on int32 tensors (elementwise); integer operations under the
    interpreter."""
    if _PTX:
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            _FP4_BF16_PTX, "=r,=r,=r,=r,r,r,r,r,r", [word, h_lo, h_hi, l_lo, l_hi],
            dtype=(tl.int32,) * 4, is_pure=True, pack=1)
    else:
        r0 = tl.zeros_like(word)
        r1 = tl.zeros_like(word)
        r2 = tl.zeros_like(word)
        r3 = tl.zeros_like(word)
        for i in tl.static_range(8):
            code = (word >> (4 * i)) & 0xF
            m = code & 7
            high = tl.where(m < 4, h_lo, h_hi)
            low = tl.where(m < 4, l_lo, l_hi)
            shift = 8 * (m & 3)
            bf16 = ((((high >> shift) & 0xFF) << 8) | ((low >> shift) & 0xFF)
                    | ((code & 8) << 12)) << (16 * (i % 2))
            if i // 2 == 0:
                r0 = r0 | bf16
            elif i // 2 == 1:
                r1 = r1 | bf16
            elif i // 2 == 2:
                r2 = r2 | bf16
            else:
                r3 = r3 | bf16
    return r0, r1, r2, r3


@triton.jit
def _fp4_operand_bf16(words, shift, BLOCK_N: tl.constexpr):
    """Words ``[BLOCK_N, 4, 4]`` and per-(key, group) exponents ``shift`` ``[BLOCK_N, 4]``
    (``e_g - max e``, at least ``1 - BF16_FOLD_SPAN``) -> bf16 ``[BLOCK_N, 128]``, E2M1
    times ``2**(6 + shift)``, in ``_fp4_dim(p, True)`` order: the bf16 dot operand
    straight from the tables, without the e4m3 bytes and their conversions."""
    h_lo, h_hi, l_lo, l_hi = _bf16_tables(shift + 6)
    h_lo = tl.broadcast_to(tl.reshape(h_lo, [BLOCK_N, 4, 1]), [BLOCK_N, 4, 4])
    h_hi = tl.broadcast_to(tl.reshape(h_hi, [BLOCK_N, 4, 1]), [BLOCK_N, 4, 4])
    l_lo = tl.broadcast_to(tl.reshape(l_lo, [BLOCK_N, 4, 1]), [BLOCK_N, 4, 4])
    l_hi = tl.broadcast_to(tl.reshape(l_hi, [BLOCK_N, 4, 1]), [BLOCK_N, 4, 4])
    r0, r1, r2, r3 = _fp4_word_bf16(words, h_lo, h_hi, l_lo, l_hi)
    x = tl.join(tl.join(r0, r2), tl.join(r1, r3))  # [key, c, k, W, J]: elements 4 W + 2 J ..
    x = tl.join(x.to(tl.int16), (x >> 16).to(tl.int16))  # [key, c, k, W, J, h]
    x = tl.permute(x, [0, 2, 3, 4, 1, 5])  # [key, k, W, J, c, h]
    return tl.reshape(x, [BLOCK_N, 128]).to(tl.bfloat16, bitcast=True)


@triton.jit
def _fp4_dim(p, BF16: tl.constexpr):
    """The dim (0..127) that position ``p`` of the K dimension holds in a decoded MXFP4 key
    operand (queries are loaded in the same order).

    Thread ``c`` of a quad holds, for its keys, the positions of one group (dims ``32 c ..
    32 c + 31``, 16 contiguous bytes of the cache): in the e4m3 dot operand the positions
    ``32 k + 16 W + 4 c + e`` (``e`` < 4 bytes of a 32-bit register), in the bf16 one
    ``32 k + 16 W + 8 J + 2 c + h`` (``e = 2 J + h``, two values a register). Word ``k``
    of the group (elements ``8 k .. 8 k + 7``) decodes to two registers ``W`` of four
    elements ``8 k + 4 W + e`` each."""
    if BF16:
        c = (p // 2) % 4
        rest = 2 * (p // 8) + p % 2  # 32 k + 16 W + 8 J + 2 c + h -> 8 k + 4 W + 2 J + h
    else:
        c = (p // 4) % 4
        rest = 4 * (p // 16) + p % 4  # 32 k + 16 W + 4 c + e -> 8 k + 4 W + e
    return 32 * c + rest


@triton.jit
def _dot_row(i, WARPS: tl.constexpr):
    """The tile row (key) that row ``i`` of a decoded MXFP4 operand holds.

    A ``[BLOCK_N, 64]`` byte load gives each thread 16 contiguous bytes of a key: 8 lanes
    down the rows, 4 across, then the warps down the rows (rows ``8 w + l``, then again
    ``8 WARPS`` further). The dot operand wants each warp's 16 rows as ``8`` lanes and a
    register (rows ``16 w + l`` and ``16 w + l + 8``). Putting tile row ``8 (2 r WARPS
    + s WARPS + w) + l`` at dot row ``8 (2 (r WARPS + w) + s) + l`` makes the two the same,
    so the decoded keys go to the tensor cores without a trip through shared memory."""
    return (((i // (16 * WARPS)) * 2 + (i // 8) % 2) * WARPS + (i // 16) % WARPS) * 8 + i % 8


@triton.jit
def _to_dot_rows(x, BLOCK_N: tl.constexpr, WARPS: tl.constexpr, COLS: tl.constexpr):
    """Rows of a ``[BLOCK_N, COLS]`` tile in ``_dot_row`` order."""
    x = tl.reshape(x, [BLOCK_N // (16 * WARPS), 2, WARPS, 8, COLS])
    return tl.reshape(tl.permute(x, [0, 2, 1, 3, 4]), [BLOCK_N, COLS])


@triton.jit
def _fp4_words(packed, BLOCK_N: tl.constexpr):
    """uint8 ``[BLOCK_N, 64]`` packed keys -> int32 ``[BLOCK_N, 4, 4]`` words (group, word
    of the group), each from four bytes (little-endian; shifts and ors that compile to
    nothing when the bytes share a register)."""
    x = tl.reshape(packed, [BLOCK_N, 16, 2, 2])  # [key, word, byte // 2, byte % 2]
    even, odd = tl.split(x)
    b0, b2 = tl.split(even)
    b1, b3 = tl.split(odd)
    word = (b0.to(tl.uint32) | (b1.to(tl.uint32) << 8) | (b2.to(tl.uint32) << 16)
            | (b3.to(tl.uint32) << 24))
    return tl.reshape(word.to(tl.int32, bitcast=True), [BLOCK_N, 4, 4])


@triton.jit
def _fp4_operand(words, t_lo, t_hi, BLOCK_N: tl.constexpr, BF16: tl.constexpr):
    """Words ``[BLOCK_N, 4, 4]`` and per-(key, group) tables ``[BLOCK_N, 4]`` -> e4m3 bytes
    ``[BLOCK_N, 128]`` (uint8) in ``_fp4_dim`` order."""
    t_lo = tl.broadcast_to(tl.reshape(t_lo, [BLOCK_N, 4, 1]), [BLOCK_N, 4, 4])
    t_hi = tl.broadcast_to(tl.reshape(t_hi, [BLOCK_N, 4, 1]), [BLOCK_N, 4, 4])
    low, high = _fp4_word(words, t_lo, t_hi)
    x = tl.join(low, high)  # [key, group c, k, W]
    e0 = x.to(tl.uint8)
    e1 = (x >> 8).to(tl.uint8)
    e2 = (x >> 16).to(tl.uint8)
    e3 = (x >> 24).to(tl.uint8)
    x = tl.join(tl.join(e0, e2), tl.join(e1, e3))  # [key, c, k, W, J, h]: element 2 J + h
    if BF16:
        x = tl.permute(x, [0, 2, 3, 4, 1, 5])  # [key, k, W, J, c, h]
    else:
        x = tl.permute(x, [0, 2, 3, 1, 4, 5])  # [key, k, W, c, J, h]
    return tl.reshape(x, [BLOCK_N, 128])


@triton.jit
def _pow2_or_zero(e):
    """2**e as float32 for int32 e <= 127; 0 below 2**-126."""
    return tl.where(e < -126, 0.0, pow2(tl.maximum(e, -126)))


@triton.jit
def _rows_v1(ctx_ptr, ctx_sb, ctx_si, b, i0, num_cols, NEXT_N: tl.constexpr, ROWS: tl.constexpr,
             RP: tl.constexpr, CTX_2D: tl.constexpr, CACHE: tl.constexpr):
    """(limit [RP], valid [RP]) of the program's rows ``i0 ..``: row ``i0 + r`` sees
    ``t < limit[r]``; slots past ``ROWS`` or ``NEXT_N`` are not valid (limit 0). ``CACHE``:
    the loads' cache modifier."""
    r = tl.arange(0, RP)
    valid = (r < ROWS) & (i0 + r < NEXT_N)
    if CTX_2D:
        n = tl.load(ctx_ptr + b * ctx_sb + (i0 + r) * ctx_si, mask=valid, other=0,
                    cache_modifier=CACHE).to(tl.int64)
    else:
        # Clamped before the subtraction: an int64 context near its minimum must not wrap.
        n = tl.maximum(tl.load(ctx_ptr + b * ctx_sb, cache_modifier=CACHE).to(tl.int64), 0)
        n = n - NEXT_N + 1 + i0 + r
    limit = tl.minimum(tl.maximum(n, 0), num_cols).to(tl.int32)
    return tl.where(valid, limit, 0), valid


@triton.jit
def _columns(b, i0, heads, NEXT_N: tl.constexpr, ROWS: tl.constexpr, HP: tl.constexpr,
             RH: tl.constexpr):
    """(row slot [1, RH], head [1, RH], live [1, RH]) of the stacked columns: column ``j``
    is head ``j % HP`` of row ``i0 + j // HP``."""
    j = tl.arange(0, RH)[None, :]
    r = j // HP
    h = j % HP
    return r, h, (r < ROWS) & (i0 + r < NEXT_N) & (h < heads)


@triton.jit
def _weights_v1(w_ptr, w_sr, w_sh, b, i0, heads, NEXT_N: tl.constexpr, ROWS: tl.constexpr,
                HP: tl.constexpr, RH: tl.constexpr, W_BF16: tl.constexpr):
    """The head weights of the stacked columns, float32 [RH] (0 for dead columns)."""
    r, h, live = _columns(b, i0, heads, NEXT_N, ROWS, HP, RH)
    raw = tl.load(w_ptr + (b * NEXT_N + i0 + r) * w_sr + h * w_sh, mask=live, other=0)
    if W_BF16:
        w = ((raw.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    else:
        w = raw
    return tl.reshape(w, [RH])


@triton.jit
def _q_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, b, i0, heads, d,
          NEXT_N: tl.constexpr, ROWS: tl.constexpr, Q_FORM: tl.constexpr, HP: tl.constexpr,
          RH: tl.constexpr, FOLD: tl.constexpr, FOLD_BF16: tl.constexpr):
    """The stacked query operand ``q^T [128, RH]``, rows ``d`` (dims). Not ``FOLD``: the
    values as the dot takes them (bf16, e4m3, E2M1 as e4m3 times 2**-6), scales not
    applied; returns (operand, 1, 1.0). ``FOLD`` (scaled queries): as ``_q_folded``, each
    column's largest scale factored out; returns (operand, exact, column factor [RH]).
    ``FOLD_BF16``: the folded values as bf16 instead of e4m3, exact unless a column's group
    exponents lie more than about 117 apart (bf16 has e4m3's and E2M1's significands and
    float32's exponent range)."""
    r, h, live = _columns(b, i0, heads, NEXT_N, ROWS, HP, RH)
    base = q_ptr + b * q_sb + (i0 + r) * q_si + h * q_sh  # [1, RH]
    dd = d[:, None]
    if FOLD:
        word = tl.load(qs_ptr + b * qs_sb + (i0 + r) * qs_si + h, mask=live, other=0)
        top, exponent = _fold_exponents(word, dd)
        if Q_FORM == 3:
            # E2M1 as the e4m3 byte of the value times 2**-6, decoded natively; times 2**12
            # it is the value times 2**6.
            x = _q_mxfp4_codes(base, d, live, RH)
            x = _e2m1_code_to_e4m3(x).to(tl.float8e4nv, bitcast=True).to(tl.float32) * 4096.0
            factor = ue8m0_to_float(top) * 0.015625  # the 2**6 above
        else:
            x = tl.load(base + dd, mask=live, other=0).to(tl.float8e4nv, bitcast=True)
            x = x.to(tl.float32)
            factor = ue8m0_to_float(top)
        if FOLD_BF16:
            # A shift below float32's normal range is clamped, and then counts as inexact.
            # (The interpreter rounds float32 subnormals to bf16 otherwise than the GPU:
            # there such values may take the per-group path instead; both are exact.)
            shift = exponent - top
            in_range = (shift >= -126) | (x == 0)
            x = x * pow2(tl.maximum(shift, -126))
            values = x.to(tl.bfloat16)
            same = (values.to(tl.float32) == x) & in_range
        else:
            x = x * pow2(tl.maximum(exponent - top, -64))
            values = x.to(tl.float8e4nv)
            same = values.to(tl.float32) == x
        exact = tl.min(tl.min((same | ~live).to(tl.int32), axis=1), axis=0)
        return values, exact, tl.reshape(factor, [RH])
    else:
        if Q_FORM == 0:
            x = tl.load(base + dd, mask=live, other=0).to(tl.bfloat16, bitcast=True)
        elif Q_FORM == 3:
            x = _e2m1_code_to_e4m3(_q_mxfp4_codes(base, d, live, RH)).to(tl.float8e4nv,
                                                                          bitcast=True)
        else:
            x = tl.load(base + dd, mask=live, other=0).to(tl.float8e4nv, bitcast=True)
        return x, 1, 1.0


@triton.jit
def _q_mxfp4_codes(base, d, live, RH: tl.constexpr):
    """The E2M1 codes (int32 [128, RH]) of MXFP4 query columns at ``base`` (bytes), rows
    ``d`` (dims). Positions 2 i and 2 i + 1 hold dims 2 j and 2 j + 1 (``_fp4_dim``), the
    two nibbles of one byte: one load a byte, the nibbles then interleaved."""
    tl.static_assert(d.shape[0] == 128)
    even = tl.reshape(d, [64, 2])
    dim, _ = tl.split(even)  # the even dims, [64]
    byte = tl.load(base + (dim // 2)[:, None], mask=live, other=0).to(tl.int32)  # [64, RH]
    pair = tl.join(byte & 0xF, byte >> 4)  # [64, RH, 2]
    return tl.reshape(tl.permute(pair, (0, 2, 1)), [128, RH])


@triton.jit
def _q_scale_words(qs_ptr, qs_sb, qs_si, b, i0, heads, NEXT_N: tl.constexpr,
                   ROWS: tl.constexpr, HP: tl.constexpr, RH: tl.constexpr):
    """The columns' four UE8M0 bytes as int32 [RH] (0 for dead columns)."""
    r, h, live = _columns(b, i0, heads, NEXT_N, ROWS, HP, RH)
    word = tl.load(qs_ptr + b * qs_sb + (i0 + r) * qs_si + h, mask=live, other=0)
    return tl.reshape(word, [RH])


@triton.jit
def _tile_v1(cache_ptr, page_stride, num_blocks, table_row, t0, hi, USE_FP4: tl.constexpr,
             MX_SCALES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr,
             D_PER_TILE: tl.constexpr,
             SCALE_LANES: tl.constexpr,
             BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SCALE_WORDS: tl.constexpr,
             WARPS: tl.constexpr, HAS_BLOCKS: tl.constexpr):
    """The keys of positions ``t0 ..``, as (positions t [BLOCK_N], read_hi [BLOCK_N], ...),
    position ``t[j]`` readable where ``t[j] < read_hi[j]`` (one bound for the tile when it
    lies in one block, which the store's compare then folds with the row's limit):
    FP8: (..., key scale [BLOCK_N], codes uint8 [BLOCK_N, 128]); MXFP4: (..., the four
    group exponents as int32 [BLOCK_N], words int32 [BLOCK_N, 4, 4]), rows in ``_dot_row``
    order."""
    VALUE_BYTES: tl.constexpr = 64 if USE_FP4 else 128
    lanes = tl.arange(0, BLOCK_N)
    if USE_FP4:
        order = _dot_row(lanes, WARPS)
    else:
        order = lanes
    t = t0 + order  # the positions of the scored rows
    d = tl.arange(0, VALUE_BYTES)[None, :]
    if BLOCK_SIZE % BLOCK_N == 0:
        # The tile lies in one block: one block id, one page (every row of a valid page is
        # read, those past ``hi`` too; their scores are not written). An invalid block id
        # scores -inf; block 0 is read in its place (nothing is read without blocks).
        block = tl.load(table_row + t0 // BLOCK_SIZE).to(tl.int64)
        ok = (block >= 0) & (block < num_blocks)
        page = cache_ptr + tl.where(ok, block, 0) * page_stride
        read_hi = tl.full([BLOCK_N], 0, tl.int32) + tl.where(ok, hi, 0)
        if BLOCK_SIZE == BLOCK_N:  # t0 is a multiple of BLOCK_N: offsets fixed per thread
            p0 = 0
        else:
            p0 = t0 % BLOCK_SIZE
        value_ptrs = page + value_offset_tl((p0 + lanes)[:, None], d, BLOCK_SIZE, VALUE_BYTES,
                                            LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES)
        if HAS_BLOCKS:
            values = tl.load(value_ptrs)
        else:
            values = tl.load(value_ptrs, mask=(lanes < 0)[:, None], other=0)
        p = p0 + order
        key_page = page
        key_mask = lanes < (BLOCK_N if HAS_BLOCKS else 0)
        rows_page = page
        rows_mask = key_mask[:, None]
    else:
        tn = t0 + lanes  # the rows as loaded
        block_n = tl.load(table_row + tn // BLOCK_SIZE, mask=tn < hi, other=-1).to(tl.int64)
        ok_n = (tn < hi) & (block_n >= 0) & (block_n < num_blocks)
        page_n = cache_ptr + tl.where(ok_n, block_n, 0) * page_stride
        values = tl.load(page_n[:, None] + value_offset_tl(
            (tn % BLOCK_SIZE)[:, None], d, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE,
            D_PER_TILE, SCALE_LANES), mask=ok_n[:, None], other=0)
        if USE_FP4:
            block = tl.load(table_row + t // BLOCK_SIZE, mask=t < hi, other=-1).to(tl.int64)
            readable = (t < hi) & (block >= 0) & (block < num_blocks)
            key_page = cache_ptr + tl.where(readable, block, 0) * page_stride
        else:
            readable = ok_n
            key_page = page_n
        p = t % BLOCK_SIZE
        key_mask = readable
        rows_page = key_page[:, None]
        rows_mask = readable[:, None]
        read_hi = tl.where(readable, hi, 0)  # readable implies t < hi
    if USE_FP4:
        # The four exponent bytes of each key: one int32 where the pages allow.
        if SCALE_WORDS and LAYOUT != 2:
            first = scale_offset_tl(p, 0, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE,
                                    SCALE_LANES)
            word = tl.load((key_page + first).to(tl.pointer_type(tl.int32)), mask=key_mask,
                           other=0)
        else:
            i4 = tl.arange(0, 4)[None, :]
            bytes4 = tl.load(rows_page + scale_offset_tl(p[:, None], i4, BLOCK_SIZE,
                                                         VALUE_BYTES, LAYOUT, N_PER_TILE,
                                                         D_PER_TILE, SCALE_LANES),
                             mask=rows_mask, other=0)
            word = tl.sum(bytes4.to(tl.int32) << (8 * i4), axis=1)
        return t, read_hi, word, _fp4_words(_to_dot_rows(values, BLOCK_N, WARPS, 64), BLOCK_N)
    else:
        first = scale_offset_tl(p, 0, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES)
        if MX_SCALES:  # four equal UE8M0 bytes
            key_scale = ue8m0_to_float(tl.load(key_page + first, mask=key_mask, other=0))
        elif SCALE_WORDS:
            key_scale = tl.load((key_page + first).to(tl.pointer_type(tl.float32)),
                                mask=key_mask, other=0)
        else:
            i4 = tl.arange(0, 4)[None, :]
            bytes4 = tl.load(rows_page + first[:, None] + i4, mask=rows_mask, other=0)
            word = tl.sum(bytes4.to(tl.int32) << (8 * i4), axis=1)
            key_scale = word.to(tl.float32, bitcast=True)
        return t, read_hi, key_scale, values


@triton.jit
def _fold_reference(cache_ptr, page_stride, num_blocks, table_row, col_lo, col_hi,
                    LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
                    SCALE_LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The reference exponent of a program's MXFP4 fold (``PROGRAM_FOLD``):
    ``FP4_FOLD_HEADROOM`` above the largest finite group exponent of the keys at
    ``[col_lo, col_lo + BLOCK_N)`` below ``col_hi`` (the program's first tile; 127 when
    none is readable), at most 254. Normalised keys' group exponents vary little along a
    sequence; a later key outside the window scores NaN, and the program is scored again
    per group, exact."""
    t = col_lo + tl.arange(0, BLOCK_N)
    block = tl.load(table_row + t // BLOCK_SIZE, mask=t < col_hi, other=-1).to(tl.int64)
    ok = (t < col_hi) & (block >= 0) & (block < num_blocks)
    page = cache_ptr + tl.where(ok, block, 0) * page_stride
    i4 = tl.arange(0, 4)[None, :]
    e = tl.load(page[:, None] + scale_offset_tl((t % BLOCK_SIZE)[:, None], i4, BLOCK_SIZE, 64,
                                                LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES),
                mask=ok[:, None], other=0).to(tl.int32)
    top = tl.max(tl.max(tl.where(e == 255, 0, e), axis=1), axis=0)
    return tl.where(top == 0, 127, tl.minimum(top + FP4_FOLD_HEADROOM, 254))


@triton.jit
def _byte_max_min(word):
    """(largest, smallest) of the four bytes of int32 ``word``, in-thread."""
    b0 = word & 0xFF
    b1 = (word >> 8) & 0xFF
    b2 = (word >> 16) & 0xFF
    b3 = (word >> 24) & 0xFF
    return (tl.maximum(tl.maximum(b0, b1), tl.maximum(b2, b3)),
            tl.minimum(tl.minimum(b0, b1), tl.minimum(b2, b3)))


@triton.jit
def _fp4_grouped_acc(words, word, emax, q_op, q_scales, GROUPED_Q: tl.constexpr,
                     Q_FORM: tl.constexpr, BLOCK_N: tl.constexpr, RH: tl.constexpr):
    """A tile of MXFP4 keys scored per 32-dim group: four dots, each of one group's values
    (E2M1 times 2**6; the tables of the other groups are zero), scaled by the group's scale
    relative to the key's largest and, with ``GROUPED_Q`` (unfolded queries), by the
    columns' scales of the group (bytes of ``q_scales``). ``[BLOCK_N, RH]``. (A loop, not
    unrolled: the groups' operands are not all live at once.)"""
    top_lo, top_hi = _fp4_tables(FP4_FOLD_TOP)
    group = tl.arange(0, 4)[None, :]
    acc = tl.zeros([BLOCK_N, RH], dtype=tl.float32)
    for g in range(4):
        t_lo = tl.broadcast_to(tl.where(group == g, top_lo, 0), [BLOCK_N, 4])
        t_hi = tl.broadcast_to(tl.where(group == g, top_hi, 0), [BLOCK_N, 4])
        codes = _fp4_operand(words, t_lo, t_hi, BLOCK_N, Q_FORM == 0)
        part = _key_dot(_key_operand_v1(codes, Q_FORM), q_op)
        # 2**(e_g - max e) in two factors: a group down to 252 binades below the key's
        # largest keeps its value (one factor would flush it below 126).
        shift = ((word >> (8 * g)) & 0xFF) - emax
        first = tl.maximum(shift, -126)
        part = part * pow2(first)[:, None] * _pow2_or_zero(shift - first)[:, None]
        if GROUPED_Q:
            part = part * ue8m0_to_float((q_scales >> (8 * g)) & 0xFF)[None, :]
        acc += part
    return acc


@triton.jit
def _fp8_grouped_acc(codes, q_op, q_scales, Q_FORM: tl.constexpr, BLOCK_N: tl.constexpr,
                     RH: tl.constexpr):
    """A tile of FP8 keys against unfolded scaled queries: four dots, one per 32-dim group
    (the other dims' bytes zeroed), each scaled by the columns' scales of the group."""
    group = tl.arange(0, 128)[None, :] // 32
    acc = tl.zeros([BLOCK_N, RH], dtype=tl.float32)
    for g in range(4):
        part = _key_dot(_key_operand_v1(tl.where(group == g, codes, 0), Q_FORM), q_op)
        acc += part * ue8m0_to_float((q_scales >> (8 * g)) & 0xFF)[None, :]
    return acc


@triton.jit
def _tile_scores(tile, q_op, w, q_scales, ref, USE_FP4: tl.constexpr,
                 GROUPED: tl.constexpr, GROUPED_Q: tl.constexpr, Q_FORM: tl.constexpr,
                 BLOCK_N: tl.constexpr, RP: tl.constexpr, HP: tl.constexpr,
                 RELU_BY_ABS: tl.constexpr, PROGRAM_FOLD: tl.constexpr):
    """The logits ``[BLOCK_N, RP]`` of a tile for the program's rows.

    MXFP4 keys, not ``GROUPED``, e4m3 operands: each group exponent ``e_g`` gives ``k_g =
    FP4_FOLD_TOP + e_g - r`` with ``r`` the key's largest exponent, or with
    ``PROGRAM_FOLD`` the program's ``ref`` (``_fold_reference``); with ``k_g`` in ``[1,
    FP4_FOLD_TOP]`` the group decodes exactly to E2M1 times ``2**(k_g - 6)``, and the tile
    is one dot, each head sum then taking the factor ``2**(r - 127)`` (the ``2**-6`` is in
    the weights). Against bf16 queries the fold is per key (``k_g = e_g - max e``, exact
    while ``> -BF16_FOLD_SPAN``) and the keys decode straight to bf16
    (``_fp4_operand_bf16``). A key a fold cannot score exactly, or with a NaN scale
    (byte 255), scores NaN, which makes the caller score the program again ``GROUPED``:
    per group (``_fp4_grouped_acc``), exact for every key. FP8 keys: one dot, or per
    group with ``GROUPED_Q``."""
    RH: tl.constexpr = RP * HP
    if USE_FP4:
        t, read_hi, word, words = tile
        if GROUPED:
            emax, _ = _byte_max_min(word)
            key_factor = ue8m0_to_float(emax)  # NaN for a byte 255
            acc = _fp4_grouped_acc(words, word, emax, q_op, q_scales, GROUPED_Q, Q_FORM,
                                   BLOCK_N, RH)
        elif PROGRAM_FOLD and Q_FORM != 0:
            # Every group relative to the program's reference exponent: no per-key scale.
            e = (word[:, None] >> (8 * tl.arange(0, 4)[None, :])) & 0xFF
            k = e - ref + FP4_FOLD_TOP
            exact = (k >= 1) & (k <= FP4_FOLD_TOP)  # a byte 255 is above any ref
            t_lo, t_hi = _fp4_tables(k)
            t_lo = tl.where(exact, t_lo, _E4M3_NAN_WORD)
            t_hi = tl.where(exact, t_hi, _E4M3_NAN_WORD)
            operand = _key_operand_v1(_fp4_operand(words, t_lo, t_hi, BLOCK_N, False), Q_FORM)
            acc = _key_dot(operand, q_op)
            # 2**(ref - 127), ref in [1, 254]: a normal float32.
            key_factor = (tl.full([BLOCK_N], 0, tl.int32) + (ref << 23)).to(tl.float32,
                                                                           bitcast=True)
            if not _PTX:
                # The interpreter reads e4m3 NaN bytes as numbers: the same NaN, by hand.
                outside = tl.max(tl.where(exact, 0, 1), axis=1)
                key_factor = tl.where(outside != 0, float("nan"), key_factor)
        else:
            emax, emin = _byte_max_min(word)
            # 2**(max e - 127) (2**-127 for a byte 0); NaN where the fold is not exact.
            key_factor = tl.maximum(emax << 23, 0x00400000).to(tl.float32, bitcast=True)
            span = BF16_FOLD_SPAN if Q_FORM == 0 else FP4_FOLD_TOP
            key_factor = tl.where((emax - emin >= span) | (emax == 255), float("nan"),
                                  key_factor)
            e = (word[:, None] >> (8 * tl.arange(0, 4)[None, :])) & 0xFF
            if Q_FORM == 0:
                operand = _fp4_operand_bf16(words, e - emax[:, None], BLOCK_N)
            else:
                t_lo, t_hi = _fp4_tables(e - emax[:, None] + FP4_FOLD_TOP)
                operand = _key_operand_v1(_fp4_operand(words, t_lo, t_hi, BLOCK_N, False),
                                          Q_FORM)
            acc = _key_dot(operand, q_op)
    else:
        t, read_hi, key_factor, codes = tile
        if GROUPED_Q:
            acc = _fp8_grouped_acc(codes, q_op, q_scales, Q_FORM, BLOCK_N, RH)
        else:
            acc = _key_dot(_key_operand_v1(codes, Q_FORM), q_op)
    if RELU_BY_ABS and not GROUPED and not GROUPED_Q:
        # (x + |x|) w = 2 relu(x) w for the finite x of one unscaled dot, the 2 taken back
        # with the key's factor: the same logits unless a term is subnormal. An add
        # instead of a max, off the pipe the decoding keeps busy. (The per-group paths
        # scale their partial sums, which may overflow: they keep the max.)
        terms = tl.reshape(acc + tl.abs(acc), [BLOCK_N, RP, HP]) * tl.reshape(w, [1, RP, HP])
        key_factor = key_factor * 0.5
    else:
        terms = tl.reshape(_relu(acc), [BLOCK_N, RP, HP]) * tl.reshape(w, [1, RP, HP])
    # FP8: the key's scale, a positive power of two; MXFP4: its largest group scale.
    return tl.sum(terms, axis=2) * key_factor[:, None]


@triton.jit
def _store_rows(out_ptr, out_sr, row_base, t, col_hi, scores, read_hi, limit, valid,
                CLEAN: tl.constexpr, RP: tl.constexpr):
    """``_store_row`` for the program's rows at once: ``scores`` [BLOCK_N, RP], position
    ``t[j]`` readable below ``read_hi[j]``. Returns the values (``-inf`` where nothing is
    seen)."""
    # One compare a value for each of the two masks: the bounds are folded first (limit
    # is 0 for a row that is not valid).
    seen_hi = tl.minimum(read_hi[:, None], limit[None, :])
    value = tl.where(t[:, None] < seen_hi, scores, float("-inf"))
    if CLEAN:
        mask = t[:, None] < tl.where(valid, col_hi, 0)[None, :]
    else:
        mask = t[:, None] < tl.minimum(col_hi, limit)[None, :]
    rows = row_base + tl.arange(0, RP)
    pointers = out_ptr + rows[None, :] * out_sr + t[:, None]
    if _PTX and RP == 1:
        _store_in_place(pointers, value, mask)
    else:  # (several rows: more stores a thread in place, measured slower)
        tl.store(pointers, value, mask=mask)
    return value


# A predicated store of one float32 ($2 to address $1 where $3 is not 0); $0 is a dummy.
_STORE_PTX: tl.constexpr = tl.constexpr("""
{
.reg .pred p;
setp.ne.b32 p, $3, 0;
@p st.global.b32 [$1], $2;
mov.b32 $0, 0;
}
""")


@triton.jit
def _store_in_place(pointers, value, mask):
    """``tl.store(pointers, value, mask=mask)`` for float32 ``value`` in the layout it has.
    ``tl.store`` would first move a tile's logits into a layout of one position a thread,
    through shared memory and a barrier of the program's warps; stored where the head sum
    leaves them (on sm_90 a thread holds two keys' sums, as do the other three threads of
    its quad), each value is written by every thread that holds it: the same bits (the
    sum's butterfly gives them all the same value), one sector a warp's store."""
    tl.inline_asm_elementwise(_STORE_PTX, "=r,l,r,r", [pointers.to(tl.int64), value,
                              mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _scan_v1(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr, row_base, col_lo,
             hi, col_hi, q_op, w, q_scales, ref, limit, valid, Q_FORM: tl.constexpr,
             USE_FP4: tl.constexpr, MX_SCALES: tl.constexpr, LAYOUT: tl.constexpr,
             N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
             SCALE_LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
             NUM_STAGES: tl.constexpr, CLEAN: tl.constexpr, SCALE_WORDS: tl.constexpr,
             GROUPED: tl.constexpr, GROUPED_Q: tl.constexpr, RP: tl.constexpr,
             HP: tl.constexpr, WARPS: tl.constexpr, HAS_BLOCKS: tl.constexpr,
             RELU_BY_ABS: tl.constexpr, PROGRAM_FOLD: tl.constexpr):
    """The tile loop of the stacked form over positions ``[col_lo, hi)``. MXFP4 keys, not
    ``GROUPED``: returns 1.0 when some logit written was NaN (a key the fold cannot score
    exactly, or a poisoned one), else 0.0; otherwise 0.0."""
    # NaN once any logit written was NaN: one max a value (a NaN-propagating max), tested
    # after the loop.
    nan_seen = tl.full([BLOCK_N, RP], float("-inf"), dtype=tl.float32)
    for t0 in tl.range(col_lo, hi, BLOCK_N, num_stages=NUM_STAGES):
        tile = _tile_v1(cache_ptr, page_stride, num_blocks, table_row, t0, hi, USE_FP4,
                        MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_N,
                        SCALE_WORDS, WARPS, HAS_BLOCKS)
        scores = _tile_scores(tile, q_op, w, q_scales, ref, USE_FP4, GROUPED, GROUPED_Q,
                              Q_FORM, BLOCK_N, RP, HP, RELU_BY_ABS, PROGRAM_FOLD)
        value = _store_rows(out_ptr, out_sr, row_base, tile[0], col_hi, scores, tile[1], limit,
                            valid, CLEAN, RP)
        if USE_FP4 and not GROUPED:
            nan_seen = tl.maximum(nan_seen, value, propagate_nan=tl.PropagateNan.ALL)
    return tl.max(tl.max(tl.where(nan_seen != nan_seen, 1.0, 0.0), axis=1), axis=0)


@triton.jit
def _bf16_dims(d, USE_FP4: tl.constexpr):
    """The dims of the bf16 query operand's rows: MXFP4 keys decode to bf16 in their own
    order (``_fp4_dim``); FP8 keys keep ``d``."""
    if USE_FP4:
        return _fp4_dim(tl.arange(0, 128), True)
    else:
        return d


@triton.jit
def _rescan_rows(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, cache_ptr,
                 page_stride, num_blocks, ctx_ptr, ctx_sb, ctx_si, table_row, out_ptr, out_sr,
                 num_cols, heads, b, i0, row_base, col_lo, hi, col_hi, d, w_fold,
                 NEXT_N: tl.constexpr, ROWS: tl.constexpr, CTX_2D: tl.constexpr,
                 Q_FORM: tl.constexpr, W_BF16: tl.constexpr, USE_FP4: tl.constexpr,
                 MX_SCALES: tl.constexpr, LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr,
                 D_PER_TILE: tl.constexpr,
                 SCALE_LANES: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, HP: tl.constexpr, BLOCK_N: tl.constexpr,
                 NUM_STAGES: tl.constexpr, CLEAN: tl.constexpr, SCALE_WORDS: tl.constexpr,
                 WARPS: tl.constexpr, FOLD_Q: tl.constexpr, HAS_BLOCKS: tl.constexpr,
                 RELU_BY_ABS: tl.constexpr):
    """The program's rows scored again, exact for every input: unscaled or folded queries
    (``FOLD_Q``) with MXFP4 keys per key group, one row at a time; other scaled queries
    folded into bf16 (MXFP4 keys decoded to bf16 per key), all the rows in one stacked dot
    where that is exact for every row and key, else one row at a time, each in bf16 where
    that is exact for it, else per query group (and per key group).
    One row at a time keeps the per-group partial sums few. Each row is written over the
    program's range ``[col_lo, hi)`` (-inf past its own limit), as in the stacked form."""
    # Folded queries are unscaled e4m3 values.
    FORM: tl.constexpr = 1 if Q_FORM >= 2 else Q_FORM
    rows_left = tl.full([], 1, tl.int32)
    if ROWS > 1 and Q_FORM >= 2 and not FOLD_Q:
        # Every row's keys read once: the rows side by side in one bf16 dot, as bf16
        # queries are scored. (A row the bf16 fold cannot take, or an MXFP4 key too wide
        # for it, sends every row to the loop below, which writes each row again.)
        RP: tl.constexpr = row_slots(ROWS)
        # (Names of their own: the loop below gives its names one row's shapes.)
        q_rows, rows_exact, rows_factor = _q_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si,
                                                b, i0, heads, _bf16_dims(d, USE_FP4), NEXT_N,
                                                ROWS, Q_FORM, HP, RP * HP, True, True)
        if rows_exact != 0:
            rows_limit, rows_valid = _rows_v1(ctx_ptr, ctx_sb, ctx_si, b, i0, num_cols, NEXT_N,
                                              ROWS, RP, CTX_2D, "")
            rows_w = _weights_v1(w_ptr, w_sr, w_sh, b, i0, heads, NEXT_N, ROWS, HP, RP * HP,
                                 W_BF16) * w_fold * rows_factor
            rows_failed = _scan_v1(cache_ptr, page_stride, num_blocks, table_row, out_ptr,
                                   out_sr, row_base, col_lo, hi, col_hi, q_rows, rows_w, 0, 0,
                                   rows_limit, rows_valid, 0, USE_FP4, MX_SCALES, LAYOUT,
                                   N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_N,
                                   NUM_STAGES, CLEAN, SCALE_WORDS, False, False, RP, HP, WARPS,
                                   HAS_BLOCKS, False, False)
            rows_left = (rows_failed != 0).to(tl.int32)
    for r in range(ROWS * rows_left):  # (no row left once the stacked pass scored them)
        i = i0 + r
        limit, valid = _rows_v1(ctx_ptr, ctx_sb, ctx_si, b, i, num_cols, NEXT_N, 1, 1, CTX_2D, "")
        w = _weights_v1(w_ptr, w_sr, w_sh, b, i, heads, NEXT_N, 1, HP, HP, W_BF16) * w_fold
        if Q_FORM < 2 or FOLD_Q:
            q_op, _, factor = _q_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, b, i, heads,
                                    d, NEXT_N, 1, Q_FORM, HP, HP, Q_FORM >= 2, False)
            _scan_v1(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr,
                     row_base + r, col_lo, hi, col_hi, q_op, w * factor, 0, 0, limit, valid,
                     FORM, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES,
                     BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN, SCALE_WORDS, USE_FP4, False, 1, HP,
                     WARPS, HAS_BLOCKS, RELU_BY_ABS, False)
        else:
            # Scaled queries the e4m3 fold cannot take exactly: folded into bf16 instead
            # (exact unless a head's group exponents lie too far apart for bf16), one bf16
            # dot a tile, MXFP4 keys decoded to bf16 (a key whose group exponents lie too far
            # apart scores NaN); the row is scored per group where either fails.
            q_bf16, exact, factor = _q_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, b, i,
                                          heads, _bf16_dims(d, USE_FP4), NEXT_N, 1, Q_FORM, HP,
                                          HP, True, True)
            failed = tl.full([], 1.0, tl.float32)
            if exact != 0:
                failed = _scan_v1(cache_ptr, page_stride, num_blocks, table_row, out_ptr,
                                  out_sr, row_base + r, col_lo, hi, col_hi, q_bf16, w * factor,
                                  0, 0, limit, valid, 0, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE,
                                  D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_N, NUM_STAGES,
                                  CLEAN, SCALE_WORDS, False, False, 1, HP, WARPS, HAS_BLOCKS,
                                  False, False)
            if failed != 0:
                q_op, _, _ = _q_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, b, i, heads,
                                   d, NEXT_N, 1, Q_FORM, HP, HP, False, False)
                if Q_FORM == 3:
                    w = w * 64.0  # E2M1 values as e4m3 bytes are 2**-6 of themselves
                q_scales = _q_scale_words(qs_ptr, qs_sb, qs_si, b, i, heads, NEXT_N, 1, HP, HP)
                _scan_v1(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr,
                         row_base + r, col_lo, hi, col_hi, q_op, w, q_scales, 0, limit, valid,
                         Q_FORM, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE,
                         SCALE_LANES, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN, SCALE_WORDS,
                         USE_FP4, True, 1, HP, WARPS, HAS_BLOCKS, RELU_BY_ABS, False)


@triton.constexpr_function
def row_slots(rows):
    """The row slots of a stacked program of ``rows`` query rows: a power of two (1, 2 or
    4); its dot has ``row_slots(rows) * HP`` columns."""
    return 1 if rows == 1 else (2 if rows == 2 else 4)


@triton.constexpr_function
def fold_entry_bytes(columns):
    """Bytes of one row group's entry in ``fold_queries_kernel``'s buffer: the e4m3 operand
    ``[128, columns]``, the columns' float32 factors, the int32 exact flag (16 bytes, so
    that every entry and its parts stay aligned)."""
    return 128 * columns + 4 * columns + 16


@triton.jit
def _folded_pointers(fold_ptr, index, RH: tl.constexpr):
    """(operand [128, RH], factors [RH], exact flag) pointers of entry ``index`` (int64)."""
    entry = fold_ptr + index * fold_entry_bytes(RH)
    p = tl.arange(0, 128)[:, None]
    j = tl.arange(0, RH)
    factors = (entry + 128 * RH).to(tl.pointer_type(tl.float32))
    exact = (entry + 132 * RH).to(tl.pointer_type(tl.int32))
    return entry + p * RH + j[None, :], factors + j, exact


@triton.jit
def _load_folded(fold_ptr, index, RH: tl.constexpr):
    """What ``_q_v1`` returns with ``FOLD``, as ``fold_queries_kernel`` stored it."""
    values_at, factors_at, exact_at = _folded_pointers(fold_ptr, index, RH)
    values = tl.load(values_at).to(tl.float8e4nv, bitcast=True)
    return values, tl.load(exact_at), tl.load(factors_at)


@triton.jit
def fold_queries_kernel(
    q_ptr, q_sb, q_si, q_sh,
    qs_ptr, qs_sb, qs_si,
    fold_ptr,
    heads,
    NEXT_N: tl.constexpr,
    ROWS: tl.constexpr,
    Q_FORM: tl.constexpr,
    USE_FP4: tl.constexpr,
    HP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid ``(B * ceil(NEXT_N / ROWS),)``: the scaled queries of each row group folded
    (``_q_v1``) once, for every program of ``paged_mqa_logits_kernel`` that scores the
    group (``PREFOLDED``), instead of once in each of them. ``fold``: an entry of
    ``fold_entry_bytes(RH)`` bytes a row group: the e4m3 operand ``[128, RH]`` (rows in
    the order the group's dot takes its dims), each column's float32 factor, and an int32
    1 where the fold is exact for every column."""
    wait_for_previous_kernel(USE_PDL)
    tl.static_assert(Q_FORM >= 2, "only scaled queries are folded")
    ROW_GROUPS: tl.constexpr = (NEXT_N + ROWS - 1) // ROWS
    RP: tl.constexpr = row_slots(ROWS)
    RH: tl.constexpr = RP * HP
    pid = tl.program_id(0).to(tl.int64)
    b = pid // ROW_GROUPS
    i0 = (pid % ROW_GROUPS) * ROWS
    p = tl.arange(0, 128)
    d = _fp4_dim(p, False) if USE_FP4 else p
    values, exact, factor = _q_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, b, i0, heads,
                                  d, NEXT_N, ROWS, Q_FORM, HP, RH, True, False)
    values_at, factors_at, exact_at = _folded_pointers(fold_ptr, pid, RH)
    tl.store(values_at, values.to(tl.uint8, bitcast=True))
    tl.store(factors_at, factor)
    tl.store(exact_at, exact)


@triton.jit
def _program_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, cache_ptr,
                page_stride, num_blocks, ctx_ptr, ctx_sb, ctx_si, table_row, out_ptr, out_sr,
                num_cols, heads, b, i0, row_base, col_lo, col_hi, NEXT_N: tl.constexpr,
                ROWS: tl.constexpr, CTX_2D: tl.constexpr, Q_FORM: tl.constexpr,
                W_BF16: tl.constexpr, USE_FP4: tl.constexpr, MX_SCALES: tl.constexpr,
                LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
                SCALE_LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                HP: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
                CLEAN: tl.constexpr, SCALE_WORDS: tl.constexpr, WARPS: tl.constexpr,
                HAS_BLOCKS: tl.constexpr, RELU_BY_ABS: tl.constexpr, fold_ptr, fold_index,
                PREFOLDED: tl.constexpr, PROGRAM_FOLD: tl.constexpr):
    """The stacked form of one program; returns ``hi`` (the end of the scored positions).

    Scaled queries are folded (``_q_v1``) when that is exact for all the program's columns;
    MXFP4 keys are folded. Otherwise (a query head, or some key of the program's range,
    whose group exponents spread too far; such a key scores NaN in the first pass) the
    rows are scored again (``_rescan_rows``: side by side in one bf16 dot, else one at a
    time in bf16 or per group), overwriting any first pass's logits (the reduction that
    finds a NaN is a barrier between the two passes' stores). ``PREFOLDED`` (scaled
    queries): the fold was done once for every program of the row group by
    ``fold_queries_kernel`` (its entry ``fold_index``), not here."""
    RP: tl.constexpr = row_slots(ROWS)
    RH: tl.constexpr = RP * HP
    tl.static_assert(RH <= 256, "the stacked rows' columns are one dot's N (<= 256)")
    tl.static_assert(not USE_FP4 or BLOCK_N % (16 * WARPS) == 0,
                     "MXFP4 keys need 16 rows a warp (BLOCK_N a multiple of 16 * warps)")
    tl.static_assert(not PROGRAM_FOLD or (USE_FP4 and Q_FORM != 0),
                     "a program-wide fold is for MXFP4 keys against e4m3 operands")
    if PROGRAM_FOLD:
        ref = _fold_reference(cache_ptr, page_stride, num_blocks, table_row, col_lo, col_hi,
                              LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_N)
    else:
        ref = 0
    limit, valid = _rows_v1(ctx_ptr, ctx_sb, ctx_si, b, i0, num_cols, NEXT_N, ROWS, RP, CTX_2D, "")
    hi = tl.minimum(col_hi, tl.max(limit, axis=0))
    p = tl.arange(0, 128)
    if USE_FP4:
        d = _fp4_dim(p, Q_FORM == 0)
        w_fold = 0.015625  # decoded keys are E2M1 times 2**(6 + ...)
    else:
        d = p
        w_fold = 1.0
    w = _weights_v1(w_ptr, w_sr, w_sh, b, i0, heads, NEXT_N, ROWS, HP, RH, W_BF16) * w_fold
    # Folded queries are unscaled e4m3 values.
    FORM: tl.constexpr = 1 if Q_FORM >= 2 else Q_FORM
    if PREFOLDED:
        tl.static_assert(Q_FORM >= 2, "only scaled queries are folded")
        q_op, exact, factor = _load_folded(fold_ptr, fold_index, RH)
    else:
        q_op, exact, factor = _q_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, b, i0, heads,
                                    d, NEXT_N, ROWS, Q_FORM, HP, RH, Q_FORM >= 2, False)
    w = w * factor
    if exact != 0:
        nan_seen = _scan_v1(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr,
                            row_base, col_lo, hi, col_hi, q_op, w, 0, ref, limit, valid, FORM,
                            USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES,
                            BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN, SCALE_WORDS, False, False,
                            RP, HP, WARPS, HAS_BLOCKS, RELU_BY_ABS, PROGRAM_FOLD)
        if USE_FP4:
            if nan_seen != 0:
                _rescan_rows(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh,
                             cache_ptr, page_stride, num_blocks, ctx_ptr, ctx_sb, ctx_si, table_row,
                             out_ptr, out_sr, num_cols, heads, b, i0, row_base, col_lo, hi, col_hi,
                             d, w_fold, NEXT_N, ROWS, CTX_2D, Q_FORM, W_BF16, USE_FP4, MX_SCALES,
                             LAYOUT, N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, HP, BLOCK_N,
                             NUM_STAGES, CLEAN, SCALE_WORDS, WARPS, True, HAS_BLOCKS, RELU_BY_ABS)
    else:
        _rescan_rows(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, cache_ptr,
                     page_stride, num_blocks, ctx_ptr, ctx_sb, ctx_si, table_row, out_ptr, out_sr,
                     num_cols, heads, b, i0, row_base, col_lo, hi, col_hi, d, w_fold, NEXT_N, ROWS,
                     CTX_2D, Q_FORM, W_BF16, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE,
                     SCALE_LANES, BLOCK_SIZE, HP, BLOCK_N, NUM_STAGES, CLEAN, SCALE_WORDS, WARPS,
                     False, HAS_BLOCKS, RELU_BY_ABS)
    return hi


@triton.constexpr_function
def _hint_lines(page_bytes):
    """Line addresses per page of the hint: every 128-byte line a page of ``page_bytes``
    can touch, whatever its alignment (a power of two for the tensor's shape)."""
    lines = page_bytes // 128 + 2
    return 1 << (lines - 1).bit_length()


@triton.jit
def _hint_first_pages(ctx_ptr, ctx_sb, ctx_si, b, i0, num_cols, table_row, cache_ptr,
                      page_stride, num_blocks, col_lo, col_hi, NEXT_N: tl.constexpr,
                      ROWS: tl.constexpr, CTX_2D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                      PAGE_BYTES: tl.constexpr, TILES: tl.constexpr):
    """Before the dependent-launch wait: the pages of the program's first ``TILES`` tiles
    (a tile a page) asked for into L2, so that its chain of reads after the wait (context
    length, block id, page) finds them on chip.

    The context length and block ids read here may still be changing (the previous kernel
    may write them): they only choose what to hint, clamped into the cache, and are read
    again after the wait. They are read past L1 (``.cg``), which keeps no copy that a read
    after the wait could find stale, and side by side: the block ids of the program's
    columns, whatever the context length."""
    RP: tl.constexpr = row_slots(ROWS)
    limit, _ = _rows_v1(ctx_ptr, ctx_sb, ctx_si, b, i0, num_cols, NEXT_N, ROWS, RP, CTX_2D, ".cg")
    t0 = col_lo + tl.arange(0, TILES) * BLOCK_SIZE
    block = tl.load(table_row + t0 // BLOCK_SIZE, mask=t0 < col_hi, other=0,
                    cache_modifier=".cg").to(tl.int64)
    hi = tl.minimum(col_hi, tl.max(limit, axis=0))
    # Pages the scan will read: block ids out of range are not (they score -inf).
    wanted = (t0 < hi) & (block >= 0) & (block < num_blocks)
    block = tl.where(wanted, block, 0)
    # A line every 128 bytes, the last one at the page's last byte: each line the page
    # touches, whatever its alignment, once.
    step = tl.arange(0, _hint_lines(PAGE_BYTES)) * 128
    pages = (cache_ptr + block[:, None] * page_stride
             + tl.minimum(step, PAGE_BYTES - 1)[None, :])
    hint_l2(pages, wanted[:, None] & (step < PAGE_BYTES + 127)[None, :])


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
    fold_ptr,
    max_model_len, num_cols, chunk, tail_chunk, heads,
    NEXT_N: tl.constexpr,
    ROWS: tl.constexpr,
    CTX_2D: tl.constexpr,
    Q_FORM: tl.constexpr,
    W_BF16: tl.constexpr,
    USE_FP4: tl.constexpr,
    MX_SCALES: tl.constexpr,
    LAYOUT: tl.constexpr,
    N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
    SCALE_LANES: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CLEAN: tl.constexpr,
    NATIVE: tl.constexpr,
    SCALE_WORDS: tl.constexpr,
    VARIANT: tl.constexpr,
    WARPS: tl.constexpr,
    HAS_BLOCKS: tl.constexpr,
    USE_PDL: tl.constexpr,
    RELU_BY_ABS: tl.constexpr,
    HINT_TILES: tl.constexpr,
    PREFOLDED: tl.constexpr,
    PROGRAM_FOLD: tl.constexpr,
):
    """Grid ``(B * ceil(NEXT_N / ROWS), splits)``. Pointers to bf16 or e4m3 data are passed
    as raw bits (int16 / uint8) and reinterpreted here. ``num_cols = min(max_model_len,
    max_blocks * BLOCK_SIZE)``; split ``s`` scores the positions ``[s * chunk, (s + 1) *
    chunk)`` below ``num_cols`` (``chunk`` a multiple of ``BLOCK_N``) and, when ``CLEAN``,
    writes ``-inf`` to its share ``tail_chunk`` of the columns ``[num_cols,
    max_model_len)``. ``SCALE_WORDS``: the cache's address and page stride are multiples of 4
    (a key's four scale bytes load as one int32). ``HAS_BLOCKS``: ``num_blocks >= 1`` (block
    0 can stand in for an invalid block id, so reads of whole pages need no mask).
    ``VARIANT``: the launch form (``VARIANT_ROWS``, ``VARIANT_STACKED``; native only);
    ``WARPS``: the warps along the keys. ``USE_PDL``: a ``dependent_launch`` mode.
    ``RELU_BY_ABS`` (stacked form, not bf16 queries): ``relu(x) w`` as ``(x + |x|) w / 2``.
    ``HINT_TILES`` (launched dependently, a tile a page, NVIDIA only): the pages of the
    program's first tiles are asked for into L2 before the wait (``_hint_first_pages``).
    ``PREFOLDED`` (stacked form, scaled queries): the queries come folded from
    ``fold_queries_kernel`` (``fold_ptr``; unread otherwise). ``PROGRAM_FOLD`` (stacked form,
    MXFP4 keys, not bf16 queries): the keys' group scales folded relative to one exponent
    per program (``_fold_reference``) instead of each key's largest."""
    ROW_GROUPS: tl.constexpr = (NEXT_N + ROWS - 1) // ROWS
    pid = tl.program_id(0)
    b = (pid // ROW_GROUPS).to(tl.int64)
    i0 = (pid % ROW_GROUPS) * ROWS
    split = tl.program_id(1)
    col_lo = split * chunk
    col_hi = tl.minimum(col_lo + chunk, num_cols)
    table_row = table_ptr + b * table_sb
    if HINT_TILES > 0:
        tl.static_assert(USE_PDL != 0 and BLOCK_N == BLOCK_SIZE and HAS_BLOCKS)
        _hint_first_pages(ctx_ptr, ctx_sb, ctx_si, b, i0, num_cols, table_row, cache_ptr,
                          page_stride, num_blocks, col_lo, col_hi, NEXT_N, ROWS, CTX_2D,
                          BLOCK_SIZE, BLOCK_SIZE * (ROW_BYTES_FP4 if USE_FP4 else ROW_BYTES_FP8),
                          HINT_TILES)
    wait_for_previous_kernel(USE_PDL)  # everything below may read what it wrote
    tl.static_assert(ROWS >= 1 and ROWS <= 4)
    tl.static_assert(not PREFOLDED or (NATIVE and VARIANT == 1), "folded for the stacked form")
    tl.static_assert(not PROGRAM_FOLD or (NATIVE and VARIANT == 1), "for the stacked form")
    tl.static_assert(not RELU_BY_ABS or Q_FORM != 0, "bf16 queries may overflow x + |x|")
    tl.static_assert(HP >= 16 and BLOCK_N >= 16)
    tl.static_assert(not (USE_FP4 and LAYOUT == 1), "the tiled layout is FP8 only")
    tl.static_assert(USE_FP4 or LAYOUT != 2, "the preshuffle layout is MXFP4 only")
    # Per-32-dim scales need a dot per group (native path): MXFP4 keys, scaled queries.
    GROUPED: tl.constexpr = NATIVE and (USE_FP4 or Q_FORM >= 2)
    row_base = b * NEXT_N + i0
    if NATIVE and VARIANT == 1:
        hi = _program_v1(q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh,
                         cache_ptr, page_stride, num_blocks, ctx_ptr, ctx_sb, ctx_si, table_row,
                         out_ptr, out_sr, num_cols, heads, b, i0, row_base, col_lo, col_hi, NEXT_N,
                         ROWS, CTX_2D, Q_FORM, W_BF16, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE,
                         D_PER_TILE, SCALE_LANES, BLOCK_SIZE, HP, BLOCK_N, NUM_STAGES, CLEAN,
                         SCALE_WORDS, WARPS, HAS_BLOCKS, RELU_BY_ABS, fold_ptr,
                         pid.to(tl.int64), PREFOLDED, PROGRAM_FOLD)
    elif NATIVE and Q_FORM >= 2:
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
                  N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN,
                  NATIVE, USE_FP4, SCALE_WORDS)
        else:
            r0, r1, r2, r3, lmax, ok = _load_rows(
                q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, ctx_ptr,
                ctx_sb, ctx_si, b, i0, heads, num_cols, NEXT_N, ROWS, CTX_2D, Q_FORM, USE_FP4,
                HP, NATIVE, GROUPED, W_BF16, False)
            _scan(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr, row_base,
                  col_lo, hi, col_hi, r0, r1, r2, r3, ROWS, Q_FORM, USE_FP4, MX_SCALES, LAYOUT,
                  N_PER_TILE, D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN,
                  NATIVE, GROUPED, SCALE_WORDS)
    else:
        r0, r1, r2, r3, lmax, ok = _load_rows(
            q_ptr, q_sb, q_si, q_sh, qs_ptr, qs_sb, qs_si, w_ptr, w_sr, w_sh, ctx_ptr, ctx_sb,
            ctx_si, b, i0, heads, num_cols, NEXT_N, ROWS, CTX_2D, Q_FORM, USE_FP4, HP, NATIVE,
            GROUPED, W_BF16, False)
        hi = tl.minimum(col_hi, lmax)
        _scan(cache_ptr, page_stride, num_blocks, table_row, out_ptr, out_sr, row_base, col_lo,
              hi, col_hi, r0, r1, r2, r3, ROWS, Q_FORM, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE,
              D_PER_TILE, SCALE_LANES, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CLEAN, NATIVE, GROUPED,
              SCALE_WORDS)

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
