"""Triton helpers whose results are bit-exact on every backend, the CPU interpreter included.

``EXACT_CASTS`` selects integer/compare implementations of the float conversions. The
interpreter needs them (its bf16 cast truncates, its bf16 -> float32 cast misreads
subnormals and its fp8 cast rounds ties away and drops carries); GPUs with native
conversions may use those, which give the same bytes. The native forms are inline PTX
(NVIDIA sm_89 and newer, where ``EXACT_CASTS`` is off): the paired bf16 rounding, the e4m3
codes four at a time, and the E2M1 bytes (of two scaled values, or four bytes at a time
from unscaled keys and their group exponents); ``tests/test_numerics.py`` checks them on
the GPU against torch and the reference (every bf16 value up to 6, and times 2**e).
"""

import triton
import triton.language as tl

from .. import layout

# The running Triton's (major, minor): where versions compile the same source differently,
# the kernels (and their launch settings) choose the form by it.
TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])

# 1.5 * 2**23: adding it to a float in [0, 2**22) rounds that float to an integer (RNE)
# and leaves the integer in the low mantissa bits.
ROUND_MAGIC: tl.constexpr = tl.constexpr(12582912.0)
ROUND_MAGIC_BITS: tl.constexpr = tl.constexpr(0x4B400000)


@triton.jit
def round_to_bf16(x, EXACT_CASTS: tl.constexpr):
    """float32 -> nearest bf16 (ties to even), returned as float32; NaN stays NaN."""
    if EXACT_CASTS:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        # A NaN whose payload fills the high mantissa bits would carry into the sign.
        y = tl.where(x == x, bits.to(tl.float32, bitcast=True), x)
    else:
        y = x.to(tl.bfloat16).to(tl.float32)
    return y


@triton.jit
def widen_to_float32(x, EXACT_CASTS: tl.constexpr):
    """bf16, float16 or float32 -> float32, exactly: a bf16 is the top half of its float32
    (moved there as an integer with ``EXACT_CASTS``)."""
    if EXACT_CASTS and x.dtype == tl.bfloat16:
        y = (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        y = x.to(tl.float32)
    return y


_BF16_PAIR_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 p;
cvt.rn.bf16x2.f32 p, $3, $2;
shl.b32 $0, p, 16;
and.b32 $1, p, 0xFFFF0000;
}
""")


@triton.jit
def round_to_bf16_pair(x, y, EXACT_CASTS: tl.constexpr):
    """``round_to_bf16`` of two tensors; natively one paired conversion for both."""
    if EXACT_CASTS:
        x = round_to_bf16(x, EXACT_CASTS)
        y = round_to_bf16(y, EXACT_CASTS)
    else:
        x, y = tl.inline_asm_elementwise(
            _BF16_PAIR_PTX, "=r,=r,r,r", [x, y], dtype=(tl.float32, tl.float32),
            is_pure=True, pack=1)
    return x, y


@triton.jit
def ceil_log2_of_ratio(amax, LIMIT: tl.constexpr):
    """ceil(log2(amax / LIMIT)) for LIMIT = 448 or 6, without the division.

    LIMIT = M * 2**K with M = 1.75 or 1.5. For amax = m * 2**E (m in [1, 2)), amax / LIMIT
    = (m / M) * 2**(E - K) with m / M in (0.5, 1] when m <= M, in (1, 2) otherwise: the
    answer is E - K, plus one when m > M. The rounded quotient the contract divides gives
    the same answer for every amax that occurs (bf16 values and the fixed floors): none
    lies within an ulp of M * 2**j. (``tests/test_numerics.py`` checks every bf16 value.)
    """
    tl.static_assert(LIMIT == layout.FP8_MAX or LIMIT == layout.MXFP4_MAX)
    tl.static_assert(layout.FP8_MAX == 1.75 * 2**8 and layout.MXFP4_MAX == 1.5 * 2**2)
    K: tl.constexpr = 8 if LIMIT == layout.FP8_MAX else 2
    M_BITS: tl.constexpr = 0x600000 if LIMIT == layout.FP8_MAX else 0x400000  # mantissa of 1.75, 1.5
    bits = amax.to(tl.int32, bitcast=True)
    return ((bits >> 23) & 0xFF) - (127 + K) + ((bits & 0x7FFFFF) > M_BITS).to(tl.int32)


@triton.jit
def pow2(e):
    """2**e as float32 for int32 e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def float_to_e4m3(v, EXACT_CASTS: tl.constexpr):
    """float32 in [-448, 448] -> OCP e4m3fn byte, round to nearest even."""
    if EXACT_CASTS:
        bits = v.to(tl.uint32, bitcast=True)
        sign = (bits >> 24) & 0x80
        magnitude = bits & 0x7FFFFFFF
        # Normal range (>= 2**-6): round the 23-bit mantissa to 3 bits; a carry steps the
        # exponent, as it should. Rebias 127 -> 7.
        rounded = magnitude + (0x7FFFF + ((magnitude >> 20) & 1))
        normal = (rounded >> 20) - (120 << 3)
        # Subnormal range: multiples of 2**-9, so round |v| * 512 to an integer (0..8;
        # 8 is the smallest normal, 0x08).
        sub = (tl.abs(v) * 512.0 + ROUND_MAGIC).to(tl.uint32, bitcast=True) - ROUND_MAGIC_BITS
        code = tl.where(magnitude >= 0x3C800000, normal, sub)
        byte = (code | sign).to(tl.uint8)
    else:
        byte = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return byte


# Four e4m3 bytes from four floats in one register (two paired conversions): with the
# codes packed as they are stored, the compiler has no byte to extract and re-pack.
_E4M3_X4_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b16 lo, hi;
cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;
cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;
mov.b32 $0, {lo, hi};
}
""")


@triton.jit
def floats_to_e4m3(v, EXACT_CASTS: tl.constexpr):
    """``float_to_e4m3`` of every element (uint8); natively four a conversion, so the last
    axis must hold a multiple of four elements a thread."""
    if EXACT_CASTS:
        byte = float_to_e4m3(v, EXACT_CASTS)
    else:
        byte = tl.inline_asm_elementwise(_E4M3_X4_PTX, "=r,r,r,r,r", [v], dtype=tl.uint8,
                                         is_pure=True, pack=4)
    return byte


@triton.jit
def e4m3_to_float(byte):
    """OCP e4m3fn byte -> float32 (exact; 0x7F/0xFF are NaN)."""
    b = byte.to(tl.int32)
    exponent = (b >> 3) & 0xF
    mantissa = b & 0x7
    # Subnormals are mantissa * 2**-9; normals (8 + mantissa) * 2**(exponent - 10).
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125,
                         (mantissa + 8).to(tl.float32) * pow2(exponent - 10))
    magnitude = tl.where((b & 0x7F) == 0x7F, float("nan"), magnitude)
    return tl.where(b >= 0x80, -magnitude, magnitude)


@triton.jit
def e2m1_code(x, EXACT_CASTS: tl.constexpr):
    """E2M1 code (sign << 3 | index into 0, .5, 1, 1.5, 2, 3, 4, 6) of a scaled value
    |x| <= 6 that is a bf16 value times a power of two; round to nearest, ties to the even
    code: the contract's thresholds.

    E2M1's step is 0.5 below 2, 1 in [2, 4) and 2 from 4 on: 2**(d - 1) with d = 0, 1, 2
    the binade of max(|x|, 1) above 1. Scaled by 2**-9 / step, |x| lands on e4m3's grid of
    multiples of 2**-9 (exact up to 16 * 2**-9), so the fp8 conversion rounds n = |x| / step
    to an integer, ties to even. Adding 8 + 2 d (times 2**-9) in the same fused
    multiply-add turns n into the fp8 code 8 + index: the offset is even, so ties stay
    even, and both the scale (2**(-8 - d)) and the offset are linear in the exponent bits
    of max(|x|, 1), which replaces a chain of range compares and selects by two integer
    multiply-adds. The sum is exact because x has at most 8 significant bits; a float32
    with more could round to a tie.
    """
    binade = tl.maximum(tl.abs(x), 1.0).to(tl.int32, bitcast=True) >> 23  # 127 + d
    scale = (0x7B000000 - binade * 0x800000).to(tl.float32, bitcast=True)  # 2**(-8 - d)
    offset = (0x2CA00000 + binade * 0x200000).to(tl.float32, bitcast=True)  # (8 + 2 d) 2**-9
    code = float_to_e4m3(tl.fma(tl.abs(x), scale, offset), EXACT_CASTS).to(tl.int32)
    # code is 8 + index (bit 3 always set): swap that bit for the sign.
    return (code ^ 0x8) | ((x.to(tl.int32, bitcast=True) >> 28) & 0x8)


# One E2M1 byte from two scaled values (x: low nibble, y: high nibble), the method of
# ``e2m1_code`` in PTX: the compiler would turn its multiply-adds by powers of two into
# mask/shift/add chains, and the e4m3x2 conversion leaves both codes in one register, so
# the nibbles are gathered with a shift and a mask instead of per-byte extracts.
_E2M1_PAIR_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 ax, ay, ex, ey, sx, sy, ox, oy, tx, ty, h, s;
.reg .b16 c;
abs.f32 ax, $1;
abs.f32 ay, $2;
max.f32 ex, ax, 0f3F800000;                 // max(|x|, 1)
max.f32 ey, ay, 0f3F800000;
shr.u32 ex, ex, 23;                         // its exponent field, 127 + d
shr.u32 ey, ey, 23;
mad.lo.s32 sx, ex, -8388608, 2063597568;    // 0x7B000000 - (127 + d) << 23: 2**(-8 - d)
mad.lo.s32 sy, ey, -8388608, 2063597568;
mad.lo.s32 ox, ex, 2097152, 748683264;      // 0x2CA00000 + (127 + d) << 21: (8 + 2 d) 2**-9
mad.lo.s32 oy, ey, 2097152, 748683264;
fma.rn.f32 tx, ax, sx, ox;
fma.rn.f32 ty, ay, sy, oy;
cvt.rn.satfinite.e4m3x2.f32 c, ty, tx;      // c = (8 + index y) << 8 | (8 + index x)
mov.b32 h, {c, c};
shr.u32 s, h, 4;
or.b32 h, h, s;
and.b32 h, h, 0x77;                         // index y << 4 | index x
shr.u32 s, $1, 28;
and.b32 s, s, 8;                            // sign of x -> bit 3
or.b32 h, h, s;
shr.u32 s, $2, 24;
and.b32 s, s, 128;                          // sign of y -> bit 7
or.b32 $0, h, s;
}
""")


def _e2m1_x4_ptx() -> str:
    """Four E2M1 bytes (x: low nibbles, y: high ones) in one register from eight unscaled
    values and their groups' 2**e, another way round than ``e2m1_code``: the value's
    binade picks the e4m3 binade it is rounded in, so that the conversion's own steps are
    E2M1's, and the scale is folded into the multiply-add.

    For v' = |v| / 2**e <= 6 in binade d (max(v', 1) in [2**d, 2**(d + 1)), d = 0, 1, 2),
    E2M1's step is 2**(d - 1), and 2**(d + 2) + v' lies in [2**(d + 2), 2**(d + 3)), where
    e4m3's step is 2**(d - 1) too. So t = v 2**-e + (+-2**(d + 2)), with the sign of v,
    converts (round to nearest even, as E2M1's thresholds) to the code
    s << 7 | (9 + d) << 3 | m, whose E2M1 index is m + 2 d: ((c >> 2) & 6) - 2 is 2 d
    (ties stay even: 2 d is). The addend is max(|v|, 2**e) with its mantissa cleared, the
    sign of v (xorsign) and its exponent moved by 2 - e; 2**-e is a normal float for every
    e in -126..126. The sum is exact in float32 but for bits far below the half-step of v'
    (it has 8 significant bits), so the single rounding decides. Operands: x0..x3,
    y0..y3, then per value 2**e as bits."""
    lines = [".reg .b32 a, f<4>, t<8>, xs, ys;"]
    for k in range(4):
        lines.append(f"sub.s32 f{k}, 0x7F000000, ${9 + k};")  # 2**-e
        for v, arg in (("x", 1 + k), ("y", 5 + k)):
            n = 2 * k + (v == "y")
            lines += [
                f"max.xorsign.abs.f32 a, ${arg}, ${9 + k};",  # +-max(|v|, 2**e): the sign of v
                "and.b32 a, a, 0xFF800000;",                  # +-2**(d + e)
                f"sub.s32 a, a, ${9 + k};",                   # +-2**(d + 2): the exponent
                "add.s32 a, a, 0x40800000;",                  # moved by 129 - (127 + e)
                f"fma.rn.f32 t{n}, ${arg}, f{k}, a;",
            ]
    lines += [".reg .b16 c<4>;"]
    lines += [f"cvt.rn.satfinite.e4m3x2.f32 c{k}, t{2 * k + 1}, t{2 * k};" for k in range(4)]
    lines += [
        "mov.b32 t0, {c0, c1};",                   # codes x0, y0, x1, y1
        "mov.b32 t1, {c2, c3};",
        "prmt.b32 xs, t0, t1, 0x6420;",            # x0 .. x3
        "prmt.b32 ys, t0, t1, 0x7531;",            # y0 .. y3
        # x: index (c & 7) + ((c >> 2) & 6) - 2 (no borrow: for |v| <= 6 * 2**e each byte's
        # sum is >= 2; a non-finite key's garbage stays within its own bytes), the
        # sign (bit 7) to bit 3
        "and.b32 t0, xs, 0x07070707;",
        "shr.b32 a, xs, 2;",
        "and.b32 a, a, 0x06060606;",
        "add.s32 t0, t0, a;",
        "sub.s32 t0, t0, 0x02020202;",
        "shr.b32 a, xs, 4;",
        "and.b32 a, a, 0x08080808;",
        "or.b32 t0, t0, a;",
        # y: the same index in bits 4..6, the sign where it is
        "shl.b32 t1, ys, 4;",
        "and.b32 t1, t1, 0x70707070;",
        "shl.b32 a, ys, 2;",
        "and.b32 a, a, 0x60606060;",
        "add.s32 t1, t1, a;",
        "sub.s32 t1, t1, 0x20202020;",
        "and.b32 a, ys, 0x80808080;",
        "or.b32 t1, t1, a;",
        "or.b32 $0, t0, t1;",
    ]
    return "{\n" + "\n".join(lines) + "\n}"


_E2M1_X4_PTX: tl.constexpr = tl.constexpr(_e2m1_x4_ptx())
_E2M1_X4_CONSTRAINTS: tl.constexpr = tl.constexpr("=r," + ",".join(["r"] * 12))


# From how many pairs a program's tensors (x.numel) encode four bytes a conversion
# (``e2m1_pairs_to_bytes``; its callers' tensors hold a multiple of four pairs a thread).
E2M1_X4_MIN_PAIRS: tl.constexpr = tl.constexpr(256)


@triton.jit
def e2m1_pairs_to_bytes(x, y, e, EXACT_CASTS: tl.constexpr):
    """The E2M1 bytes (uint8) of x / 2**e (low nibble) and y / 2**e (high nibble), for
    bf16-valued x, y with |x|, |y| <= 6 * 2**e and their groups' exponents e in -126..126
    (broadcast to them). Natively four bytes a conversion, the scale folded into it, where
    the tensors are large (for a few pairs a thread, a pair at a time after a multiply is
    the shorter chain)."""
    if EXACT_CASTS or x.numel < E2M1_X4_MIN_PAIRS:  # latency-bound launches: a pair at a time
        inv_scale = pow2(-e)
        byte = e2m1_pair(x * inv_scale, y * inv_scale, EXACT_CASTS).to(tl.uint8)
    else:
        scale_bits = tl.broadcast_to(pow2(e).to(tl.int32, bitcast=True), x.shape)  # of 2**e
        byte = tl.inline_asm_elementwise(
            _E2M1_X4_PTX, _E2M1_X4_CONSTRAINTS,
            [x.to(tl.int32, bitcast=True), y.to(tl.int32, bitcast=True), scale_bits],
            dtype=tl.uint8, is_pure=True, pack=4)
    return byte


@triton.jit
def e2m1_pair(x, y, EXACT_CASTS: tl.constexpr):
    """The E2M1 byte of two scaled values: ``e2m1_code(x) | e2m1_code(y) << 4`` (int32)."""
    if EXACT_CASTS:
        byte = e2m1_code(x, EXACT_CASTS) | (e2m1_code(y, EXACT_CASTS) << 4)
    else:
        byte = tl.inline_asm_elementwise(
            _E2M1_PAIR_PTX, "=r,r,r",
            [x.to(tl.int32, bitcast=True), y.to(tl.int32, bitcast=True)],
            dtype=tl.int32, is_pure=True, pack=1)
    return byte


@triton.jit
def e2m1_to_float(code):
    """E2M1 code (0..15) -> float32. Magnitudes 0, .5, 1, 1.5 are index / 2; then 2, 3, 4, 6."""
    index = code & 0x7
    low = index.to(tl.float32) * 0.5
    high = tl.where(index == 7, 6.0, tl.where(index == 6, 4.0, (index - 2).to(tl.float32)))
    magnitude = tl.where(index < 4, low, high)
    return tl.where(code >= 8, -magnitude, magnitude)


@triton.jit
def ue8m0_to_float(byte):
    """UE8M0 byte -> 2**(byte - 127) as float32 (0 is 2**-127, 255 is NaN)."""
    b = byte.to(tl.int32)
    value = tl.where(b == 0, 0x00400000, b << 23).to(tl.float32, bitcast=True)
    return tl.where(b == layout.UE8M0_NAN, float("nan"), value)

