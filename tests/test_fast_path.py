"""The fast path and the plain path give the same bytes; the plain path is what runs when
the fast path is switched off (``INDEXER_KCACHE_FAST_PATH=0``) or the versions are unknown.

Under the CPU interpreter both paths launch through Triton (``kernel[grid](...)``) and differ
in the plan guard and the eager/dispatcher switch; on a GPU the fast path also launches the
compiled kernels directly.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings

import pytest
import torch

import indexer_kcache as ik
from indexer_kcache import fast_path, launcher

from .cases import make_case, pages
from .test_store import FORMAT_LAYOUTS, FORMATS, LAYOUTS


def _store_and_read(case, fmt, layout_name):
    """Three store calls (the second and third find their plan) and the readers' results."""
    fp4, mx = FORMATS[fmt]
    shuffle, n = LAYOUTS[fmt][layout_name]
    cache = case.new_cache()
    for _ in range(3):
        ik.indexer_k_norm_rope_store(*case.args(cache), n, mx_scales=mx, shuffle=shuffle)
    slots = case.slots[case.slots >= 0]
    options = dict(shuffle=shuffle, mxfp4_n_per_tile=n)
    gathered = [ik.gather_indexer_k(cache, slots, fp4, **options) for _ in range(2)]
    keys = [ik.dequantize_indexer_k(cache, slots, fp4, mx_scales=mx, **options) for _ in range(2)]
    block_table = torch.arange(case.num_blocks, device=slots.device).flip(0).view(1, -1)
    cu_seq_lens = torch.tensor([0, case.num_blocks * case.block_size - 5], device=slots.device)
    by_blocks = [ik.gather_indexer_k_by_blocks(cache, block_table, cu_seq_lens, fp4, **options)
                 for _ in range(2)]
    return pages(cache), gathered, keys, by_blocks


@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
def test_plain_path_gives_the_same_bytes(fmt, layout_name):
    case = make_case(29, use_fp4_cache=FORMATS[fmt][0], block_size=64, num_blocks=2)
    fast = _store_and_read(case, fmt, layout_name)
    with fast_path.disabled():
        assert not fast_path.enabled()
        plain = _store_and_read(case, fmt, layout_name)
    assert torch.equal(fast[0], plain[0])
    for fast_results, plain_results in zip(fast[1:], plain[1:], strict=True):
        for got, want in zip(fast_results, plain_results, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_switching_paths_drops_kept_plans():
    case = make_case(9, block_size=16, num_blocks=2)
    ik.indexer_k_norm_rope_store(*case.args(case.new_cache()))
    plans = ik.indexer_k_norm_rope_store.op.plans
    assert len(plans) >= 1
    with fast_path.disabled():
        assert len(plans) == 0
        ik.indexer_k_norm_rope_store(*case.args(case.new_cache()))
        assert len(plans) == 1  # kept with the Python guard
    assert len(plans) == 0


def test_the_environment_variable_switches_the_fast_path_off():
    code = ("import indexer_kcache as ik; from indexer_kcache import fast_path; "
            "print(fast_path.enabled(), fast_path.AVAILABLE)")
    env = dict(os.environ, INDEXER_KCACHE_FAST_PATH="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "False" and out[1] == str(fast_path.AVAILABLE)


def test_unknown_versions_take_the_plain_path():
    assert fast_path.known_version("2.11.0+cu130", fast_path.KNOWN_TORCH)
    assert fast_path.known_version("3.6.0", fast_path.KNOWN_TRITON)
    assert not fast_path.known_version("3.10.0", fast_path.KNOWN_TRITON)
    assert not fast_path.known_version("2.5.1", fast_path.KNOWN_TORCH)
    assert not fast_path.known_version("3.0.0a0", fast_path.KNOWN_TORCH)


def test_plain_eager_is_false_under_modes_and_on_the_plain_path():
    t = torch.zeros(2)
    assert fast_path.plain_eager() is fast_path.enabled()
    assert fast_path.plain_tensors((t, t))
    assert fast_path.plain_tensors((torch.nn.Parameter(t), t))  # no dispatch of its own
    assert not fast_path.plain_tensors((t.as_subclass(_Counted), t))
    assert not fast_path.plain_tensors((torch._neg_view(t), t))
    assert not fast_path.plain_tensors((torch._efficientzerotensor((2,)), t))  # no storage
    assert not fast_path.plain_tensors((torch._to_functional_tensor(t), t))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not fast_path.plain_eager()
    with fast_path.disabled():
        assert not fast_path.plain_eager()


def test_a_parameter_counts_as_a_plain_tensor(monkeypatch):
    """``nn.Parameter`` (a norm layer's weight) has no dispatch of its own: its calls keep
    their plan and take the fast path like plain tensors (one full check for three calls),
    with the same bytes."""
    case = make_case(9, block_size=16, num_blocks=2)
    want = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(want))
    got = case.new_cache()
    args = list(case.args(got))
    args[3] = torch.nn.Parameter(case.weight, requires_grad=False)
    op = ik.indexer_k_norm_rope_store.op
    op.plans.clear()
    checks = []
    monkeypatch.setattr(op, "check", lambda call, check=op.check: checks.append(1) or check(call))
    for _ in range(3):
        ik.indexer_k_norm_rope_store(*args)
    assert torch.equal(pages(got), pages(want))
    assert len(checks) == (1 if fast_path.enabled() else 3)


class _Counted(torch.Tensor):
    """A subclass whose ``__torch_function__`` counts the calls it sees."""

    seen = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if "indexer_kcache" in str(func):
            cls.seen += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_subclass_sees_every_call_not_only_the_first():
    """A plan made inside the op from a subclass's tensors is not kept: the next eager call
    with them goes through the op again (its ``__torch_function__`` sees each call)."""
    case = make_case(9, block_size=16, num_blocks=2)
    cache = case.new_cache()
    args = list(case.args(cache))
    args[3] = case.weight.as_subclass(_Counted)
    _Counted.seen = 0
    for _ in range(3):
        ik.indexer_k_norm_rope_store(*args)
    assert _Counted.seen == 3


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "plain-path"])
def test_lazily_negated_views_are_read_as_their_values(fast):
    """A negated view (``torch._neg_view``, or the imaginary part of a conjugate) holds the
    bytes of the other sign: such a call goes through the op, which materialises it."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 40, generator=g)
    want = ik.top_k_indices(-logits, 5, backend="reference")
    with contextlib.nullcontext() if fast else fast_path.disabled():
        assert torch.equal(ik.top_k_indices(torch._neg_view(logits), 5), want)
        # A negated view to be written: the op cannot write its bytes, a ValueError names it.
        out = torch.empty(2, 5, dtype=torch.int32)
        with pytest.raises(ValueError, match="out: expected a tensor without the lazy negation"):
            ik.top_k_indices(logits, 5, out=torch._neg_view(out))


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "plain-path"])
def test_torch_func_transforms_go_through_the_op(fast):
    """vmap's batched tensors are ``torch.Tensor`` to Python but hold no storage: the call
    goes through the op (vmap's per-sample fallback), as on the plain path."""
    case = make_case(9, block_size=16, num_blocks=2, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache))
    slots = case.slots[:6].reshape(2, 3)
    with contextlib.nullcontext() if fast else fast_path.disabled():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no batching rule": the per-sample fallback
            values, scales = torch.vmap(
                lambda s: ik.gather_indexer_k(cache, s, False, check_bounds=False))(slots)
    for row in range(2):
        want = ik.gather_indexer_k(cache, slots[row], False)
        assert torch.equal(values[row], want[0]) and torch.equal(scales[row], want[1])


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "plain-path"])
def test_the_same_errors_on_both_paths(fast):
    """An int beyond int64 (which no schema takes) is a ValueError naming it, and of two
    bad arguments the option's type is named first, on either path."""
    case = make_case(9, block_size=16, num_blocks=2)
    cache = case.new_cache()
    before = pages(cache).clone()
    with contextlib.nullcontext() if fast else fast_path.disabled():
        with pytest.raises(ValueError, match="mxfp4_n_per_tile: expected an int64"):
            ik.indexer_k_norm_rope_store(*case.args(cache), 1 << 64)
        args = list(case.args(cache))
        args[0], args[4] = case.k_pre.double(), True  # a bad dtype and a bad option type
        with pytest.raises(TypeError, match="rms_norm_eps: expected a float, got bool"):
            ik.indexer_k_norm_rope_store(*args)
    assert torch.equal(pages(cache), before)


def test_the_last_call_is_reused_only_for_the_same_options_and_tensors():
    """A plain eager call reuses the last call's plan when every option is the very same
    object and the guard passes; an equal option of another type (1 for True, 2.0 for 2),
    another dtype or another stride of a tensor still meets the full checks."""
    case = make_case(9, block_size=16, num_blocks=2)
    store = ik.indexer_k_norm_rope_store
    want = case.new_cache()
    store(*case.args(want))
    last = store.op.plans.last[0]
    assert last is not None and fast_path.enabled()

    class CountingLookups(dict):
        lookups = 0

        def get(self, *args):
            CountingLookups.lookups += 1
            return super().get(*args)

    plans = store.op.plans
    kept, plans.plans = plans.plans, CountingLookups(plans.plans)
    try:
        got = case.new_cache()
        store(*case.args(got))  # through the last call's plan: no lookup
        assert CountingLookups.lookups == 0
        args = list(case.args(case.new_cache()))
        args[4] = float(str(case.eps))  # an equal float, another object: looked up
        store(*args)
        assert CountingLookups.lookups == 1
    finally:
        plans.plans = kept
    assert torch.equal(pages(got), pages(want))
    args = list(case.args(case.new_cache()))
    for index, value, name in ((8, int(case.use_fp4_cache), "use_fp4_cache"),
                               (7, float(case.compress_ratio), "compress_ratio")):
        wrong = list(args)
        wrong[index] = value
        with pytest.raises(TypeError, match=name):
            store(*wrong)
    wrong = list(args)
    wrong[0] = case.k_pre.to(torch.float64)
    with pytest.raises(TypeError, match="k_pre"):
        store(*wrong)
    wrong = list(args)
    wrong[6] = case.slots.repeat_interleave(2)[::2]  # the same values, another stride
    with pytest.raises(ValueError, match=r"kv_slot_mapping\.stride\(0\)"):
        store(*wrong)
    cache = case.new_cache()
    store(*case.args(cache))  # and back to the last plan's calls
    assert torch.equal(pages(cache), pages(want))


def test_generated_names_are_checked_and_a_launch_may_take_only_the_grid():
    """Kernel parameters that would clash with the generated launch code are refused; a
    kernel whose arguments are all fixed launches with the grid alone."""
    import triton
    import triton.language as tl

    @triton.jit
    def clashing(grid, x_ptr):
        tl.store(x_ptr, grid)

    @triton.jit
    def fill(x_ptr, value, N: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, N), tl.full([N], value, tl.int32))

    with pytest.raises(TypeError, match="grid"):
        launcher.Kernel(clashing).launch(torch.device("cpu"), num_warps=1)
    x = torch.zeros(8, dtype=torch.int32)
    launch = launcher.Kernel(fill).launch(torch.device("cpu"), num_warps=1, x_ptr=x, value=5,
                                          N=8)
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("launching on the CPU needs the interpreter")
    launch((1,))
    assert x.eq(5).all()


def test_every_launch_names_its_multiply_add_fusion():
    """Triton 3.9 warns when a compile leaves fused multiply-adds to its default, which 3.10
    turns off: every launch names it, on unless the op's options turn it off (the store's
    do, for the reference's rounding)."""
    import triton

    @triton.jit
    def noop(x_ptr):
        pass

    launch = launcher.Kernel(noop).launch(torch.device("cpu"), num_warps=1)
    assert launch.state.launch_options["enable_fp_fusion"] is True
    launch = launcher.Kernel(noop).launch(torch.device("cpu"), num_warps=1,
                                          options=ik.store.compile_options(True, True, 80))
    assert launch.state.launch_options["enable_fp_fusion"] is False


def test_a_tunable_setting_is_overridden_only_inside_the_block():
    fixed = ik.store.StoreSettings(4, 1, False, 0)
    before = ik.store.store_settings(100, 1, False, False)
    with ik.store.store_settings.override(fixed):
        assert ik.store.store_settings(100, 1, False, False) == fixed
        with ik.store.store_settings.override(lambda *args: before):
            assert ik.store.store_settings(7, 2, True, True) == before
        assert ik.store.store_settings(100, 1, False, False) == fixed
    assert ik.store.store_settings(100, 1, False, False) == before


class _Compiled:
    """A stand-in compiled kernel whose launcher records its arguments."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, runs: list) -> None:
        self.runs = runs

    def run(self, *args) -> None:
        self.runs.append(args)


def _stand_in_launch(monkeypatch, fn, **fixed):
    """A kernel launch as on a GPU (compiling, device 0, stream 77, fast path on), with
    Triton's launch replaced by a recorder that returns a stand-in compiled kernel:
    (launch, Triton's launches, the compiled kernels' runs)."""
    launches, runs = [], []
    launch = launcher.Kernel(fn).launch(torch.device("cpu"), num_warps=1, **fixed)
    state = launch.state
    state.compiles, state.device_index = True, 0
    monkeypatch.setattr(state, "triton_launch",
                        lambda grid, values: launches.append((grid, values)) or _Compiled(runs))
    monkeypatch.setattr(fast_path, "current_device", lambda: 0)
    monkeypatch.setattr(fast_path, "current_stream", lambda device: 77)
    monkeypatch.setattr(fast_path, "_enabled", True)
    return launch, launches, runs


def test_generated_launches_key_what_triton_specialises_on(monkeypatch):
    """Aligned pointers and 32-bit unspecialised ints share one key; anything else keys each
    argument as Triton's specialisation sees it."""
    kernel = launcher.Kernel(ik.store.indexer_k_store_kernel)
    fixed = {n: 1 for n in kernel.names if n not in ("k_pre_ptr", "slot_ptr", "num_tokens")}
    launch, launches, runs = _stand_in_launch(monkeypatch, kernel.fn, **fixed)
    assert sorted(launch.state.per_call) == ["k_pre_ptr", "num_tokens", "slot_ptr"]
    compiled = launch.state.compiled
    t = torch.zeros(64, dtype=torch.uint8)
    launch((1,), k_pre_ptr=t, slot_ptr=t, num_tokens=3)
    assert list(compiled) == [True]
    launch((1,), k_pre_ptr=t, slot_ptr=t, num_tokens=3)
    args = runs[-1][9:]  # after the grid, stream, function, metadata and hooks
    assert len(args) == len(kernel.names)
    assert args[kernel.names.index("k_pre_ptr")] == t.data_ptr()
    launch((1,), k_pre_ptr=t[1:], slot_ptr=t, num_tokens=3)
    assert list(compiled)[-1] == (False, True, True)
    launch((1,), k_pre_ptr=t, slot_ptr=t, num_tokens=2**33)
    assert list(compiled)[-1] == (True, True, False)
    assert len(launches) == 3


def test_the_direct_launcher_launches_the_compiled_kernel_of_the_key(monkeypatch):
    """On a GPU the first launch of a specialisation goes through Triton, later ones call
    the compiled kernel's launcher with every argument in the kernel's order (pointers as
    addresses, fixed values included) on the current stream; a new key (a misaligned
    pointer) or the fast path switched off goes through Triton again. Run here with a
    stand-in for Triton's launch and the compiled kernel."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"])
    def fill(x_ptr, value, n, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(x_ptr + i, tl.full([N], value, tl.int32), mask=i < n)

    launch, launches, runs = _stand_in_launch(monkeypatch, fill, value=5, N=8)
    x = torch.zeros(64, dtype=torch.int32)
    launch((2,), x_ptr=x, n=3)
    assert launches == [((2,), (x, 3))] and not runs
    launch((2,), x_ptr=x, n=4)
    assert runs == [(2, 1, 1, 77, "function", "metadata", None, None, None, x.data_ptr(), 5, 4, 8)]
    launch((1, 3, 1), x_ptr=x[1:], n=4)  # 4-byte aligned only: a key of its own
    assert len(launches) == 2 and len(runs) == 1
    launch((1, 3, 1), x_ptr=x[1:], n=4)
    assert runs[-1][:4] == (1, 3, 1, 77) and runs[-1][9] == x[1:].data_ptr()
    monkeypatch.setattr(fast_path, "_enabled", False)
    launch((2,), x_ptr=x, n=4)
    assert len(launches) == 3 and len(runs) == 2
