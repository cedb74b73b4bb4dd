"""Readers: the exact inverse of every layout, in both backends."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import indexer_kcache as ik
from indexer_kcache import launcher, layout, reference

from .cases import DEVICE, make_case, pages, slots_by_blocks
from .test_store import FORMAT_LAYOUTS, FORMATS, LAYOUTS

BACKENDS = ["reference", "triton"]


def written_case(fmt, layout_name, num_tokens=40, block_size=64, num_blocks=2, seed=None):
    """A cache written by the store, plus the reference quantizer's bytes of every slot."""
    fp4, mx = FORMATS[fmt]
    shuffle, n = LAYOUTS[fmt][layout_name]
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    case = make_case(num_tokens, use_fp4_cache=fp4, block_size=block_size, num_blocks=num_blocks,
                     skip_every=0, compress_ratio=1, generator=gen)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache), n, mx_scales=mx, shuffle=shuffle)
    keys = reference.normalize_and_rope(case.k_pre[:num_tokens].float(),
                                        case.positions[:num_tokens].long(), case.cos_sin_cache,
                                        case.weight, case.eps)
    values, scales = reference.quantize_mxfp4(keys) if fp4 else reference.quantize_fp8(keys, mx)
    options = dict(shuffle=shuffle, mxfp4_n_per_tile=n)
    return case, cache, values, scales, options


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
def test_gather_returns_the_stored_bytes(fmt, layout_name, backend):
    case, cache, values, scales, options = written_case(fmt, layout_name)
    order = torch.randperm(case.slots.numel())
    order = torch.cat([order, order[:5]])  # any order, repeats allowed
    slots = case.slots[order.to(case.slots.device)]
    got_values, got_scales = ik.gather_indexer_k(cache, slots, case.use_fp4_cache, backend=backend,
                                                 **options)
    assert got_values.is_contiguous() and got_scales.is_contiguous()
    assert torch.equal(got_values, values[order.to(values.device)])
    assert torch.equal(got_scales, scales[order.to(scales.device)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
def test_dequantize_equals_decoded_reference(fmt, layout_name, backend):
    case, cache, values, scales, options = written_case(fmt, layout_name)
    mx = FORMATS[fmt][1]
    got = ik.dequantize_indexer_k(cache, case.slots, case.use_fp4_cache, mx_scales=mx,
                                  backend=backend, **options)
    want = reference.dequantize(values, scales, case.use_fp4_cache, mx)
    assert got.dtype == torch.float32 and got.shape == (case.slots.numel(), layout.HEAD_DIM)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gather_outputs_are_fresh_contiguous_tensors(fmt):
    """Every call, any row count (none, one, repeated counts: the plan keeps the outputs'
    shapes, not tensors), returns two new contiguous uint8 tensors of their own storage."""
    case, cache, values, scales, options = written_case(fmt, "row-major", num_tokens=40)
    fp4 = case.use_fp4_cache
    widths = (layout.value_bytes(fp4), layout.SCALE_BYTES)
    held = []  # every output stays alive, so no storage can be handed out twice
    for n in (0, 1, 7, 7, 40, 1):
        order = torch.randperm(case.slots.numel())[:n]
        got = ik.gather_indexer_k(cache, case.slots[order.to(case.slots.device)], fp4,
                                  backend="triton", **options)
        for tensor, width in zip(got, widths, strict=True):
            assert tensor.dtype == torch.uint8 and tensor.shape == (n, width)
            assert tensor.is_contiguous() and (n == 0 or tensor.stride() == (width, 1))
        assert torch.equal(got[0], values[order]) and torch.equal(got[1], scales[order])
        if n:
            held += got
    storages = [t.untyped_storage().data_ptr() for t in held]
    assert len(set(storages)) == len(storages)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_no_slots_give_empty_outputs(fmt, backend):
    case, cache, _, _, _ = written_case(fmt, "row-major", num_tokens=8)
    slots = case.slots[:0]
    fp4, mx = FORMATS[fmt]
    values, scales = ik.gather_indexer_k(cache, slots, fp4, backend=backend)
    assert values.shape == (0, layout.value_bytes(fp4)) and scales.shape == (0, 4)
    keys = ik.dequantize_indexer_k(cache, slots, fp4, mx_scales=mx, backend=backend)
    assert keys.shape == (0, layout.HEAD_DIM) and keys.dtype == torch.float32


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
def test_gather_by_blocks_follows_the_block_table(fmt, layout_name, backend, index_dtype):
    block_size, num_blocks = 64, 5
    case, cache, *_ , options = written_case(fmt, layout_name, num_tokens=300,
                                            block_size=block_size, num_blocks=num_blocks)
    lengths = [37, 0, 64, 190]
    table = torch.stack([torch.randperm(num_blocks)[:4] for _ in lengths]).to(index_dtype)
    cu = torch.tensor([0] + lengths).cumsum(0).to(index_dtype)
    got = ik.gather_indexer_k_by_blocks(cache, table.to(DEVICE), cu.to(DEVICE),
                                        case.use_fp4_cache, backend=backend, **options)
    slots = slots_by_blocks(table, lengths, block_size)
    want = ik.gather_indexer_k(cache, slots.to(DEVICE), case.use_fp4_cache, backend="reference",
                               **options)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_gather_by_blocks_with_more_chunks_than_the_grid_holds(fmt, monkeypatch):
    """A sequence of more than ``MAX_GRID_Y`` chunks (2M tokens on CUDA) is gathered by
    programs that take several chunks each: here the cap is lowered to 2 programs a
    sequence, for sequences of up to 3 chunks (BLOCK_R = 64 under the interpreter) or 6."""
    monkeypatch.setattr(launcher, "MAX_GRID_Y", 2)
    block_size, num_blocks = 64, 5
    case, cache, *_ , options = written_case(fmt, "row-major", num_tokens=300,
                                            block_size=block_size, num_blocks=num_blocks)
    lengths = [190, 37, 0, 100]
    table = torch.stack([torch.randperm(num_blocks)[:4] for _ in lengths]).to(DEVICE)
    cu = torch.tensor([0] + lengths).cumsum(0).to(DEVICE)
    got = ik.gather_indexer_k_by_blocks(cache, table, cu, case.use_fp4_cache, backend="triton",
                                        **options)
    want = ik.gather_indexer_k_by_blocks(cache, table, cu, case.use_fp4_cache,
                                         backend="reference", **options)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_gather_by_blocks_of_a_sequence_past_the_grid_limit():
    """2.2M tokens of one sequence: more than 65535 chunks of 32 (CUDA's limit on a grid's
    second dimension, which the launch once exceeded)."""
    fp4, block_size = True, 64
    num_tokens = 2_200_000
    num_blocks = -(-num_tokens // block_size)
    cache = ik.allocate_k_cache(num_blocks, block_size, fp4, device=DEVICE)
    cache.view(torch.uint8).copy_(torch.randint(0, 256, cache.shape, dtype=torch.uint8,
                                                device=DEVICE))
    table = torch.randperm(num_blocks, device=DEVICE)[None]
    cu = torch.tensor([0, num_tokens], device=DEVICE)
    got = ik.gather_indexer_k_by_blocks(cache, table, cu, fp4)
    slots = (table[0].long()[:, None] * block_size
             + torch.arange(block_size, device=DEVICE)).reshape(-1)[:num_tokens]
    want = ik.gather_indexer_k(cache, slots, fp4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_slots_raise_index_error(backend):
    case, cache, *_ = written_case("fp8", "row-major", num_tokens=8, block_size=16, num_blocks=1)
    for bad in (16, -1):
        slots = torch.tensor([0, 3, bad], device=DEVICE)
        with pytest.raises(IndexError, match=r"\[2\]"):
            ik.gather_indexer_k(cache, slots, False, backend=backend)
        with pytest.raises(IndexError):
            ik.dequantize_indexer_k(cache, slots, False, backend=backend)
    table = torch.tensor([[0, 5]], device=DEVICE)
    with pytest.raises(IndexError):
        ik.gather_indexer_k_by_blocks(cache, table, torch.tensor([0, 20], device=DEVICE), False,
                                      backend=backend)


@pytest.mark.parametrize("check_bounds", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("offsets", [[-16, 3, 5], [4, 6, 9], [0, 20, 10]],
                         ids=["negative-start", "late-start", "decreasing"])
def test_bad_sequence_offsets_raise(offsets, backend, check_bounds):
    """``cu_seq_lens`` must be non-decreasing from 0 (else its rows would fall outside the
    output): a ValueError naming it, whatever the bounds checking, on both backends."""
    case, cache, *_ = written_case("fp8", "row-major", num_tokens=40, block_size=16,
                                   num_blocks=3)
    table = torch.tensor([[0, 1], [1, 0]], device=DEVICE)
    kwargs = dict(backend=backend) | (dict(check_bounds=False) if not check_bounds else {})
    with pytest.raises(ValueError, match=re.escape("cu_seq_lens: expected non-decreasing")):
        ik.gather_indexer_k_by_blocks(cache, table, torch.tensor(offsets, device=DEVICE), False,
                                      **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_block_ids_are_out_of_range(backend):
    """A block id whose first slot would wrap around int64 into the cache is out of range:
    an IndexError when checked, zeros when not (never block 0's rows)."""
    case, cache, values, *_ = written_case("fp8", "row-major", num_tokens=8, block_size=16,
                                           num_blocks=2)
    table = torch.tensor([[2**60]], device=DEVICE)
    cu = torch.tensor([0, 3], device=DEVICE)
    with pytest.raises(IndexError):
        ik.gather_indexer_k_by_blocks(cache, table, cu, False, backend=backend)
    got, scales = ik.gather_indexer_k_by_blocks(cache, table, cu, False, backend=backend,
                                                check_bounds=False)
    assert (got == 0).all() and (scales == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_by_blocks_errors_name_the_table_entry_before_allocating(backend):
    """A bad block id is named as the table entry the sequence reads, the same on both
    backends; lengths far past the table raise before any row is allocated (no multi-GB
    output first); entries past a sequence's last block are never read, so never checked."""
    case, cache, *_ = written_case("fp8", "row-major", num_tokens=8, block_size=16, num_blocks=3)
    table = torch.tensor([[0, 1], [2, -1], [1, 7]], device=DEVICE)
    cu = torch.tensor([0, 20, 30, 50], device=DEVICE)
    with pytest.raises(IndexError, match=re.escape(
            "block_table[2, 1] = 7 is outside the cache's blocks [0, 3)")):
        ik.gather_indexer_k_by_blocks(cache, table, cu, False, backend=backend)
    ik.gather_indexer_k_by_blocks(cache, table[:2], cu[:3].contiguous(), False, backend=backend)
    huge = torch.tensor([0, 5, 2**31 - 1], device=DEVICE)
    with pytest.raises(IndexError, match=re.escape(
            f"block_table has 2 columns; sequence 1 of {2**31 - 6} tokens needs")):
        ik.gather_indexer_k_by_blocks(cache, table[:2], huge, False, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_out_of_range_rows_are_zero(backend):
    """Unchecked, a slot outside the cache reads as a row of zeros on both backends (and
    dequantizes to zeros); so do a sequence's tokens past its block table's columns."""
    case, cache, values, scales, _ = written_case("fp8", "row-major", num_tokens=8, block_size=16,
                                                  num_blocks=1)
    slots = torch.tensor([case.slots[0].item(), 16, -5, 10**9], device=DEVICE)
    got_values, got_scales = ik.gather_indexer_k(cache, slots, False, backend=backend,
                                                 check_bounds=False)
    assert torch.equal(got_values[0], values[0]) and (got_values[1:] == 0).all()
    assert (got_scales[1:] == 0).all()
    keys = ik.dequantize_indexer_k(cache, slots, False, backend=backend, check_bounds=False)
    assert (keys[1:] == 0).all() and torch.equal(
        keys[:1], ik.dequantize_indexer_k(cache, slots[:1], False, backend=backend))
    table = torch.tensor([[0]], device=DEVICE)  # one column: tokens 16 .. 19 are past it
    cu = torch.tensor([0, 20], device=DEVICE)
    rows, row_scales = ik.gather_indexer_k_by_blocks(cache, table, cu, False, backend=backend,
                                                     check_bounds=False)
    want_rows, _ = ik.gather_indexer_k(cache, torch.arange(16, device=DEVICE), False,
                                       backend=backend)
    assert torch.equal(rows[:16], want_rows) and (rows[16:] == 0).all()
    assert (row_scales[16:] == 0).all()
    with pytest.raises(IndexError, match="block_table"):
        ik.gather_indexer_k_by_blocks(cache, table, cu, False, backend=backend)


def test_reader_argument_errors():
    case, cache, *_ = written_case("fp8", "row-major", num_tokens=8, block_size=16, num_blocks=1)
    with pytest.raises(TypeError, match="slots"):
        ik.gather_indexer_k(cache, case.slots.float(), False)
    with pytest.raises(ValueError, match="k_cache.shape"):
        ik.gather_indexer_k(cache, case.slots, True)
    with pytest.raises(ValueError, match="cu_seq_lens"):
        ik.gather_indexer_k_by_blocks(cache, torch.zeros(2, 3, dtype=torch.int32, device=DEVICE),
                                      torch.zeros(2, dtype=torch.int32, device=DEVICE), False)
    with pytest.raises(TypeError, match="mx_scales"):
        ik.dequantize_indexer_k(cache, case.slots, False, mx_scales="yes")
    before = pages(cache).clone()
    ik.dequantize_indexer_k(cache, case.slots, False)
    assert torch.equal(pages(cache), before)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(fmt_layout=st.sampled_from([(f, n) for f in FORMATS for n in LAYOUTS[f]]),
       seed=st.integers(0, 2**31 - 1), num_tokens=st.integers(1, 60))
def test_random_store_then_read(fmt_layout, seed, num_tokens):
    fmt, layout_name = fmt_layout
    case, cache, values, scales, options = written_case(fmt, layout_name, num_tokens=num_tokens,
                                                        seed=seed)
    got = ik.gather_indexer_k(cache, case.slots, case.use_fp4_cache, backend="triton", **options)
    assert torch.equal(got[0], values) and torch.equal(got[1], scales)


@pytest.mark.parametrize("fmt", ["fp8", "fp8-mx", "mxfp4"])
def test_readers_reuse_their_kernels_for_any_row_count(fmt):
    """After the first call, the slot readers launch the compiled kernel directly; it must
    not carry anything over from the first call's row count."""
    case, cache, values, scales, options = written_case(fmt, "row-major")
    fp4, mx = FORMATS[fmt]
    for rows in (40, 37, 1, 16, 3, 40):
        order = torch.randperm(case.slots.numel())[:rows].to(case.slots.device)
        got_values, got_scales = ik.gather_indexer_k(cache, case.slots[order], fp4, **options)
        assert torch.equal(got_values, values[order.to(values.device)]), rows
        assert torch.equal(got_scales, scales[order.to(scales.device)]), rows
        got = ik.dequantize_indexer_k(cache, case.slots[order], fp4, mx_scales=mx, **options)
        want = reference.dequantize(values[order.to(values.device)],
                                    scales[order.to(scales.device)], fp4, mx)
        assert torch.equal(got, want), rows


def reader_bad_calls():
    """(id, exception, words, function of (cache, slots) -> kwargs of the call)."""
    return [
        ("slots-dtype", TypeError, "slots", lambda k, s: dict(slots=s.float())),
        ("slots-2d", ValueError, "slots", lambda k, s: dict(slots=s.view(1, -1))),
        ("slots-stride", ValueError, "slots.stride(0)",
         lambda k, s: dict(slots=torch.stack([s, s], 1).view(-1)[::2])),
        ("slots-device", ValueError, "device", lambda k, s: dict(slots=s.to("meta"))),
        ("cache-dtype", TypeError, "k_cache", lambda k, s: dict(k_cache=k.view(torch.int8))),
        ("cache-fp4", ValueError, "k_cache.shape[2]", lambda k, s: dict(use_fp4_cache=True)),
        ("cache-2d", ValueError, "k_cache", lambda k, s: dict(k_cache=k[0])),
        ("fp4-type", TypeError, "use_fp4_cache", lambda k, s: dict(use_fp4_cache=0)),
        ("backend", ValueError, "backend", lambda k, s: dict(backend="cuda")),
    ]


@pytest.mark.parametrize("reader", ["gather", "dequantize"])
@pytest.mark.parametrize("name, error, words, change", reader_bad_calls(),
                         ids=[b[0] for b in reader_bad_calls()])
def test_a_cached_reader_plan_never_lets_a_bad_call_through(reader, name, error, words, change):
    import re

    case, cache, *_ = written_case("fp8", "row-major", num_tokens=8, block_size=16,
                                   num_blocks=1)
    fn = ik.gather_indexer_k if reader == "gather" else ik.dequantize_indexer_k
    call = dict(k_cache=cache, slots=case.slots, use_fp4_cache=False)
    fn(**call)  # valid: its plan is kept
    with pytest.raises(error, match=re.escape(words)):
        fn(**(call | change(cache, case.slots)))
