"""torch.library integration: opcheck, torch.compile(fullgraph=True), CUDA graphs, streams."""

from __future__ import annotations

import pytest
import torch

import indexer_kcache as ik
from indexer_kcache import readers

from .cases import make_case, pages
from .test_store import FORMATS

OP = torch.ops.indexer_kcache.indexer_k_norm_rope_store.default


def test_schema_starts_with_the_nine_positional_arguments():
    names = [a.name for a in OP._schema.arguments]
    assert names[:9] == ["k_pre", "positions", "cos_sin_cache", "rms_norm_weight", "rms_norm_eps",
                         "k_cache", "kv_slot_mapping", "compress_ratio", "use_fp4_cache"]
    assert all(a.default_value is not None or a.kwarg_only or a.name == "mxfp4_n_per_tile"
               or a.type.kind() == "OptionalType" for a in OP._schema.arguments[9:])
    assert [a.name for a in OP._schema.arguments if a.alias_info and a.alias_info.is_write] == [
        "k_cache"]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_opcheck_store(fmt):
    fp4, mx = FORMATS[fmt]
    case = make_case(12, use_fp4_cache=fp4, block_size=16, num_blocks=2, skip_every=0)
    cache = case.new_cache()
    torch.library.opcheck(OP, case.args(cache), {"mx_scales": mx})


def test_opcheck_readers():
    case = make_case(12, block_size=16, num_blocks=2, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache))
    ops = torch.ops.indexer_kcache
    torch.library.opcheck(ops.gather_indexer_k.default, (cache, case.slots, False))
    torch.library.opcheck(ops.dequantize_indexer_k.default, (cache, case.slots, False))


@pytest.mark.parametrize("backend", [None, "reference"])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_compile_fullgraph_writes_the_same_bytes(fmt, backend):
    fp4, mx = FORMATS[fmt]
    case = make_case(20, use_fp4_cache=fp4, block_size=16, num_blocks=3)

    def step(k_pre, positions, cos_sin, weight, cache, slots):
        ik.indexer_k_norm_rope_store(k_pre, positions, cos_sin, weight, 1e-6, cache, slots,
                                     case.compress_ratio, fp4, mx_scales=mx, backend=backend)
        return cache

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    eager_cache, compiled_cache = case.new_cache(), case.new_cache()
    step(case.k_pre, case.positions, case.cos_sin_cache, case.weight, eager_cache, case.slots)
    compiled(case.k_pre, case.positions, case.cos_sin_cache, case.weight, compiled_cache,
             case.slots)
    assert torch.equal(pages(compiled_cache), pages(eager_cache))


def test_compile_readers_fullgraph():
    """Traced before any eager reader call of the process (the stand-in pointer for a
    mode's unused arguments, made during the trace, must not be kept for real calls)."""
    case = make_case(20, block_size=16, num_blocks=3, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache))

    def read(cache, slots):
        return ik.dequantize_indexer_k(cache, slots, False), ik.gather_indexer_k(cache, slots,
                                                                                  False)

    torch._dynamo.reset()
    readers._unused_kept.cache_clear()
    for op in (ik.dequantize_indexer_k.op, ik.gather_indexer_k.op):
        op.plans.clear()
    got = torch.compile(read, fullgraph=True)(cache, case.slots)
    want = read(cache, case.slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1][0], want[1][0])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_cuda_graph_replay_sees_new_inputs(fmt):
    fp4, mx = FORMATS[fmt]
    case = make_case(64, use_fp4_cache=fp4, block_size=64, num_blocks=4, device="cuda")
    graph_cache = case.new_cache()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compiles) outside the capture
        ik.indexer_k_norm_rope_store(*case.args(graph_cache), mx_scales=mx)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ik.indexer_k_norm_rope_store(*case.args(graph_cache), mx_scales=mx)
    for _ in range(3):
        fresh = make_case(64, use_fp4_cache=fp4, block_size=64, num_blocks=4, device="cuda")
        case.k_pre.copy_(fresh.k_pre)
        case.positions.copy_(fresh.positions)
        case.slots.copy_(fresh.slots)
        graph_cache.copy_(fresh.new_cache())
        pages(graph_cache).copy_(pages(fresh.new_cache()))
        graph.replay()
        eager_cache = case.new_cache()
        ik.indexer_k_norm_rope_store(*case.args(eager_cache), mx_scales=mx)
        torch.cuda.synchronize()
        assert torch.equal(pages(graph_cache), pages(eager_cache))


@pytest.mark.gpu
def test_runs_on_the_current_stream():
    case = make_case(256, block_size=64, num_blocks=8, device="cuda")
    cache = case.new_cache()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # keep the stream busy: a launch elsewhere would race
        ik.indexer_k_norm_rope_store(*case.args(cache))
    stream.synchronize()
    want = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(want), backend="reference")
    assert torch.equal(pages(cache), pages(want))


@pytest.mark.multi_gpu
def test_tensors_on_the_second_gpu():
    torch.cuda.set_device(0)
    case = make_case(100, block_size=64, num_blocks=4, device="cuda:1")
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache))
    want = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(want), backend="reference")
    assert torch.equal(pages(cache), pages(want))
    again = case.new_cache()  # the cached plan and compiled kernel now, from device 0
    ik.indexer_k_norm_rope_store(*case.args(again))
    assert torch.equal(pages(again), pages(want))
    on_0 = make_case(100, block_size=64, num_blocks=4, device="cuda:0")  # same layout
    cache_0, want_0 = on_0.new_cache(), on_0.new_cache()
    ik.indexer_k_norm_rope_store(*on_0.args(cache_0))
    ik.indexer_k_norm_rope_store(*on_0.args(want_0), backend="reference")
    assert torch.equal(pages(cache_0), pages(want_0))
    got = ik.dequantize_indexer_k(cache, case.slots[case.slots >= 0], False)
    assert got.device == torch.device("cuda:1")
    again = ik.dequantize_indexer_k(cache, case.slots[case.slots >= 0], False)  # direct launch
    assert torch.equal(again, got)
    with pytest.raises(ValueError, match="device"):
        ik.indexer_k_norm_rope_store(*case.args(cache)[:6], case.slots.to("cuda:0"), 1, False)


def test_device_mismatch_is_an_error():
    case = make_case(8)
    cache = case.new_cache()
    with pytest.raises(ValueError, match="rms_norm_weight.device"):
        ik.indexer_k_norm_rope_store(*case.args(cache)[:3], case.weight.to("meta"),
                                     *case.args(cache)[4:])


# ------------------------------------------------------------- the scorer and the top-k
def _scoring_inputs():
    """A small FP8 cache written by the store, e4m3 queries and ragged lengths."""
    case = make_case(48, block_size=16, num_blocks=3, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache))
    device = cache.device
    q = (torch.randn(2, 1, 4, 128, device=device) * 3).to(torch.float8_e4m3fn)
    weights = torch.randn(2, 4, device=device)
    context_lens = torch.tensor([40, 13], dtype=torch.int32, device=device)
    block_table = torch.tensor([[2, 0, 1], [1, 2, 0]], dtype=torch.int32, device=device)
    return q, cache, weights, context_lens, block_table


def test_opcheck_scorer_and_top_k():
    q, cache, weights, context_lens, block_table = _scoring_inputs()
    out = torch.empty(2, 50, device=cache.device)
    ops = torch.ops.indexer_kcache
    # bf16 queries: opcheck compares inputs before and after with allclose, which torch
    # does not implement for float8 tensors.
    torch.library.opcheck(ops.paged_mqa_logits_into.default,
                          (q.to(torch.bfloat16), None, cache, weights, context_lens, block_table,
                           out))
    logits = ik.paged_mqa_logits((q, None), cache, weights, context_lens, block_table, 50)
    lengths = ik.lengths_from_context(context_lens, 1, 50)
    picked = torch.empty(2, 8, dtype=torch.int32, device=cache.device)
    torch.library.opcheck(ops.top_k_indices_into.default, (logits, lengths, picked))


def test_compile_fullgraph_scores_and_selects():
    q, cache, weights, context_lens, block_table = _scoring_inputs()

    def step(values, weights, context_lens, block_table):
        logits = ik.paged_mqa_logits((values, None), cache, weights, context_lens,
                                     block_table, 50)
        return logits, ik.top_k_indices(logits, 8, ik.lengths_from_context(context_lens, 1, 50))

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    want = step(q, weights, context_lens, block_table)
    got = compiled(q, weights, context_lens, block_table)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_meta_tensors_give_meta_results():
    """Eager calls on meta tensors take the ops' fake implementations (shapes and dtypes, no
    launch), as they do through the dispatcher."""
    q, cache, weights, context_lens, block_table = (t.to("meta") for t in _scoring_inputs())
    logits = ik.paged_mqa_logits((q, None), cache, weights, context_lens, block_table, 50)
    assert logits.is_meta and logits.shape == (2, 50) and logits.dtype == torch.float32
    picked = ik.top_k_indices(logits, 8)
    assert picked.is_meta and picked.shape == (2, 8) and picked.dtype == torch.int32
    slots = torch.arange(5, device="meta")
    values, scales = ik.gather_indexer_k(cache, slots, False)
    assert values.is_meta and values.shape == (5, 128) and scales.shape == (5, 4)
    keys = ik.dequantize_indexer_k(cache, slots, False, mx_scales=False)
    assert keys.is_meta and keys.shape == (5, 128) and keys.dtype == torch.float32
