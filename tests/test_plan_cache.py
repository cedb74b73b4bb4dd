"""The plan cache: a plan is reused only for tensors whose metadata it was checked for.

Both paths run: the fast path with torch's C++ TensorGuards (where it works) and the plain
path with the Python MetadataGuard that stands in for it elsewhere.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch

import indexer_kcache as ik
from indexer_kcache import fast_path, launcher

from .cases import make_case, pages
from .test_errors import _replace, bad_calls
from .test_store import assert_same_bytes, run_store

GUARDS = [fast_path.MetadataGuard] + ([fast_path.NATIVE_GUARD] if fast_path.NATIVE_GUARD else [])
GUARD_IDS = [g.__name__ for g in GUARDS]
PATHS = ["fast-path", "plain-path"] if fast_path.enabled() else ["plain-path"]


@pytest.fixture(params=PATHS)
def fresh_plans(request):
    """The store's plan cache, emptied, on the fast path (TensorGuards) or the plain path
    (MetadataGuard)."""
    plans = ik.indexer_k_norm_rope_store.op.plans
    with contextlib.nullcontext() if request.param == "fast-path" else fast_path.disabled():
        plans.clear()
        yield plans
    plans.clear()


def test_the_native_guard_is_used_where_torch_has_it():
    from torch._C._dynamo import guards

    assert fast_path.NATIVE_GUARD is getattr(guards, "TensorGuards", None)
    if fast_path.enabled():
        assert fast_path.guard_class() is fast_path.NATIVE_GUARD
    with fast_path.disabled():
        assert fast_path.guard_class() is fast_path.MetadataGuard


def _base():
    rows = torch.randn(6, 128)
    return (rows[:, :64], torch.arange(6))  # a strided matrix, a vector


def variants():
    """(id, tensors, does the guard built from ``_base()`` accept them)."""
    wide = torch.randn(9, 128)
    return [
        ("more-tokens", (wide[:, :64], torch.arange(9)), True),
        ("fewer-tokens", (wide[:2, :64], torch.arange(0)), True),
        ("dtype", (wide.double()[:, :64], torch.arange(9)), False),
        ("index-dtype", (wide[:, :64], torch.arange(9, dtype=torch.int32)), False),
        ("row-stride", (torch.randn(9, 64), torch.arange(9)), False),
        ("column-stride", (wide[:, ::2], torch.arange(9)), False),
        ("fixed-size", (wide[:, :32], torch.arange(9)), False),
        ("vector-stride", (wide[:, :64], torch.arange(18)[::2]), False),
        ("rank", (wide[:, :64], torch.arange(9).view(3, 3)), False),
        ("device", (torch.empty_strided((9, 64), (128, 1), device="meta"), torch.arange(9)),
         False),
        ("subclass", (torch.nn.Parameter(wide[:, :64], requires_grad=False), torch.arange(9)),
         False),
        ("requires-grad", (torch.randn(9, 128, requires_grad=True)[:, :64], torch.arange(9)),
         False),
        ("not-a-tensor", ([1.0] * 64, torch.arange(9)), False),
        ("none", (None, torch.arange(9)), False),
    ]


@pytest.mark.parametrize("guard_class", GUARDS, ids=GUARD_IDS)
@pytest.mark.parametrize("name, tensors, accepted", variants(), ids=[v[0] for v in variants()])
def test_guard_accepts_only_the_same_metadata(guard_class, name, tensors, accepted):
    base = _base()
    guard = guard_class(*base, dynamic_dims_sizes=[[None, 64], [None]],
                        dynamic_dims_strides=[list(t.stride()) for t in base])
    assert guard.check(*base)
    assert guard.check(*tensors) is accepted


@pytest.mark.parametrize("name, error, words, change", bad_calls(), ids=[b[0] for b in bad_calls()])
def test_a_cached_plan_never_lets_a_bad_call_through(fresh_plans, name, error, words, change):
    """A valid call first (its plan is kept), then one bad argument: still raised, and not
    a byte written."""
    case = make_case(8, block_size=16, num_blocks=4, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache))
    assert fresh_plans.plans, "the valid call's plan was not kept"
    before = pages(cache).clone()
    with pytest.raises(error, match=re.escape(words)):
        ik.indexer_k_norm_rope_store(*_replace(case.args(cache), **change(case, cache)))
    assert torch.equal(pages(cache), before)


def valid_changes():
    """Calls that pass every check but differ from the first in one tensor's metadata."""
    return [
        ("k_pre-row-stride", dict(k_row_stride=128)),
        ("cos_sin-rows", dict(max_pos=500)),
        ("cos_sin-row-stride", dict(cos_sin_row_stride=64)),
        ("cos_sin-dtype", dict(cos_sin_dtype=torch.bfloat16)),
        ("weight-dtype", dict(weight_dtype=torch.float32)),
        ("index-dtype", dict(index_dtype=torch.int32)),
        ("pages", dict(num_blocks=7)),
        ("page-bytes", dict(page_pad=0)),
        ("block-size", dict(block_size=32)),
    ]


@pytest.mark.parametrize("name, change", valid_changes(), ids=[v[0] for v in valid_changes()])
def test_each_new_layout_gets_its_own_plan(fresh_plans, name, change):
    """After a call has kept its plan, a call whose tensors differ in one property writes
    exactly what the reference writes for it (a stale plan would use the old strides,
    sizes or dtypes)."""
    first = make_case(11, num_blocks=4)
    run_store(first, "triton")
    options = dict(num_blocks=4) | change
    case = make_case(11, **options)
    assert_same_bytes(run_store(case, "triton"), run_store(case, "reference"), name)
    assert sum(len(plans) for plans in fresh_plans.plans.values()) >= 2


def test_a_one_element_vector_with_another_stride_is_not_cached(fresh_plans):
    case = make_case(1, num_blocks=2, skip_every=0)
    strided = torch.stack([case.slots, case.slots], 1).view(-1)[::2]  # stride 2
    ik.indexer_k_norm_rope_store(*_replace(case.args(case.new_cache()), kv_slot_mapping=strided))
    assert not fresh_plans.plans


def test_inference_mode_and_grad_mode_calls_find_their_plans(fresh_plans):
    """The native guard compares dispatch keys under the thread's modes (and a cache made
    under ``torch.inference_mode()`` is an inference tensor): each mode keeps its plan,
    found again on the next round, and every call writes the reference's bytes."""
    case = make_case(9, num_blocks=4)
    want = run_store(case, "reference")
    counts = []
    for _ in range(3):
        assert_same_bytes(run_store(case, "triton"), want, "outside")
        with torch.inference_mode():
            assert_same_bytes(run_store(case, "triton"), want, "inference mode")
        with torch.no_grad():
            assert_same_bytes(run_store(case, "triton"), want, "no_grad")
        counts.append(sum(len(plans) for plans in fresh_plans.plans.values()))
    assert counts[0] == counts[-1] <= 3


def test_a_plan_whose_guard_rejects_its_own_tensors_is_not_kept(monkeypatch):
    class Never(fast_path.MetadataGuard):
        def check(self, *tensors):
            return False

    monkeypatch.setattr(fast_path, "guard_class", lambda: Never)
    cache = launcher.PlanCache(token_dims=((0,),))
    cache.keep(("options",), (torch.arange(3),), "plan")
    assert not cache.plans  # else every call would add one more plan that is never found
