"""Store parity: float32/float16 keys, aiter's MXFP4 page orders, the compacted ratio-2 path,
poisoned keys, and the format's constants. Kernel == reference == oracle, byte for byte."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import indexer_kcache as ik
from indexer_kcache import layout, reference

from . import oracle
from .cases import DEVICE, SENTINEL, make_case, pages, slots_by_blocks
from .test_store import FORMAT_LAYOUTS, FORMATS, LAYOUTS, assert_same_bytes, oracle_pages, run_store

INTERPRETED = ik.kernels.INTERPRETED
# NaN and infinite keys are the point of some tests: numpy (the interpreter) warns of them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def use_settings():
    """``use_settings(setting)``: launch the store with ``setting`` (block_t, warps, eager,
    registers, compact, ranges) until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda setting: stack.enter_context(
            ik.store.store_settings.override(ik.store.StoreSettings(*setting)))


# ------------------------------------------------------------------ float32 / float16 keys
def rounding_keys(rows: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """[rows, 128] keys of ``dtype`` whose bf16 rounding is not trivial, built from their
    bits: ties to even and to odd, ties that carry into the exponent, values just off a
    tie, subnormals, and a magnitude per row over the whole exponent range (a row of the
    largest ones overflows its sum of squares, a row of subnormals is normalised up)."""
    shape = (rows, layout.HEAD_DIM)
    sign = torch.randint(0, 2, shape, generator=g, dtype=torch.int64)
    if dtype == torch.float32:  # 8 exponent bits, 23 mantissa bits: bf16 keeps the top 7
        row_exponent = torch.randint(1, 247, (rows, 1), generator=g)
        row_exponent[0], row_exponent[1] = 0, 247  # subnormals; the largest binades
        exponent = (row_exponent + torch.randint(0, 8, shape, generator=g)).clamp(0, 254)
        exponent[0] = 0
        kept = torch.randint(0, 0x80, shape, generator=g)
        dropped = torch.tensor([0x8000, 0x7FFF, 0x8001, 0x0000, 0x4321, 0xFFFF])[
            torch.randint(0, 6, shape, generator=g)]
        kept[:, ::7], dropped[:, ::7] = 0x7F, 0x8000  # a tie above an odd mantissa: carries
        bits = (sign << 31) | (exponent << 23) | (kept << 16) | dropped
        return bits.to(torch.int32).view(torch.float32)
    # float16: 5 exponent bits, 10 mantissa bits: bf16 keeps the top 7
    row_exponent = torch.randint(1, 27, (rows, 1), generator=g)
    row_exponent[0] = 0
    exponent = (row_exponent + torch.randint(0, 4, shape, generator=g)).clamp(0, 30)
    exponent[0] = 0
    mantissa = torch.randint(0, 0x400, shape, generator=g)
    mantissa[:, ::5] = (mantissa[:, ::5] & ~0x7) | 0x4  # ties at bf16's precision
    bits = (sign << 15) | (exponent << 10) | mantissa
    return bits.to(torch.int16).view(torch.float16)


def float_key_case(dtype, fp4, compress_ratio, seed=0, num_tokens=29):
    g = torch.Generator().manual_seed(seed)
    case = make_case(num_tokens, use_fp4_cache=fp4, compress_ratio=compress_ratio, block_size=64,
                     num_blocks=2, generator=g)
    rows = case.k_pre.shape[0]
    wide = torch.full((rows, 192), float("nan"), dtype=dtype)  # strided rows, as in vLLM
    wide[:, :layout.HEAD_DIM] = rounding_keys(rows, dtype, g)
    skipped = case.k_pre[:, 0].isnan().cpu()  # rows the store must not read
    wide[skipped, :layout.HEAD_DIM] = float("nan")
    case.k_pre = wide.to(case.k_pre.device)[:, :layout.HEAD_DIM]
    return case


@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
def test_float_keys_write_the_bytes_of_their_bf16_rounding(fmt, layout_name, dtype, compress_ratio):
    fp4, mx = FORMATS[fmt]
    shuffle, n = LAYOUTS[fmt][layout_name]
    case = float_key_case(dtype, fp4, compress_ratio)
    options = dict(mx_scales=mx, shuffle=shuffle, n=n)
    got = run_store(case, "triton", **options)
    got_reference = run_store(case, "reference", **options)
    case.k_pre = case.k_pre.to(torch.bfloat16)
    want = run_store(case, "reference", **options)
    assert (pages(want) != SENTINEL).any()
    assert_same_bytes(got, want, f"triton, {dtype} keys vs the bf16 call")
    assert_same_bytes(got_reference, want, f"reference, {dtype} keys vs the bf16 call")


@pytest.mark.parametrize("setting", [(1, 1, True, 0, False, 1), (16, 2, True, 0, False, 1),
                                     (2, 1, False, 0, False, 1), (4, 1, False, 0, True, 2)],
                         ids=["eager", "eager-16x2", "pairs", "compact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_float_keys_through_every_load_path(dtype, setting, use_settings):
    use_settings(setting)
    case = float_key_case(dtype, True, 2, seed=1, num_tokens=13)
    got = run_store(case, "triton")
    case.k_pre = case.k_pre.to(torch.bfloat16)
    assert_same_bytes(got, run_store(case, "reference"), f"{dtype} keys vs the bf16 call")


def test_float_keys_match_the_oracle():
    for dtype in (torch.float32, torch.float16):
        case = float_key_case(dtype, False, 1, seed=2, num_tokens=10)
        assert_same_bytes(run_store(case, "triton"), oracle_pages(case), f"{dtype} vs oracle")


@pytest.mark.parametrize("fmt", FORMATS)
def test_subnormal_bf16_inputs_write_the_oracle_bytes(fmt):
    """bf16 keys, weights and cos/sin holding subnormals (tiny keys, whose amax sits at the
    floor) and the same call with float32 keys write the oracle's bytes."""
    use_fp4, mx = layout.FORMATS[fmt]
    case = make_case(12, use_fp4_cache=use_fp4, cos_sin_dtype=torch.bfloat16, skip_every=3)
    tiny = case.k_pre[:, :]
    tiny[1::2] = torch.where(torch.isnan(tiny[1::2]), tiny[1::2], tiny[1::2] * 1e-36)
    tiny[1::2, ::5] = 5e-39
    tiny[1::2, 1::7] = -9.2e-41
    case.weight[::3] = 3e-39
    case.cos_sin_cache[:, ::4] = 6e-39
    got = run_store(case, "triton", mx_scales=mx)
    assert_same_bytes(got, oracle_pages(case, mx_scales=mx), "subnormal bf16 inputs vs oracle")
    assert_same_bytes(got, run_store(case, "reference", mx_scales=mx), "vs reference")
    case.k_pre = case.k_pre.float()
    assert_same_bytes(run_store(case, "triton", mx_scales=mx), got, "float32 keys vs bf16")


def test_float_keys_pass_opcheck():
    case = float_key_case(torch.float32, True, 1, seed=3, num_tokens=8)
    torch.library.opcheck(torch.ops.indexer_kcache.indexer_k_norm_rope_store.default,
                          case.args(case.new_cache()))


# ------------------------------------------------------------ aiter's MXFP4 page orders
TILE_NS = [1, 2, 4, 8, 16, 32, 64]  # every divisor of the tests' block_size
D_CHUNKS = [1, 2, 4, 8, 16, 32, 64]  # every divisor of the 64 value bytes
SCALE_LANES = [1, 2, 4]  # every divisor of the 4 scales
ORDERS = [pytest.param(n, d, lanes, id=f"n{n}-d{d}-lanes{lanes}")
          for n in TILE_NS for d in D_CHUNKS for lanes in SCALE_LANES]
BLOCK = 64


@functools.cache
def run_orders(n: int, d_chunk: int, lanes: int) -> tuple[dict, dict]:
    """Where each (token in the run, byte) lands in a run of ``n`` tokens, by enumerating
    the run's storage order as the issue describes it: value bytes as [chunk of d_chunk
    bytes, token, byte in the chunk], scales as [scale % lanes, token, scale // lanes]."""
    values = [(t, chunk * d_chunk + b) for chunk in range(64 // d_chunk) for t in range(n)
              for b in range(d_chunk)]
    scales = [(t, low + lanes * high) for low in range(lanes) for t in range(n)
              for high in range(4 // lanes)]
    return ({tb: i for i, tb in enumerate(values)}, {ti: i for i, ti in enumerate(scales)})


def expected_offsets(p: int, block_size: int, n: int, d_chunk: int, lanes: int):
    """Offsets in a page of token ``p``'s 64 value bytes and 4 scale bytes."""
    value_at, scale_at = run_orders(n, d_chunk, lanes)
    run, t = divmod(p, n)
    values = [run * n * 64 + value_at[(t, d)] for d in range(64)]
    scales = [block_size * 64 + run * n * 4 + scale_at[(t, i)] for i in range(4)]
    return values, scales


@pytest.mark.parametrize("n, d_chunk, lanes", ORDERS)
def test_offsets_of_every_legal_order(n, d_chunk, lanes):
    """layout's offsets (as plain ints, and on tensors as the reference and the readers use
    them) against the enumerated order; each payload byte of a page is used once."""
    tile = (n, d_chunk, lanes)
    p = 37
    assert [layout.value_offset(p, d, BLOCK, 64, layout.MXFP4_PRESHUFFLE, *tile)
            for d in range(64)] == expected_offsets(p, BLOCK, *tile)[0]
    assert [layout.scale_offset(p, i, BLOCK, 64, layout.MXFP4_PRESHUFFLE, *tile)
            for i in range(4)] == expected_offsets(p, BLOCK, *tile)[1]
    want = torch.tensor([sum(expected_offsets(p, BLOCK, *tile), []) for p in range(BLOCK)])
    assert sorted(want.view(-1).tolist()) == list(range(BLOCK * layout.cache_row_bytes(True)))
    cache = torch.empty(3, BLOCK, layout.cache_row_bytes(True), dtype=torch.uint8)
    slots = torch.randperm(3 * BLOCK)
    values, scales = reference.token_byte_offsets(cache, slots, True, layout.MXFP4_PRESHUFFLE, *tile)
    page = ((slots // BLOCK) * cache.stride(0))[:, None]
    assert torch.equal(torch.cat([values, scales], 1), page + want[slots % BLOCK])


def test_the_default_order_is_vllms():
    """scale_lanes None: 64 // n_per_tile, the formula the README gives for vLLM's order."""
    for n in layout.MXFP4_TILE_CHOICES:
        s_lo = 64 // n
        for p in range(BLOCK):
            values, scales = expected_offsets(p, BLOCK, n, 16, s_lo)
            g, lane = divmod(p, n)
            assert values == [g * n * 64 + (d // 16) * n * 16 + lane * 16 + d % 16 for d in range(64)]
            assert scales == [BLOCK * 64 + g * n * 4 + (i % s_lo) * n * (4 // s_lo)
                              + lane * (4 // s_lo) + i // s_lo for i in range(4)]


@pytest.mark.parametrize("n, d_chunk, lanes", ORDERS)
def test_every_legal_order_round_trips(n, d_chunk, lanes, use_settings):
    """The kernel puts each byte where the enumerated order says (reference quantizer's
    bytes, sentinel everywhere else, the oracle agreeing), and the readers, given the same
    order, return the stored bytes and keys."""
    use_settings((8, 1, False, 0, False, 1))  # one small program
    case = make_case(8, use_fp4_cache=True, block_size=BLOCK, num_blocks=2, skip_every=0,
                     compress_ratio=1, generator=torch.Generator().manual_seed(n * 100 + d_chunk))
    order = dict(mxfp4_n_per_tile=n, mxfp4_d_per_tile=d_chunk, mxfp4_scale_lanes=lanes)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache), n, shuffle=True, backend="triton",
                                 mxfp4_d_per_tile=d_chunk, mxfp4_scale_lanes=lanes)

    keys = reference.normalize_and_rope(case.k_pre[:8].float(), case.positions[:8].long(),
                                        case.cos_sin_cache, case.weight, case.eps)
    values, scales = reference.quantize_mxfp4(keys)
    want = pages(case.new_cache()).cpu().numpy()
    for row, slot in enumerate(case.slots.tolist()):
        value_at, scale_at = expected_offsets(slot % BLOCK, BLOCK, n, d_chunk, lanes)
        want[slot // BLOCK, value_at] = values[row].cpu().numpy()
        want[slot // BLOCK, scale_at] = scales[row].cpu().numpy()
    assert_same_bytes(cache, want, "triton vs the enumerated order")
    flat = np.full(case.num_blocks * case.page_bytes, SENTINEL, dtype=np.uint8)
    oracle.store(flat, case.page_bytes, BLOCK, case.k_pre.float().cpu().numpy(),
                 case.positions.cpu().numpy(), case.cos_sin_cache.float().cpu().numpy(),
                 case.weight.float().cpu().numpy(), case.eps, case.slots.cpu().numpy(), 1, True,
                 shuffle=True, n=n, d_chunk=d_chunk, lanes=lanes)
    assert_same_bytes(want, flat.reshape(want.shape), "the enumerated order vs the oracle")

    for backend in ("triton", "reference"):
        got_values, got_scales = ik.gather_indexer_k(cache, case.slots, True, shuffle=True,
                                                     backend=backend, **order)
        assert torch.equal(got_values, values) and torch.equal(got_scales, scales), backend
    got = ik.dequantize_indexer_k(cache, case.slots, True, shuffle=True, **order)
    assert torch.equal(got, reference.dequantize(values, scales, True, False))


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_an_aiter_order_read_by_blocks(backend):
    n, d_chunk, lanes = 32, 8, 4
    case = make_case(100, use_fp4_cache=True, block_size=BLOCK, num_blocks=3, skip_every=0,
                     compress_ratio=1)
    cache = case.new_cache()
    order = dict(mxfp4_n_per_tile=n, mxfp4_d_per_tile=d_chunk, mxfp4_scale_lanes=lanes)
    ik.indexer_k_norm_rope_store(*case.args(cache), n, shuffle=True, mxfp4_d_per_tile=d_chunk,
                                 mxfp4_scale_lanes=lanes)
    table = torch.tensor([[2, 0], [1, 2]], device=DEVICE)
    cu = torch.tensor([0, 70, 120], device=DEVICE)
    got = ik.gather_indexer_k_by_blocks(cache, table, cu, True, shuffle=True, backend=backend,
                                        **order)
    slots = slots_by_blocks(table, [70, 50], BLOCK)
    want = ik.gather_indexer_k(cache, slots.to(DEVICE), True, shuffle=True, backend="reference",
                               **order)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_an_aiter_order_through_the_ops():
    """The options are in the ops' schemas (opcheck: schema, fake implementation, eager)."""
    case = make_case(12, use_fp4_cache=True, block_size=BLOCK, num_blocks=2, skip_every=0,
                     compress_ratio=1)
    cache = case.new_cache()
    order = dict(mxfp4_d_per_tile=4, mxfp4_scale_lanes=1)
    ops = torch.ops.indexer_kcache
    torch.library.opcheck(ops.indexer_k_norm_rope_store.default, (*case.args(cache), 32),
                          dict(shuffle=True, **order))
    order["mxfp4_n_per_tile"] = 32
    torch.library.opcheck(ops.gather_indexer_k.default, (cache, case.slots, True),
                          dict(shuffle=True, **order))
    torch.library.opcheck(ops.dequantize_indexer_k.default, (cache, case.slots, True),
                          dict(shuffle=True, **order))


def illegal_orders():
    """(id, block_size, n, d_chunk, lanes, error, words the message must contain)."""
    return [
        ("n-not-dividing", 64, 48, 16, None, ValueError,
         "mxfp4_n_per_tile: expected a positive divisor of block_size = 64, got 48"),
        ("n-negative", 64, -16, 16, None, ValueError, "mxfp4_n_per_tile"),
        ("d-not-dividing", 64, 16, 3, None, ValueError,
         "mxfp4_d_per_tile: expected a divisor of 64"),
        ("d-zero", 64, 16, 0, None, ValueError, "mxfp4_d_per_tile"),
        ("d-too-big", 64, 16, 128, None, ValueError, "got 128"),
        ("lanes-not-dividing", 64, 16, 16, 3, ValueError,
         "mxfp4_scale_lanes: expected a divisor of 4 (with mxfp4_n_per_tile = 16), got 3"),
        ("lanes-8-n-8", 64, 8, 16, 8, ValueError,
         "mxfp4_scale_lanes: expected a divisor of 4 (with mxfp4_n_per_tile = 8), got 8"),
        ("lanes-zero", 64, 16, 16, 0, ValueError, "mxfp4_scale_lanes"),
        ("default-lanes-of-n-8", 64, 8, 16, None, ValueError,
         "(with mxfp4_n_per_tile = 8), got None, whose default 64 // mxfp4_n_per_tile = 8"),
        ("default-lanes-of-n-128", 128, 128, 16, None, ValueError,
         "got None, whose default 64 // mxfp4_n_per_tile = 0"),
        ("d-type", 64, 16, 16.0, None, TypeError, "mxfp4_d_per_tile: expected an int"),
        ("lanes-type", 64, 16, 16, "2", TypeError, "mxfp4_scale_lanes: expected an int or None"),
        ("lanes-bool", 64, 16, 16, True, TypeError, "mxfp4_scale_lanes"),
    ]


@pytest.mark.parametrize("name, block_size, n, d_chunk, lanes, error, words", illegal_orders(),
                         ids=[o[0] for o in illegal_orders()])
def test_an_illegal_order_is_an_error_naming_both_numbers(name, block_size, n, d_chunk, lanes,
                                                           error, words):
    case = make_case(8, use_fp4_cache=True, block_size=block_size, num_blocks=2, skip_every=0)
    cache = case.new_cache()
    before = pages(cache).clone()
    order = dict(mxfp4_d_per_tile=d_chunk, mxfp4_scale_lanes=lanes)
    with pytest.raises(error) as info:
        ik.indexer_k_norm_rope_store(*case.args(cache), n, shuffle=True, **order)
    assert words in str(info.value)
    assert torch.equal(pages(cache), before)
    readers = [lambda **kw: ik.gather_indexer_k(cache, case.slots, True, **kw),
               lambda **kw: ik.dequantize_indexer_k(cache, case.slots, True, **kw)]
    if not isinstance(lanes, bool):  # through the op's schema, which takes True for 1
        readers.append(lambda **kw: ik.gather_indexer_k_by_blocks(
            cache, torch.zeros(1, 1, dtype=torch.int64, device=DEVICE),
            torch.tensor([0, 1], device=DEVICE), True, **kw))
    for read in readers:
        with pytest.raises(error, match=re.escape(words)):
            read(shuffle=True, mxfp4_n_per_tile=n, **order)


@pytest.mark.parametrize("change, words", [
    (dict(mxfp4_d_per_tile=3), "mxfp4_d_per_tile: expected a divisor of 64"),
    (dict(mxfp4_scale_lanes=3), "mxfp4_scale_lanes: expected a divisor of 4"),
    (dict(mxfp4_n_per_tile=-2), "mxfp4_n_per_tile: expected >= 0"),
], ids=["d3", "lanes3", "n-negative"])
@pytest.mark.parametrize("fp4", [True, False], ids=["mxfp4", "fp8"])
def test_values_of_no_order_are_errors_in_every_layout(fp4, change, words):
    """A value no aiter order has (a chunk not dividing 64, lanes not dividing 4, a negative
    run) is a ValueError in the row-major layout too, before any byte changes."""
    case = make_case(8, use_fp4_cache=fp4, block_size=16, num_blocks=2)
    cache = case.new_cache()
    before = pages(cache).clone()
    options = dict(mxfp4_n_per_tile=0, shuffle=False) | change
    n = options.pop("mxfp4_n_per_tile")
    with pytest.raises(ValueError, match=re.escape(words)):
        ik.indexer_k_norm_rope_store(*case.args(cache), n, **options)
    assert torch.equal(pages(cache), before)
    with pytest.raises(ValueError, match=re.escape(words)):
        ik.gather_indexer_k(cache, case.slots.clamp_min(0), fp4, mxfp4_n_per_tile=n, **options)


def test_the_order_options_are_ignored_by_the_other_layouts():
    case = make_case(8, use_fp4_cache=True, block_size=16, num_blocks=2)
    want = run_store(case, "reference")
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache), 8, shuffle=False, mxfp4_d_per_tile=4,
                                 mxfp4_scale_lanes=2)
    assert_same_bytes(cache, want, "row-major with order options")


# ------------------------------------------------------------ ratio 2: compacted tokens
COMPACT_SETTINGS = [(4, 1, False, 0, True, 1), (4, 1, False, 0, True, 3),
                    (16, 2, False, 96, True, 4)]


def position_patterns(num_tokens: int, g: torch.Generator) -> dict:
    return {
        "consecutive-even": torch.arange(num_tokens) + 10,
        "consecutive-odd": torch.arange(num_tokens) + 11,
        "all-odd": 2 * torch.arange(num_tokens) + 1,  # every token writes: second batches
        "random": torch.randint(0, 200, (num_tokens,), generator=g),
    }


@pytest.mark.parametrize("setting", COMPACT_SETTINGS,
                         ids=lambda s: f"{s[0]}x{s[1]}-ranges{s[5]}" + f"-{s[3]}regs" * bool(s[3]))
@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_compacted_ratio_2_writes_what_the_reference_writes(fmt, setting, use_settings):
    """Consecutive positions from either parity (one writer per pair), all-odd positions
    (every token writes: more writers than lanes in a range), random ones, a long run of
    skipped slots (ranges with nothing to write), odd token counts (a partial last range)."""
    use_settings(setting)
    fp4, mx = FORMATS[fmt]
    g = torch.Generator().manual_seed(setting[0] * 10 + setting[5])
    for num_tokens in (37,):
        case = make_case(num_tokens, use_fp4_cache=fp4, compress_ratio=2, block_size=16,
                         num_blocks=-(-2 * num_tokens // 16) + 1, skip_every=0, generator=g)
        for name, positions in position_patterns(num_tokens, g).items():
            case.positions[:num_tokens] = positions.to(case.positions)
            case.k_pre[:num_tokens] = torch.randn(num_tokens, layout.HEAD_DIM, generator=g).to(
                case.k_pre)
            skip = ((case.positions[:num_tokens] + 1) % 2 != 0).cpu()
            case.k_pre[:num_tokens][skip.to(case.k_pre.device)] = float("nan")
            want = run_store(case, "reference", mx_scales=mx)
            assert_same_bytes(run_store(case, "triton", mx_scales=mx), want, f"{num_tokens} {name}")
        case.slots[: num_tokens // 2 + 1] = -1  # a long run of skipped tokens
        want = run_store(case, "reference", mx_scales=mx)
        assert_same_bytes(run_store(case, "triton", mx_scales=mx), want, "skipped run")


def test_compacted_ratio_1(use_settings):
    use_settings((4, 1, False, 0, True, 2))
    case = make_case(21, use_fp4_cache=True, compress_ratio=1, block_size=16, num_blocks=3)
    assert_same_bytes(run_store(case, "triton"), run_store(case, "reference"), "compact cr1")


# ------------------------------------------------------------------------- poisoned keys
NAN, INF = float("nan"), float("inf")
POISONS = [NAN, INF, -INF]


def poisoned_case(fp4, seed=0, k_dtype=torch.bfloat16):
    """24 written tokens with distinct positions: rows 0-2 have a NaN, +Inf or -Inf in their
    key, rows 3-5 in their cos/sin row, row 6 is a key of huge finite values (its sum of
    squares overflows: it normalises to zeros, a finite key), row 7 a NaN whose payload
    fills the mantissa (the float32 keys' case). The rest are clean."""
    g = torch.Generator().manual_seed(seed)
    case = make_case(24, use_fp4_cache=fp4, block_size=64, num_blocks=2, skip_every=0,
                     compress_ratio=1, generator=g)
    case.positions[:24] = torch.randperm(case.cos_sin_cache.shape[0], generator=g)[:24].to(
        case.positions)
    k = case.k_pre.to(k_dtype) if k_dtype != torch.bfloat16 else case.k_pre.clone()
    for row, value in enumerate(POISONS):
        k[row, int(torch.randint(0, layout.HEAD_DIM, (1,), generator=g))] = value
    for row, value in enumerate(POISONS, start=3):
        pos = int(case.positions[row])
        col = int(torch.randint(0, layout.ROPE_DIM, (1,), generator=g))
        case.cos_sin_cache = case.cos_sin_cache.clone()
        case.cos_sin_cache[pos, col] = value
    k[6] = 3.0e38
    if k_dtype == torch.float32:
        k[7, 5] = torch.tensor(0x7FFFFFFF, dtype=torch.int32).view(torch.float32)
    else:
        k[7, 5] = NAN
    case.k_pre = k
    return case


POISONED_ROWS = [0, 1, 2, 3, 4, 5, 7]


def assert_poisoned(cache, case, fmt, shuffle, n):
    fp4, mx = FORMATS[fmt]
    values, scales = ik.gather_indexer_k(cache, case.slots, fp4, shuffle=shuffle,
                                         mxfp4_n_per_tile=n, backend="reference")
    poisoned = torch.zeros(case.slots.numel(), dtype=torch.bool)
    poisoned[POISONED_ROWS] = True
    poisoned = poisoned.to(values.device)
    assert (values[poisoned] == 0).all()
    if fp4 or mx:
        assert (scales[poisoned] == layout.UE8M0_NAN).all()
    else:
        bits = scales[poisoned].contiguous().view(torch.int32)
        assert (bits == layout.FP32_NAN_BITS).all()
    keys = ik.dequantize_indexer_k(cache, case.slots, fp4, mx_scales=mx, shuffle=shuffle,
                                   mxfp4_n_per_tile=n)
    assert keys[poisoned].isnan().all()
    assert keys[~poisoned].isfinite().all()
    assert (keys[6] == 0).all()  # the overflowing key: zeros, a finite scale


@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
def test_poisoned_keys_beside_clean_ones(fmt, layout_name):
    fp4, mx = FORMATS[fmt]
    shuffle, n = LAYOUTS[fmt][layout_name]
    options = dict(mx_scales=mx, shuffle=shuffle, n=n)
    case = poisoned_case(fp4)
    got = run_store(case, "triton", **options)
    want = run_store(case, "reference", **options)
    assert_same_bytes(got, want, "triton vs reference")
    assert_same_bytes(want, oracle_pages(case, **options), "reference vs oracle")
    assert_poisoned(want, case, fmt, shuffle, n)
    # Every other byte is what the same call writes without the poisoned tokens.
    clean = make_case(24, use_fp4_cache=fp4, block_size=64, num_blocks=2)
    for name in ("k_pre", "positions", "cos_sin_cache", "weight", "eps"):
        setattr(clean, name, getattr(case, name))
    clean.slots = case.slots.clone()
    clean.slots[POISONED_ROWS] = -1
    without = run_store(clean, "reference", **options)
    poisoned_bytes = torch.zeros_like(pages(want), dtype=torch.bool)
    value_at, scale_at = reference.token_byte_offsets(
        want, case.slots[POISONED_ROWS], fp4, layout.choose_layout(fp4, shuffle, 64), n)
    flat = poisoned_bytes.view(-1)  # pages of this cache are its flat bytes
    flat[value_at.reshape(-1)] = True
    flat[scale_at.reshape(-1)] = True
    assert ((pages(want) == pages(without)) | poisoned_bytes).all(), "another byte changed"


@pytest.mark.parametrize("setting", [(1, 1, True, 0, False, 1), (16, 2, True, 0, False, 1),
                                     (2, 1, False, 0, False, 1), (4, 1, False, 0, True, 2)],
                         ids=["eager", "eager-16x2", "pairs", "compact"])
@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
def test_poisoned_keys_through_every_load_path(compress_ratio, setting, use_settings):
    use_settings(setting)
    case = poisoned_case(True, seed=4)
    case.compress_ratio = compress_ratio
    if compress_ratio == 2:
        case.positions[:24] = case.positions[:24] | 1  # odd: every token writes
    assert_same_bytes(run_store(case, "triton"), run_store(case, "reference"), "poisoned")


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_poisoned_float32_keys(fmt):
    """A NaN whose payload fills the mantissa: rounding it to bf16 with integer arithmetic
    would carry into the sign and give -0.0."""
    fp4, mx = FORMATS[fmt]
    case = poisoned_case(fp4, seed=5, k_dtype=torch.float32)
    got = run_store(case, "triton", mx_scales=mx)
    want = run_store(case, "reference", mx_scales=mx)
    assert_same_bytes(got, want, "triton vs reference")
    assert_same_bytes(want, oracle_pages(case, mx_scales=mx), "reference vs oracle")
    assert_poisoned(want, case, fmt, False, 0)


# ------------------------------------------------------------------------------ constants
@triton.jit
def _constants_kernel(out_ptr):
    tl.store(out_ptr + 0, layout.HEAD_DIM)
    tl.store(out_ptr + 1, layout.ROPE_DIM)
    tl.store(out_ptr + 2, layout.MXFP4_PRESHUFFLE)
    tl.store(out_ptr + 3, layout.value_offset_tl(37, 21, 64, layout.MXFP4_VALUE_BYTES,
                                                 layout.MXFP4_PRESHUFFLE, 16, 8, 2))
    tl.store(out_ptr + 4, layout.scale_offset_tl(37, 3, 64, layout.MXFP4_VALUE_BYTES,
                                                 layout.MXFP4_PRESHUFFLE, 16, 8, 2))
    tl.store(out_ptr + 5, layout.value_offset_tl(37, 21, 64, layout.FP8_VALUE_BYTES,
                                                 layout.FP8_TILED, 0, 0, 0))


def test_constants_are_defined_once_and_read_the_same_everywhere():
    assert reference.FP8_MAX is layout.FP8_MAX and reference.MXFP4_MAX is layout.MXFP4_MAX
    assert reference.FP8_AMAX_FLOOR is layout.FP8_AMAX_FLOOR
    assert reference.MXFP4_AMAX_FLOOR is layout.MXFP4_AMAX_FLOOR
    assert reference.ROPE_DIM is layout.ROPE_DIM
    assert ik.cache_row_bytes(False) == layout.FP8_VALUE_BYTES + layout.SCALE_BYTES
    out = torch.zeros(6, dtype=torch.int32, device=DEVICE)
    _constants_kernel[(1,)](out)
    assert out.tolist() == [
        layout.HEAD_DIM, layout.ROPE_DIM, layout.MXFP4_PRESHUFFLE,
        layout.value_offset(37, 21, 64, 64, layout.MXFP4_PRESHUFFLE, 16, 8, 2),
        layout.scale_offset(37, 3, 64, 64, layout.MXFP4_PRESHUFFLE, 16, 8, 2),
        layout.value_offset(37, 21, 64, 128, layout.FP8_TILED, 0, 0, 0)]
    for name in ("FP8_MAX", "FP8_AMAX_FLOOR", "MXFP4_MAX", "MXFP4_AMAX_FLOOR", "ROPE_DIM"):
        for module in (ik.kernels.numerics, ik.store):
            assert name not in vars(module), f"{module.__name__} defines {name} again"


# The store kernel's argument types, as the offline compile scripts below declare them.
_STORE_SIGNATURE = """
store = dict(k_pre_ptr="*bf16", k_pre_row_stride="i32", positions_ptr="*i64",
             cos_sin_ptr="*fp32", cos_sin_row_stride="i32", max_pos="i32", weight_ptr="*bf16",
             eps="fp32", cache_ptr="*u8", page_stride="i32", num_slots="i32", slot_ptr="*i64",
             num_tokens="i32")
"""

_COMPILE_SCRIPT = _STORE_SIGNATURE + textwrap.dedent("""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from indexer_kcache import layout
    from indexer_kcache.kernels import gather_indexer_k_kernel, indexer_k_store_kernel

    SM90, SM100, GFX942 = GPUTarget("cuda", 90, 32), GPUTarget("cuda", 100, 32), GPUTarget(
        "hip", "gfx942", 64)
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

    def cubin(kernel):
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(kernel.asm["cubin"])
        return f.name

    def compile_(kernel, signature, constexprs, target, **options):
        sig = dict(signature, **{name: "constexpr" for name in constexprs})
        src = ASTSource(fn=kernel, signature=sig, constexprs={
            (kernel.arg_names.index(name),): value for name, value in constexprs.items()})
        if target.backend == "cuda":
            options.update(enable_fp_fusion=False, launch_pdl=bool(constexprs.get("USE_PDL")))
        return triton.compile(src, target=target, options=options)

    base = dict(COMPRESS_RATIO=2, USE_FP4=True, MX_SCALES=False, LAYOUT=0, N_PER_TILE=0,
                D_PER_TILE=0, SCALE_LANES=0, BLOCK_SIZE=64, BLOCK_T=16, EAGER_LOADS=False,
                COMPACT=False, RANGES=1, EXACT_CASTS=False, USE_PDL=True,
                HINT_AHEAD=0, GROUP_SCALES=False)
    aiter = dict(LAYOUT=layout.MXFP4_PRESHUFFLE, N_PER_TILE=16, D_PER_TILE=8, SCALE_LANES=2)
    variants = [  # (target, constexprs, argument types, options)
        (SM90, {}, {}, dict(num_warps=2, maxnreg=96)),  # the pairs path
        (SM90, {"HINT_AHEAD": 1320}, {}, dict(num_warps=2, maxnreg=96)),  # with L2 hints
        (SM90, {"COMPACT": True, "RANGES": 2}, {}, dict(num_warps=2)),
        (SM90, {"COMPRESS_RATIO": 1, "EAGER_LOADS": True, "BLOCK_T": 1, "USE_FP4": False}, {},
         dict(num_warps=1)),
        (SM90, dict(aiter, EXACT_CASTS=True), {"k_pre_ptr": "*fp32"}, dict(num_warps=2)),
        (SM90, {"USE_FP4": False, "MX_SCALES": True, "LAYOUT": layout.FP8_TILED},
         {"k_pre_ptr": "*fp16"}, dict(num_warps=2)),
        (SM100, {"COMPRESS_RATIO": 1, "EAGER_LOADS": True, "BLOCK_T": 32, "USE_FP4": False,
                 "MX_SCALES": True}, {}, dict(num_warps=4)),
        (GFX942, dict(aiter, COMPACT=True, RANGES=2, EXACT_CASTS=True, USE_PDL=False), {},
         dict(num_warps=4)),
    ]
    for target, constexprs, types, options in variants:
        compile_(indexer_k_store_kernel, dict(store, **types), dict(base, **constexprs), target,
                 **options)
    gather = dict(cache_ptr="*u8", page_stride="i32", num_slots="i32", slot_ptr="*i64",
                  num_rows="i32", block_table_ptr="*i64", block_table_row_stride="i32",
                  block_table_cols="i32", cu_seq_lens_ptr="*i64", values_ptr="*u8",
                  scales_ptr="*u8", dequant_ptr="*fp32")
    for target, by_blocks in ((SM90, False), (SM100, False), (GFX942, False), (SM90, True)):
        compile_(gather_indexer_k_kernel, gather,
                 dict(USE_FP4=True, MX_SCALES=False, LAYOUT=layout.MXFP4_PRESHUFFLE, N_PER_TILE=32,
                      D_PER_TILE=4, SCALE_LANES=1, BLOCK_SIZE=64, BY_BLOCKS=by_blocks,
                      DEQUANTIZE=not by_blocks, BLOCK_R=32), target, num_warps=4)
    # The scorer (MXFP4 keys, e4m3 queries, the stacked form, launched dependently, its
    # first pages hinted into L2 before the wait) and a top-k kernel launched dependently:
    # their PDL waits and options compile.
    from indexer_kcache.kernels.logits import paged_mqa_logits_kernel
    from indexer_kcache.kernels.topk import topk_rank_kernel

    pointers = dict(q_ptr="*u8", qs_ptr="*i32", w_ptr="*fp32", cache_ptr="*u8", ctx_ptr="*i32",
                    table_ptr="*i32", out_ptr="*fp32", fold_ptr="*u8")
    constexprs = dict(NEXT_N=1, ROWS=1, CTX_2D=False, Q_FORM=1, W_BF16=False, USE_FP4=True,
                      MX_SCALES=False, LAYOUT=0, N_PER_TILE=0, D_PER_TILE=0, SCALE_LANES=0,
                      BLOCK_SIZE=64, HP=64, BLOCK_N=64, NUM_STAGES=6, CLEAN=True, NATIVE=True,
                      SCALE_WORDS=True, VARIANT=1, WARPS=4, HAS_BLOCKS=True, USE_PDL=2,
                      RELU_BY_ABS=True, HINT_TILES=4, PREFOLDED=False, PROGRAM_FOLD=False)
    scalars = {name: "i32" for name in paged_mqa_logits_kernel.arg_names
               if name not in pointers and name not in constexprs}
    compile_(paged_mqa_logits_kernel, dict(pointers, **scalars), constexprs, SM90, num_warps=4,
             num_stages=6, maxnreg=96)
    compile_(paged_mqa_logits_kernel, dict(pointers, **scalars),
             dict(constexprs, HINT_TILES=0, PROGRAM_FOLD=True), SM90, num_warps=4, num_stages=6,
             maxnreg=96)
    # MXFP4 queries folded ahead by their own kernel (sm_90 and sm_100).
    from indexer_kcache.kernels.logits import fold_queries_kernel

    for target in (SM90, SM100):
        compile_(paged_mqa_logits_kernel, dict(pointers, **scalars),
                 dict(constexprs, Q_FORM=3, HINT_TILES=0, PREFOLDED=True, PROGRAM_FOLD=True),
                 target, num_warps=4,
                 num_stages=6, maxnreg=128)
        compile_(fold_queries_kernel, dict(q_ptr="*u8", q_sb="i32", q_si="i32", q_sh="i32",
                                           qs_ptr="*i32", qs_sb="i32", qs_si="i32",
                                           fold_ptr="*u8", heads="i32"),
                 dict(NEXT_N=1, ROWS=1, Q_FORM=3, USE_FP4=True, HP=64, USE_PDL=1), target,
                 num_warps=4)
    # FP8 keys, four rows of per-row context lengths, two tiles hinted (sm_90 and sm_100:
    # the settings hint wherever they launch dependently).
    for target in (SM90, SM100):
        compile_(paged_mqa_logits_kernel, dict(pointers, **scalars),
                 dict(constexprs, NEXT_N=4, ROWS=4, CTX_2D=True, USE_FP4=False,
                      RELU_BY_ABS=False, HINT_TILES=2), target, num_warps=4, num_stages=6)
    # bf16 queries (their keys decoded to bf16 operands, FP8 and MXFP4 keys) on sm_89, the
    # oldest GPU the native dots are for: its PTX lacks some sm_90 instructions.
    SM89 = GPUTarget("cuda", 89, 32)
    for use_fp4 in (False, True):
        compile_(paged_mqa_logits_kernel, dict(pointers, **scalars, q_ptr="*i16"),
                 dict(constexprs, Q_FORM=0, USE_FP4=use_fp4, RELU_BY_ABS=False, HINT_TILES=0,
                      USE_PDL=0), SM89, num_warps=4, num_stages=6)
    # e4m3 queries with MX scales, not folded ahead (FP8-MX and MXFP4 keys): the stacked
    # form whose rows the e4m3 fold cannot take are scored again with a bf16 operand or by
    # group (``_rescan_rows``), under the one-row register cap the settings take, on every
    # NVIDIA GPU the native dots are for.
    from indexer_kcache.logits import FALLBACK_REGISTERS

    for target in (SM89, SM100, GPUTarget("cuda", 120, 32)):
        for use_fp4 in (False, True):
            compile_(paged_mqa_logits_kernel, dict(pointers, **scalars),
                     dict(constexprs, Q_FORM=2, USE_FP4=use_fp4, MX_SCALES=not use_fp4,
                          RELU_BY_ABS=use_fp4, HINT_TILES=0, USE_PDL=0,
                          PROGRAM_FOLD=use_fp4), target, num_warps=4, num_stages=6,
                     maxnreg=FALLBACK_REGISTERS)
    # Several rows of them a program (four with FP8-MX keys, two with MXFP4 keys): their
    # rows scored again side by side in one bf16 dot (sm_90).
    for use_fp4, rows in ((False, 4), (True, 2)):
        compile_(paged_mqa_logits_kernel, dict(pointers, **scalars),
                 dict(constexprs, NEXT_N=rows, ROWS=rows, Q_FORM=2, USE_FP4=use_fp4,
                      MX_SCALES=not use_fp4, RELU_BY_ABS=use_fp4, HINT_TILES=0,
                      PROGRAM_FOLD=use_fp4), SM90, num_warps=4, num_stages=6)
    # The top-k's kernels on every target: the candidates placed by the count and place
    # kernels (the filter tracking each row's largest key), or by the select kernel.
    from indexer_kcache.kernels.topk import (WARP_APPEND_ELEMENTS, topk_count_kernel,
                                             topk_filter_kernel, topk_place_kernel,
                                             topk_sample_kernel, topk_select_kernel)

    # NVIDIA sm_80 (A100) too: no native e4m3 conversions (integer ones), no dependent
    # launch, the scorer's float32 dots; what the settings choose there.
    SM80 = GPUTarget("cuda", 80, 32)
    rows = dict(logits_ptr="*fp32", row_stride="i32", cols="i32", lengths_ptr="*i32")
    targets = ((SM90, 2), (SM100, 2), (GFX942, 0), (SM80, 0))
    for target, pdl in targets:
        common = dict(IS_BF16=False, HAS_LENGTHS=True, USE_PDL=pdl)
        for shared_sample in (False, True) if target.backend == "cuda" else (False,):
            compile_(topk_sample_kernel, dict(rows, k="i32", sample_stride="i32",
                                              threshold_ptr="*i32", cand_count_ptr="*i32",
                                              counts_ptr="*i32"),
                     dict(common, CHUNK=32, SAMPLE_BLOCK=1024, BITS=16, DIGIT_BITS=1,
                          ZERO_BUCKETS=4096, SHARED_SAMPLE=shared_sample), target, num_warps=4)
        filter_signature = dict(rows, split_cols="i32", threshold_ptr="*i32", cand_ptr="*i64",
                                cand_count_ptr="*i32", capacity="i32")
        compile_(topk_filter_kernel, filter_signature,
                 dict(common, BLOCK=1024, WARP_APPEND=False, TRACK_MAX=True), target,
                 num_warps=4)
        if target.backend == "cuda":  # each warp appending its own candidates (inline PTX)
            kernel = compile_(topk_filter_kernel, filter_signature,
                              dict(common, BLOCK=1024, WARP_APPEND=True, TRACK_MAX=True), target,
                              num_warps=4)
            # One copy of the statement in the step loop: a copy Triton made for a second
            # layout would add to the row's counter again.
            ballots = kernel.asm["ptx"].count("vote.sync.ballot")
            if ballots != WARP_APPEND_ELEMENTS:
                raise AssertionError(f"{target}: {ballots} ballots in the warp-append filter")
    for target, pdl in targets:
        candidates = dict(cand_ptr="*i64", cand_count_ptr="*i32", capacity="i32")
        placed = dict(scratch_ptr="*i64", counts_ptr="*i32", meta_ptr="*i64", out_ptr="*i32",
                      out_row_stride="i32")
        # On NVIDIA, counting in shared memory (inline PTX): one statement a thread, whose
        # pairs (4096 over 8 or 16 warps: 16 or 8 a thread) are as many atomic adds.
        nvidia = target.backend == "cuda"
        # (8 warps where launches are short, 16 elsewhere: Triton's own shared memory grows
        # with the warps.)
        for shared, warps in ((False, 8), (True, 8), (True, 16)) if nvidia else ((False, 8),):
            kernel = compile_(topk_select_kernel,
                              dict(rows, k="i32", low_skip="i32", **candidates, **placed),
                              dict(IS_BF16=False, HAS_LENGTHS=True, FROM_CANDIDATES=True,
                                   BLOCK=4096, STREAM_BLOCK=4096, RADIX_BITS=8,
                                   SHARED_SLOTS=shared, USE_PDL=pdl), target, num_warps=warps)
            ptx = kernel.asm["ptx"] if shared else ""
            if shared and (ptx.count(".b8 topk_shared[") != 1
                           or ptx.count("@p atom.shared.add.u32") != 4096 // (32 * warps)):
                raise AssertionError(f"{target}: the shared-memory statement was copied")
            if shared:  # its static shared array and Triton's own within 48 KiB a block
                usage = subprocess.run([os.path.join(bin_dir, "cuobjdump"),
                                        "--dump-resource-usage", cubin(kernel)],
                                       capture_output=True, text=True, check=True).stdout
                static = int(re.search(r"SHARED:([0-9]+)", usage).group(1))
                if static + kernel.metadata.shared > 48 * 1024:
                    raise AssertionError(f"{target} at {warps} warps: {static} + "
                                         f"{kernel.metadata.shared} bytes")
        compile_(topk_count_kernel, dict(rows, k="i32", low_skip="i32", threshold_ptr="*i32",
                                         **candidates, cand_slot_ptr="*i32", counts_ptr="*i32",
                                         meta_ptr="*i64"),
                 dict(IS_BF16=False, HAS_LENGTHS=True, BLOCK=4096, PART=512, RADIX_BITS=8,
                      USE_PDL=pdl), target, num_warps=4)
        compile_(topk_place_kernel, dict(cols="i32", lengths_ptr="*i32", k="i32", **candidates,
                                         cand_slot_ptr="*i32", **placed),
                 dict(HAS_LENGTHS=True, BLOCK=4096, PART=512, USE_PDL=pdl), target,
                 num_warps=4)
        compile_(topk_rank_kernel, dict(scratch_ptr="*i64", counts_ptr="*i32", meta_ptr="*i64",
                                        out_ptr="*i32", out_row_stride="i32"),
                 dict(BLOCK=4096, CHUNK=128, WIDTH=4, USE_PDL=min(pdl, 1)), target, num_warps=4)
    for store_constexprs, types in (({"COMPRESS_RATIO": 1, "USE_FP4": False}, {}),
                                    ({}, {"k_pre_ptr": "*fp32"})):
        compile_(indexer_k_store_kernel, dict(store, **types),
                 dict(base, **store_constexprs, EXACT_CASTS=True, USE_PDL=False), SM80,
                 num_warps=2)
    compile_(gather_indexer_k_kernel, gather,
             dict(USE_FP4=True, MX_SCALES=False, LAYOUT=0, N_PER_TILE=0, D_PER_TILE=0,
                  SCALE_LANES=0, BLOCK_SIZE=64, BY_BLOCKS=False, DEQUANTIZE=True, BLOCK_R=32),
             SM80, num_warps=4)
    portable = dict(constexprs, NATIVE=False, VARIANT=0, BLOCK_N=32, NUM_STAGES=2, USE_PDL=0,
                    RELU_BY_ABS=False, HINT_TILES=0)
    # (AMD gfx942 takes the same float32 dots: no native FP8 dots there.)
    for target in (SM80, GFX942):
        for use_fp4, q_form in ((False, 1), (True, 0)):
            compile_(paged_mqa_logits_kernel,
                     dict(pointers, **scalars, **({"q_ptr": "*i16"} if q_form == 0 else {})),
                     dict(portable, USE_FP4=use_fp4, Q_FORM=q_form), target, num_warps=4,
                     num_stages=2)
    # Two more GPUs users own, each in the forms the settings take there: NVIDIA sm_120
    # (consumer Blackwell: the native dots as mma.sync, no wgmma) and AMD gfx950 (MI355X).
    SM120, GFX950 = GPUTarget("cuda", 120, 32), GPUTarget("hip", "gfx950", 64)
    for use_fp4 in (False, True):
        compile_(paged_mqa_logits_kernel, dict(pointers, **scalars),
                 dict(constexprs, USE_FP4=use_fp4, RELU_BY_ABS=use_fp4, HINT_TILES=0,
                      PROGRAM_FOLD=use_fp4), SM120, num_warps=4, num_stages=6)
    compile_(paged_mqa_logits_kernel, dict(pointers, **scalars), dict(portable, USE_FP4=True),
             GFX950, num_warps=4, num_stages=2)
    compile_(indexer_k_store_kernel, store, dict(base, **aiter, EXACT_CASTS=True, USE_PDL=False),
             GFX950, num_warps=2)
    for target, shared in ((SM120, True), (GFX950, False)):
        compile_(topk_select_kernel, dict(rows, k="i32", low_skip="i32", **candidates, **placed),
                 dict(IS_BF16=False, HAS_LENGTHS=True, FROM_CANDIDATES=True, BLOCK=4096,
                      STREAM_BLOCK=4096, RADIX_BITS=8, SHARED_SLOTS=shared, USE_PDL=0),
                 target, num_warps=16)
    print("compiled")
""")


_ONE_WARP_SCRIPT = _STORE_SIGNATURE + textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from indexer_kcache.kernels import indexer_k_store_kernel

    # As a launch specializes them: aligned pointers, strides that are multiples of 16.
    aligned = [name for name in store if name.endswith(("_ptr", "_stride"))]
    attrs = {(indexer_k_store_kernel.arg_names.index(name),): [["tt.divisibility", 16]]
             for name in aligned}
    base = dict(MX_SCALES=False, LAYOUT=0, N_PER_TILE=0, D_PER_TILE=0, SCALE_LANES=0,
                BLOCK_SIZE=64, BLOCK_T=16, COMPACT=False, RANGES=1, EXACT_CASTS=False,
                USE_PDL=True, GROUP_SCALES=False)
    settings = {  # launch settings of 256K tokens, and of 8K to 64K (store.store_settings)
        "fp8 ratio 1": (dict(COMPRESS_RATIO=1, USE_FP4=False, EAGER_LOADS=True, HINT_AHEAD=0),
                        2, 0),
        "fp8 ratio 2": (dict(COMPRESS_RATIO=2, USE_FP4=False, EAGER_LOADS=False,
                             HINT_AHEAD=660), 2, 96),
        "mxfp4 ratio 2": (dict(COMPRESS_RATIO=2, USE_FP4=True, EAGER_LOADS=False,
                               HINT_AHEAD=660), 2, 96),
        "mxfp4 ratio 1, 32 tokens over 4 warps": (
            dict(COMPRESS_RATIO=1, USE_FP4=True, EAGER_LOADS=True, HINT_AHEAD=0, BLOCK_T=32),
            4, 0),
    }
    for name, (constexprs, warps, maxnreg) in settings.items():
        constexprs = dict(base, **constexprs)
        sig = dict(store, **{k: "constexpr" for k in constexprs})
        src = ASTSource(fn=indexer_k_store_kernel, signature=sig, constexprs={
            (indexer_k_store_kernel.arg_names.index(k),): v for k, v in constexprs.items()},
            attrs=attrs)
        options = dict(num_warps=warps, enable_fp_fusion=True, launch_pdl=True)
        if maxnreg:
            options["maxnreg"] = maxnreg
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        print(name, "barriers", kernel.asm["sass"].count("BAR.SYNC"))
    print("compiled")
""")


@pytest.mark.skipif(not INTERPRETED, reason="the GPU tests run the compiled kernels themselves")
def test_store_compile_for_sm90_keeps_each_token_in_one_warp():
    """The store's bandwidth-bound programs (16 tokens or token pairs over two warps, 32
    tokens over four) reduce each key within one warp: compiled for sm_90 by this Triton,
    without a GPU, their code has no barrier (a reduction across warps goes through shared
    memory, and costs Triton 3.9 builds 9 to 20 % of the store's time at 256K tokens on an
    H200: BENCHMARKS.md, "Triton versions"). Which axes the lanes take is Triton's choice,
    made differently from 3.7 on (``kernels.store.REVERSED_ROWS``)."""
    if not os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                      "bin")):
        pytest.skip("this Triton has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _ONE_WARP_SCRIPT], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
    counts = dict(line.rsplit(" barriers ", 1) for line in result.stdout.splitlines()
                  if " barriers " in line)
    assert len(counts) == 4 and all(n == "0" for n in counts.values()), counts


@pytest.mark.skipif(not INTERPRETED, reason="the GPU tests run the compiled kernels themselves")
def test_kernels_compile_for_sm80_sm90_sm100_and_gfx942_without_a_gpu():
    """The interpreter runs kernels as Python: it does not check what only the compiler
    does (globals a kernel may read, types, layouts, register allocation). Compile the store
    (its load paths, float keys, an aiter order) and a reader to machine code for NVIDIA
    sm_90 and sm_100 and AMD gfx942 with the tools Triton ships, in a process without
    TRITON_INTERPRET; the scorer's native dots (and its query fold) for sm_90 and sm_100
    (bf16 queries for sm_89; e4m3 queries with MX scales, scored again where their fold
    fails, for sm_89, sm_100 and sm_120, several rows a program for sm_90), its float32
    dots for sm_80 and gfx942; all six top-k kernels
    for sm_80, sm_90, sm_100 and gfx942 (on NVIDIA the select kernel's counting and the
    sample's digit counts in shared memory too); the store and a reader for sm_80 too
    (integer conversions, no dependent launch); the scorer and the select kernel for NVIDIA
    sm_120 and AMD gfx950, with the store for the latter. Nothing runs."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not os.path.isdir(ptxas):
        pytest.skip("this Triton has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
