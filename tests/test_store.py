"""The store: Triton kernel == torch reference == independent oracle, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton import knobs

import indexer_kcache as ik
from indexer_kcache import layout, reference

from . import oracle
from .cases import SENTINEL, make_case, pages

# (use_fp4_cache, mx_scales) by format name, and the layouts each format has: (shuffle,
# mxfp4_n_per_tile) (vLLM's MXFP4 orders: aiter's others are tested in test_store_parity).
FORMATS = layout.FORMATS
LAYOUTS = {
    "fp8": {"row-major": (False, 0), "tiled": (True, 0)},
    "fp8-mx": {"row-major": (False, 0), "tiled": (True, 0)},
    "mxfp4": {"row-major": (False, 0), "preshuffle16": (True, 16), "preshuffle32": (True, 32),
              "preshuffle64": (True, 64)},
}
FORMAT_LAYOUTS = [pytest.param(f, name, id=f"{f}-{name}") for f in FORMATS for name in LAYOUTS[f]]
# (cos_sin dtype, index dtype, weight dtype): every dtype appears, in a few combinations.
DTYPES = [
    pytest.param(torch.float32, torch.int64, torch.bfloat16, id="cs_fp32-i64-w_bf16"),
    pytest.param(torch.bfloat16, torch.int32, torch.float32, id="cs_bf16-i32-w_fp32"),
    pytest.param(torch.float16, torch.int64, torch.float32, id="cs_fp16-i64-w_fp32"),
    pytest.param(torch.float16, torch.int32, torch.bfloat16, id="cs_fp16-i32-w_bf16"),
]


def run_store(case, backend, *, mx_scales=False, shuffle=False, n=0, cache=None, **kw):
    cache = case.new_cache() if cache is None else cache
    ik.indexer_k_norm_rope_store(*case.args(cache), n, mx_scales=mx_scales, shuffle=shuffle,
                                 backend=backend, **kw)
    return cache


def oracle_pages(case, *, mx_scales=False, shuffle=False, n=0) -> np.ndarray:
    flat = np.full(case.num_blocks * case.page_bytes, SENTINEL, dtype=np.uint8)
    oracle.store(flat, case.page_bytes, case.block_size, case.k_pre.float().cpu().numpy(),
                 case.positions.cpu().numpy(), case.cos_sin_cache.float().cpu().numpy(),
                 case.weight.float().cpu().numpy(), case.eps, case.slots.cpu().numpy(),
                 case.compress_ratio, case.use_fp4_cache, mx_scales, shuffle, n)
    return flat.reshape(case.num_blocks, case.page_bytes)


def assert_same_bytes(got: torch.Tensor, want, what: str) -> None:
    got = pages(got).cpu().numpy() if isinstance(got, torch.Tensor) and got.dim() == 3 else got
    want = pages(want).cpu().numpy() if isinstance(want, torch.Tensor) else want
    diff = np.argwhere(got != want)
    assert diff.size == 0, (f"{what}: {len(diff)} bytes differ, first at page/byte "
                            f"{tuple(diff[0])}: got {got[tuple(diff[0])]:#x}, want "
                            f"{want[tuple(diff[0])]:#x}")


@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
@pytest.mark.parametrize("cs_dtype, index_dtype, weight_dtype", DTYPES)
def test_kernel_matches_reference(fmt, layout_name, compress_ratio, cs_dtype, index_dtype,
                                  weight_dtype):
    fp4, mx = FORMATS[fmt]
    shuffle, n = LAYOUTS[fmt][layout_name]
    case = make_case(33, use_fp4_cache=fp4, compress_ratio=compress_ratio, block_size=64,
                     num_blocks=3, cos_sin_dtype=cs_dtype, index_dtype=index_dtype,
                     weight_dtype=weight_dtype)
    want = run_store(case, "reference", mx_scales=mx, shuffle=shuffle, n=n)
    got = run_store(case, "triton", mx_scales=mx, shuffle=shuffle, n=n)
    assert_same_bytes(got, want, "triton vs reference")
    assert (pages(want) != SENTINEL).any(), "nothing was written"
    assert (pages(want)[:, -case.page_bytes + case.block_size * ik.cache_row_bytes(fp4):]
            == SENTINEL).all(), "page padding was touched"


@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS)
def test_reference_matches_oracle(fmt, layout_name, compress_ratio):
    fp4, mx = FORMATS[fmt]
    shuffle, n = LAYOUTS[fmt][layout_name]
    case = make_case(12, use_fp4_cache=fp4, compress_ratio=compress_ratio, block_size=64,
                     num_blocks=2, cos_sin_dtype=torch.float32)
    want = oracle_pages(case, mx_scales=mx, shuffle=shuffle, n=n)
    got = run_store(case, "reference", mx_scales=mx, shuffle=shuffle, n=n)
    assert_same_bytes(got, want, "reference vs oracle")


EDGES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 136.0, 7.9375, 31.5, 0.0, -0.0,
                      448.0, 1e-30, -3.0, 6.0], dtype=torch.float32)


@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "mxfp4"])
def test_extreme_values_match_oracle(fp4):
    """Zeros, signed zeros, tiny and huge values, over 16 binades (exact ties and carries
    of each conversion are covered by test_numerics)."""
    case = make_case(16, use_fp4_cache=fp4, block_size=16, num_blocks=1, skip_every=0)
    k = (EDGES.repeat(8)[torch.randperm(layout.HEAD_DIM)].view(1, layout.HEAD_DIM)
         * torch.exp2(torch.arange(16.0))[:, None])
    case.k_pre[:16] = k.to(torch.bfloat16).to(case.k_pre.device)
    case.weight.fill_(1.0)
    want = oracle_pages(case)
    for backend in ("reference", "triton"):
        assert_same_bytes(run_store(case, backend), want, f"{backend} vs oracle")


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_out_of_range_slots_and_positions_write_nothing(backend, compress_ratio, index_dtype):
    """Slots and positions out of range, down to the index type's extremes and values whose
    low 32 bits are in range, write nothing; each bad token is otherwise a writer (a valid
    slot, a group-end position)."""
    case = make_case(24, block_size=16, num_blocks=2, compress_ratio=compress_ratio,
                     skip_every=0, index_dtype=index_dtype)
    num_slots, max_pos = 32, case.cos_sin_cache.shape[0]
    low, high = torch.iinfo(index_dtype).min, torch.iinfo(index_dtype).max
    bad_slots = [num_slots, -7, low, high] + ([2**32 + 3, -2**32 + 3, 10**12]
                                              if index_dtype == torch.int64 else [])
    # Odd positions are group ends at ratio 2 too; the last: the first group past the
    # cos/sin rows (max_pos is even).
    bad_positions = [-1, low + 1, high, max_pos + compress_ratio - 1]
    if index_dtype == torch.int64:
        bad_positions += [2**32 + 1, 2**40 + 1]
    tokens = torch.randperm(24)[:len(bad_slots) + len(bad_positions)].tolist()
    writer_pos = 2 * torch.arange(24, device=case.positions.device) + 1  # in range, odd
    case.positions[:24] = writer_pos.to(index_dtype)
    for token, slot in zip(tokens[:len(bad_slots)], bad_slots, strict=True):
        case.slots[token] = slot
    for token, pos in zip(tokens[len(bad_slots):], bad_positions, strict=True):
        case.positions[token] = pos
    assert int(writer_pos.max()) < max_pos and max_pos % 2 == 0
    got = run_store(case, backend)
    # The same call with those tokens skipped explicitly.
    case.slots[tokens] = -1
    want = run_store(case, "reference")
    assert_same_bytes(got, want, "out-of-range tokens")
    assert (pages(want) != pages(case.new_cache())).any()  # the good tokens did write


def test_check_bounds_names_the_first_bad_token():
    case = make_case(10, block_size=16, num_blocks=1, skip_every=0, compress_ratio=1)
    case.slots[6] = 16
    cache = case.new_cache()
    before = pages(cache).clone()
    with pytest.raises(IndexError, match="token 6"):
        ik.indexer_k_norm_rope_store(*case.args(cache), check_bounds=True)
    assert torch.equal(pages(cache), before)
    case.slots[6] = 1
    case.positions[4] = case.cos_sin_cache.shape[0]
    with pytest.raises(IndexError, match="token 4"):
        ik.indexer_k_norm_rope_store(*case.args(cache), check_bounds=True)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_zero_tokens_changes_nothing(backend):
    case = make_case(5)
    case.slots = case.slots[:0]
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache), backend=backend)
    assert (pages(cache) == SENTINEL).all()


@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "mxfp4"])
def test_dequantized_keys_are_close_to_the_keys(fp4):
    case = make_case(20, use_fp4_cache=fp4, skip_every=0, compress_ratio=1)
    cache = run_store(case, None)
    keys = reference.normalize_and_rope(case.k_pre[:20].float(), case.positions[:20].long(),
                                        case.cos_sin_cache, case.weight, case.eps)
    got = ik.dequantize_indexer_k(cache, case.slots, fp4, mx_scales=False)
    rel = (got - keys).norm() / keys.norm()
    assert rel < (0.2 if fp4 else 0.04), rel  # E2M1 keeps 1 mantissa bit


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    num_tokens=st.integers(1, 40),
    fmt=st.sampled_from(sorted(FORMATS)),
    compress_ratio=st.sampled_from([1, 2]),
    block_size=st.sampled_from([1, 2, 5, 16, 32, 64, 128, 256]),
    shuffle=st.booleans(),
    n=st.sampled_from([16, 32, 64]),
    extra_pages=st.integers(0, 2),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_cases(num_tokens, fmt, compress_ratio, block_size, shuffle, n, extra_pages, seed):
    fp4, mx = FORMATS[fmt]
    if shuffle and not fp4 and block_size % 16:
        block_size = 16
    if shuffle and fp4 and block_size > 1 and block_size % n:
        n = 16 if block_size % 16 == 0 else 0
        shuffle = n != 0
    num_blocks = -(-num_tokens // block_size) + extra_pages
    case = make_case(num_tokens, use_fp4_cache=fp4, compress_ratio=compress_ratio,
                     block_size=block_size, num_blocks=max(num_blocks, 1),
                     generator=torch.Generator().manual_seed(seed))
    want = run_store(case, "reference", mx_scales=mx, shuffle=shuffle, n=n)
    got = run_store(case, "triton", mx_scales=mx, shuffle=shuffle, n=n)
    assert_same_bytes(got, want, "triton vs reference")


@pytest.mark.parametrize("start", [0, 1], ids=["even-start", "odd-start"])
@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "mxfp4"])
def test_compress_ratio_2_with_consecutive_and_scattered_positions(fp4, start):
    """Consecutive positions (one writer per token pair, either member) and all-odd
    positions (both members of a pair write) through the kernel's pairing of tokens."""
    case = make_case(45, use_fp4_cache=fp4, compress_ratio=2, block_size=16, num_blocks=4,
                     skip_every=0)
    for positions in (torch.arange(45) + start + 10, 2 * torch.arange(45) + 1):
        case.positions[:45] = positions.to(case.positions)
        case.k_pre[:45] = torch.randn(45, layout.HEAD_DIM, device=case.k_pre.device).to(torch.bfloat16)
        want = run_store(case, "reference")
        got = run_store(case, "triton")
        assert_same_bytes(got, want, "triton vs reference")


GPU_SETTINGS = sorted({ik.store.store_settings(n, cr, fp4, interpreted=False, key_bytes=kb)
                       for n in (1, 64, 512, 4096, 32768, 262144) for cr in (1, 2)
                       for fp4 in (False, True) for kb in (2, 4)}
                      | {(32, 2, True, 0, False, 1), (32, 4, True, 0, False, 1),
                         (32, 2, False, 0, False, 1), (32, 4, False, 0, False, 1),
                         # compaction: one range, several, a wide program
                         (16, 2, False, 96, True, 1), (8, 1, False, 0, True, 3),
                         (32, 4, False, 0, True, 2)})


def _setting_id(setting):
    block_t, warps, eager, max_registers, compact, ranges, *rest = setting
    hint, group_scales = (*rest, 0, False)[:2]
    return (f"{block_t}x{warps}" + "-eager" * eager + f"-{max_registers}-regs" * bool(max_registers)
            + f"-compact{ranges}" * compact + f"-hint{hint}" * bool(hint)
            + "-group-scales" * group_scales)


@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS["mxfp4"]))
def test_mxfp4_scale_bytes_by_word_and_by_group(layout_name, compress_ratio):
    """The kernel's two ways to store MXFP4 scale bytes (a token's four from one word, or
    each group's after the values: ``group_scales``) write the reference's bytes in every
    layout, poisoned keys (a NaN, an infinity) included."""
    shuffle, n = LAYOUTS["mxfp4"][layout_name]
    case = make_case(41, use_fp4_cache=True, compress_ratio=compress_ratio, block_size=64,
                     num_blocks=3)
    written = ((case.slots >= 0) & ((case.positions[:41] + 1) % compress_ratio == 0)).nonzero()
    case.k_pre[written[0, 0], 7] = float("nan")
    case.k_pre[written[-1, 0], 100] = float("-inf")
    want = run_store(case, "reference", shuffle=shuffle, n=n)
    for group_scales in (False, True):
        setting = ik.store.StoreSettings(16, 2, compress_ratio == 1, 0, group_scales=group_scales)
        with ik.store.store_settings.override(setting):
            got = run_store(case, "triton", shuffle=shuffle, n=n)
        assert_same_bytes(got, want, f"group_scales={group_scales}")


def test_large_ratio_2_settings_by_key_width():
    """Above 64K tokens ratio 2 takes pairs, capped at 96 registers, for every key width;
    its programs hint a later program's indices into L2, but for float32 keys into MXFP4."""
    for fp4 in (False, True):
        for key_bytes in (2, 4):
            s = ik.store.store_settings(262144, 2, fp4, interpreted=False, key_bytes=key_bytes)
            assert (s.tokens_per_program, s.num_warps, s.max_registers, s.compact) == (
                16, 2, 96, False), (fp4, key_bytes, s)
            want_hint = 0 if fp4 and key_bytes == 4 else ik.store.HINT_AHEAD
            assert s.hint_ahead == want_hint, (fp4, key_bytes, s)
    assert ik.store.store_settings(262144, 2, True, interpreted=True, key_bytes=4).ranges == 1


def test_large_ratio_1_settings_by_key_width():
    """Above 64K tokens at ratio 1, bf16 keys into MXFP4 take 32 tokens a program (their
    scale bytes stored by group); float32 keys into MXFP4 (their rows hold twice the
    registers) and FP8 16; two warps each."""
    for fp4, key_bytes, tokens in [(True, 2, 32), (True, 4, 16), (False, 2, 16), (False, 4, 16)]:
        s = ik.store.store_settings(262144, 1, fp4, interpreted=False, key_bytes=key_bytes)
        assert (s.tokens_per_program, s.num_warps, s.eager_loads, s.compact) == (
            tokens, 2, True, False), s
        assert s.group_scales == (tokens == 32), s


@pytest.mark.sweep
@pytest.mark.parametrize("page_pad", [24, 0], ids=["padded-pages", "packed-pages"])
@pytest.mark.parametrize("setting", GPU_SETTINGS, ids=_setting_id)
@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "mxfp4"])
def test_every_gpu_launch_setting(fp4, compress_ratio, setting, page_pad):
    """Each (tokens per program, warps, eager loads, register cap, compaction, ranges) the
    GPU launcher picks, and others it picked before or may pick, whatever the machine running
    the tests (the interpreter would otherwise use one setting only). Page strides that are
    and are not multiples of 16 bytes compile to different programs."""
    case = make_case(37, use_fp4_cache=fp4, compress_ratio=compress_ratio, block_size=16,
                     num_blocks=5, page_pad=page_pad)
    want = run_store(case, "reference")
    with ik.store.store_settings.override(ik.store.StoreSettings(*setting)):
        assert_same_bytes(run_store(case, "triton"), want, f"setting {setting}")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [300, 5000, 70000])
@pytest.mark.parametrize("compress_ratio", [1, 2], ids=["cr1", "cr2"])
@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "mxfp4"])
def test_launched_settings_at_their_sizes(fp4, compress_ratio, tokens):
    """The setting the launcher picks for a size, at that size, over several random cases
    (varied magnitudes, NaN rows, scattered slots and positions, padded pages): compiled
    programs can differ from the interpreter's view in ways one small case does not show."""
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        case = make_case(tokens, use_fp4_cache=fp4, compress_ratio=compress_ratio,
                         block_size=64, max_pos=2 * tokens, page_pad=24 * (seed % 2),
                         generator=g)
        if seed >= 4:  # rows of edge values (ties, zeros, extremes) over many binades
            k = EDGES[torch.randint(0, len(EDGES), (tokens, layout.HEAD_DIM), generator=g)]
            k *= torch.exp2(torch.randint(-40, 40, (tokens, 1), generator=g).float())
            case.k_pre[:tokens] = k.to(torch.bfloat16).to(case.k_pre.device)
        want = run_store(case, "reference")
        assert_same_bytes(run_store(case, "triton"), want, f"seed {seed}")


def test_an_empty_launch_hook_chain_counts_as_no_hook():
    """Triton's hook chains are never None; the launcher skips the launch metadata and the
    hook calls only for an empty chain, and keeps any installed hook."""
    chain = knobs.HookChain()
    assert ik.fast_path.installed_hook(None) is None
    assert ik.fast_path.installed_hook(chain) is None
    chain.add(print)
    assert ik.fast_path.installed_hook(chain) is chain
    assert ik.fast_path.installed_hook(print) is print


@pytest.mark.gpu
def test_installed_launch_hooks_see_every_launch():
    """After the first launch the store calls the compiled kernel directly; hooks that
    profilers install must still see those launches, with the kernel's name."""
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    case = make_case(20, use_fp4_cache=False, compress_ratio=1, block_size=16, num_blocks=3)
    run_store(case, "triton")  # compiled and cached
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        for _ in range(3):
            run_store(case, "triton")
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert seen == ["indexer_k_store_kernel"] * 3
    run_store(case, "triton")
    assert len(seen) == 3


def test_compile_options_name_nvidia_only_options_only_on_nvidia():
    """Triton's AMD backend rejects unknown launch options by name (KeyError): PDL and the
    register cap go to NVIDIA GPUs only; no fused multiply-adds anywhere."""
    from triton.backends.amd.compiler import HIPOptions
    from triton.backends.nvidia.compiler import CUDAOptions

    amd = ik.store.compile_options(False, False, 80)
    assert amd == {"enable_fp_fusion": False}
    assert set(amd) <= set(HIPOptions.__dataclass_fields__)
    nvidia = ik.store.compile_options(True, True, 80)
    assert nvidia == {"enable_fp_fusion": False, "launch_pdl": True, "maxnreg": 80}
    assert set(nvidia) <= set(CUDAOptions.__dataclass_fields__)
    assert "maxnreg" not in ik.store.compile_options(True, False, 0)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_mx_scales_has_no_effect_on_mxfp4(backend):
    """MXFP4's scales are UE8M0 whatever ``mx_scales`` says (vLLM sets its MX flag only for
    FP8): a caller passing one flag for every layer writes MXFP4 layers unchanged."""
    case = make_case(9, use_fp4_cache=True, compress_ratio=2, block_size=16, num_blocks=2)
    assert_same_bytes(run_store(case, backend, mx_scales=True),
                      run_store(case, backend, mx_scales=False), "mx_scales True vs False")
