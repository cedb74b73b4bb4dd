"""The kernels' exact conversions, element-wise, against torch's (correct) ones."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from indexer_kcache import layout, reference
from indexer_kcache.kernels import numerics

from .cases import DEVICE, every_bf16_up_to_6, scaled_e2m1_pairs, unscaled_e2m1_keys


@triton.jit
def _apply(x_ptr, out_ptr, n, OP: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    if OP == 0:
        y = numerics.round_to_bf16(x, EXACT)
    elif OP == 1:
        y = numerics.float_to_e4m3(x, EXACT)
    elif OP == 2:
        y = numerics.e4m3_to_float(x)
    elif OP == 3:
        y = numerics.e2m1_code(x, EXACT)
    elif OP == 6:
        y = numerics.ceil_log2_of_ratio(tl.maximum(x, layout.FP8_AMAX_FLOOR), layout.FP8_MAX)
    elif OP == 7:
        y = numerics.ceil_log2_of_ratio(tl.maximum(x, layout.MXFP4_AMAX_FLOOR), layout.MXFP4_MAX)
    elif OP == 8:
        y = numerics.floats_to_e4m3(x, EXACT)
    else:
        y = numerics.e2m1_to_float(x)
    tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def _apply_pair(x_ptr, out_ptr, n, OP: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr):
    """Two-input helpers: x = x_ptr[:n], y = x_ptr[n:]; outputs likewise."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    y = tl.load(x_ptr + n + offs, mask=mask, other=0)
    if OP == 0:
        x, y = numerics.round_to_bf16_pair(x, y, EXACT)
        tl.store(out_ptr + n + offs, y, mask=mask)
    else:
        x = numerics.e2m1_pair(x, y, EXACT)
    tl.store(out_ptr + offs, x, mask=mask)


@triton.jit
def _apply_scaled_pairs(x_ptr, y_ptr, e_ptr, out_ptr, n, EXACT: tl.constexpr,
                        BLOCK: tl.constexpr):
    """The store's E2M1 bytes of x / 2**e, y / 2**e from unscaled x, y and their e."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    y = tl.load(y_ptr + offs, mask=mask, other=0)
    e = tl.load(e_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, numerics.e2m1_pairs_to_bytes(x, y, e, EXACT), mask=mask)


def apply_pair(op: int, x: torch.Tensor, y: torch.Tensor, out_dtype: torch.dtype,
               exact: bool) -> torch.Tensor:
    xy = torch.cat([x, y]).to(DEVICE)
    out = torch.empty(xy.shape, dtype=out_dtype, device=DEVICE)
    block = 1024
    _apply_pair[(triton.cdiv(x.numel(), block),)](xy, out, x.numel(), OP=op, EXACT=exact,
                                                  BLOCK=block)
    return out.cpu() if op == 0 else out[:x.numel()].cpu()


def apply(op: int, x: torch.Tensor, out_dtype: torch.dtype, exact: bool = True) -> torch.Tensor:
    x = x.to(DEVICE)
    out = torch.empty(x.shape, dtype=out_dtype, device=DEVICE)
    block = 1024
    _apply[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), OP=op, EXACT=exact, BLOCK=block)
    return out.cpu()


def exact_modes():
    # The native conversions exist only on GPUs with fp8 support; the interpreter's are wrong.
    if DEVICE == "cuda" and torch.cuda.get_device_capability() >= (8, 9):
        return [True, False]
    return [True]


def random_floats(n: int, lo_exp: int, hi_exp: int) -> torch.Tensor:
    mantissa = torch.rand(n) + 1
    exponent = torch.randint(lo_exp, hi_exp, (n,)).float()
    sign = torch.where(torch.rand(n) < 0.5, -1.0, 1.0)
    return sign * mantissa * torch.exp2(exponent)


@pytest.mark.parametrize("exact", exact_modes(), ids=lambda e: "portable" if e else "native")
def test_bf16_rounding_ties_and_random(exact):
    bits = torch.randint(0, 2**31 - 2**24, (4096,), dtype=torch.int64).to(torch.int32)
    ties = (bits & ~0xFFFF) | 0x8000
    x = torch.cat([bits.view(torch.float32), ties.view(torch.float32), -ties.view(torch.float32)])
    assert torch.equal(apply(0, x, torch.float32, exact), x.to(torch.bfloat16).float())


@pytest.mark.parametrize("exact", exact_modes(), ids=lambda e: "portable" if e else "native")
def test_bf16_rounding_in_pairs(exact):
    """The paired rounding (one ``cvt.rn.bf16x2.f32`` natively) rounds each of its two
    inputs as the single one does."""
    bits = torch.randint(0, 2**31 - 2**24, (8192,), dtype=torch.int64).to(torch.int32)
    ties = (bits & ~0xFFFF) | 0x8000
    x = torch.cat([bits.view(torch.float32), -ties.view(torch.float32)])
    y = torch.cat([ties.view(torch.float32), -bits.view(torch.float32)])
    out = apply_pair(0, x, y, torch.float32, exact)
    assert torch.equal(out, torch.cat([x, y]).to(torch.bfloat16).float())


@pytest.mark.parametrize("op", [1, 8], ids=["one", "four-a-conversion"])
@pytest.mark.parametrize("exact", exact_modes(), ids=lambda e: "portable" if e else "native")
def test_e4m3_encoding_is_round_to_nearest_even(exact, op):
    grid = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite() & (grid.abs() <= 448)]
    midpoints = (grid.sort().values[1:] + grid.sort().values[:-1]) / 2  # exact ties
    x = torch.cat([grid, midpoints, random_floats(8192, -12, 9).clamp(-448, 448),
                   torch.tensor([136.0, 7.9375, 31.5, 2.0**-10, 3 * 2.0**-11, 1e-30, -0.0])])
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    got = apply(op, x, torch.uint8, exact)
    zero = want & 0x7F == 0
    assert torch.equal(got[~zero], want[~zero])
    assert (got[zero] & 0x7F == 0).all()


def test_e4m3_decoding_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = codes.view(torch.float8_e4m3fn).float()
    got = apply(2, codes, torch.float32)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("exact", exact_modes(), ids=lambda e: "portable" if e else "native")
def test_e2m1_encoding_of_every_bf16_up_to_6(exact):
    """What the store encodes: bf16 values times a power of two, |x| <= 6. Every bf16 value
    in [-6, 6] (each threshold, tie and neighbour among them), and scaled ones down to the
    float32 subnormals, against the reference's threshold chain."""
    x = every_bf16_up_to_6()
    big = x[x.abs() >= 1]
    x = torch.cat([x, big * torch.exp2(-torch.randint(0, 150, (big.numel(),)).float()),
                   torch.tensor([2.0**-149, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])])
    x = torch.cat([x, -x])
    assert torch.equal(apply(3, x, torch.int32, exact), reference.e2m1_codes(x))


@pytest.mark.parametrize("exact", exact_modes(), ids=lambda e: "portable" if e else "native")
def test_e2m1_pair_encoding_of_every_bf16_up_to_6(exact):
    """The byte of two scaled codes, a pair at a time (inline PTX natively: the exponent
    arithmetic, the paired e4m3 conversion and the nibble gathering) over every bf16 value
    in [-6, 6], each paired with a shuffled one, and scaled values down to the float32
    subnormals."""
    x, y = scaled_e2m1_pairs()
    want = reference.e2m1_codes(x) | (reference.e2m1_codes(y) << 4)
    assert torch.equal(apply_pair(1, x, y, torch.int32, exact), want)


@pytest.mark.parametrize("block", [128, 1024], ids=["a-pair-at-a-time", "four-pairs-a-conversion"])
@pytest.mark.parametrize("exact", exact_modes(), ids=lambda e: "portable" if e else "native")
def test_e2m1_bytes_of_unscaled_keys(exact, block):
    """What the store hands the encode (``cases.unscaled_e2m1_keys``): bf16 keys x, y and
    their group's exponent e, with |x|, |y| <= 6 * 2**e (natively, from 256 pairs a
    program, four bytes a conversion with the scale folded in)."""
    x, y, e, want = unscaled_e2m1_keys(torch.Generator().manual_seed(5))
    out = torch.empty(x.numel(), dtype=torch.uint8, device=DEVICE)
    _apply_scaled_pairs[(triton.cdiv(x.numel(), block),)](
        x.to(DEVICE), y.to(DEVICE), e.to(DEVICE), out, x.numel(), EXACT=exact, BLOCK=block)
    assert torch.equal(out.cpu(), want)


def test_e2m1_decoding_every_code():
    want = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    assert torch.equal(apply(5, torch.arange(16, dtype=torch.int32), torch.float32), want)


def test_reference_ceil_log2_from_bits():
    x = torch.cat([torch.exp2(torch.arange(-126.0, 127.0)), random_floats(4096, -126, 127).abs()])
    assert torch.equal(reference.ceil_log2(x), torch.ceil(torch.log2(x.double())).int())


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "mxfp4"])
def test_scale_exponent_without_division_on_every_bf16_amax(fp8):
    """The kernel's division-free exponent equals ceil(log2(fl(amax / limit))) for every
    amax that can occur: each positive finite bf16 value, and the floors."""
    bits = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16)
    amax = bits.view(torch.bfloat16).float()
    limit = layout.FP8_MAX if fp8 else layout.MXFP4_MAX
    floor = layout.FP8_AMAX_FLOOR if fp8 else layout.MXFP4_AMAX_FLOOR
    amax = torch.cat([amax, torch.tensor([floor])]).clamp_min(floor)
    want = reference.ceil_log2((amax.double() / limit).float())
    got = apply(6 if fp8 else 7, amax, torch.int32)
    assert torch.equal(got, want)
