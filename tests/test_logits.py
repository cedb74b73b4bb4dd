"""The scorer: paged MQA logits against an independent float64 computation.

Keys are written into padded, sentinel-filled pages by the real store; the expected logits
are computed here from the cache's bytes (offsets typed again in ``oracle.offsets``) and
the queries, in float64, with the bound of the contract:

    |got - want| <= 2e-3 * sum_h |w_h| * sum_d |q_hd * K_td|      (per element)

plus exact ``-inf`` placement and the top-64 of each row wherever the float64 values
separate it by more than the bound.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch
import triton
import triton.language as tl

import indexer_kcache as ik
import indexer_kcache.logits as logits_module
from indexer_kcache import compat
from indexer_kcache.kernels import INTERPRETED
from indexer_kcache.kernels.logits import (
    BF16_FOLD_SPAN,
    FP4_FOLD_SPAN,
    Q_BF16,
    Q_E4M3,
    Q_E4M3_MX,
    Q_MXFP4,
    VARIANT_ROWS,
    VARIANT_STACKED,
    _fp4_operand_bf16,
)
from indexer_kcache.logits import (
    FALLBACK_REGISTERS,
    LARGE_MXFP4_REGISTERS,
    PROGRAM_FOLD_MIN_TILES,
    TRITON_SPILLS_AT_LARGE_CAP,
    check_logits,
    logits_settings,
    paged_mqa_logits,
    paged_mqa_logits_into,
    run_logits,
    settings_for,
    split_query,
)

from . import oracle
from .cases import DEVICE, make_case

RELATIVE_BOUND = 2e-3
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0,
                     -4.0, -6.0], dtype=torch.float64)
# format -> (use_fp4_cache, mx_scales); layout -> (shuffle, mxfp4_n_per_tile)
FORMATS = {"fp8": (False, False), "fp8-mx": (False, True), "mxfp4": (True, False)}
LAYOUTS = {
    "fp8": {"row-major": (False, 0), "tiled": (True, 0)},
    "fp8-mx": {"row-major": (False, 0), "tiled": (True, 0)},
    "mxfp4": {"row-major": (False, 0), "preshuffle16": (True, 16), "preshuffle32": (True, 32),
              "preshuffle64": (True, 64)},
}
FORMAT_LAYOUTS = [(f, name) for f in FORMATS for name in LAYOUTS[f]]
Q_FORMS = ["bf16", "e4m3", "e4m3-mx", "mxfp4"]
# Blocks of 64 tokens for some layouts (a tile of keys then lies in one block), 16 otherwise.
BLOCK_SIZES = {("fp8", "tiled"): 64, ("fp8-mx", "row-major"): 64, ("mxfp4", "preshuffle64"): 64,
               ("mxfp4", "preshuffle32"): 32}
HEADS = [1, 3, 8, 16]


# ------------------------------------------------------------------------------ inputs
@functools.cache
def stored_cache(fmt: str, layout_name: str, block_size: int, num_blocks: int, seed: int = 0):
    """A padded cache, every slot written by the store (slots in scrambled order), and its
    options. Cached: the interpreter's store is the slow part."""
    fp4, mx = FORMATS[fmt]
    shuffle, n = LAYOUTS[fmt][layout_name]
    gen = torch.Generator().manual_seed(seed)
    case = make_case(num_blocks * block_size, use_fp4_cache=fp4, block_size=block_size,
                     num_blocks=num_blocks, skip_every=0, generator=gen)
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache), n, mx_scales=mx, shuffle=shuffle)
    return cache, dict(mx_scales=mx, shuffle=shuffle, mxfp4_n_per_tile=n)


def make_queries(q_form: str, batch: int, next_n: int, heads: int, gen: torch.Generator):
    shape = (batch, next_n, heads)
    # Magnitudes vary per head, so that heads weigh differently.
    spread = torch.exp2(torch.randint(-3, 4, (*shape, 1), generator=gen).float())
    x = torch.randn(*shape, 128, generator=gen) * spread
    if q_form == "bf16":
        return x.to(torch.bfloat16).to(DEVICE)
    if q_form == "mxfp4":
        values = torch.randint(0, 256, (*shape, 64), generator=gen, dtype=torch.uint8)
    else:
        values = (x * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    scales = None
    if q_form in ("e4m3-mx", "mxfp4"):
        exponents = torch.randint(127 - 6, 127 + 4, (*shape, 4), generator=gen, dtype=torch.uint8)
        scales = exponents.view(torch.int32).reshape(shape).to(DEVICE)
    return values.to(DEVICE), scales


def make_call(fmt, layout_name, q_form, *, batch=4, next_n=1, heads=8, ctx_2d=False,
              block_size=None, num_blocks=12, max_blocks=5, max_model_len=None, seed=0,
              bad_blocks=True, weights_bf16=False):
    """Arguments of one call: ragged lengths (one sequence of length 0, one past the block
    table), scrambled block tables, some block ids out of range."""
    block_size = block_size or BLOCK_SIZES.get((fmt, layout_name), 16)
    cache, options = stored_cache(fmt, layout_name, block_size, num_blocks)
    gen = torch.Generator().manual_seed(1000 + seed)
    q = make_queries(q_form, batch, next_n, heads, gen)
    weights = torch.randn(batch * next_n, heads, generator=gen)
    weights = weights.to(torch.bfloat16 if weights_bf16 else torch.float32).to(DEVICE)
    table = torch.stack([torch.randperm(num_blocks, generator=gen)[:max_blocks]
                         for _ in range(batch)]).to(torch.int32)
    span = max_blocks * block_size
    if bad_blocks and batch > 1:  # never dereferenced: their positions score -inf
        table[1, -1] = num_blocks
        table[batch - 1, 0] = -1
        table[0, 1] = 1 << 30
    if ctx_2d:
        lens = torch.randint(0, span + 8, (batch, next_n), generator=gen, dtype=torch.int32)
        lens[0] = 0
    else:
        lens = torch.randint(next_n, span, (batch,), generator=gen, dtype=torch.int32)
        lens[0] = 0
        if batch > 2:
            lens[2] = span + 40  # past the block table: clamped
    if max_model_len is None:
        max_model_len = span + 16  # wider than the table: the rest is -inf
    return dict(q=q, k_cache=cache, weights=weights, context_lens=lens.to(DEVICE),
                block_table=table.to(DEVICE), max_model_len=max_model_len), options


# ------------------------------------------------------------------ expected, float64
def decode_queries(q) -> torch.Tensor:
    if isinstance(q, torch.Tensor):
        return q.double().cpu()
    values, scales = q
    values = values.cpu()
    if values.dtype == torch.uint8:
        codes = torch.stack([values & 0xF, values >> 4], dim=-1).reshape(*values.shape[:-1], 128)
        x = E2M1[codes.long()]
    else:
        x = values.double()
    if scales is not None:
        exponents = scales.cpu().contiguous().view(torch.uint8).reshape(*scales.shape, 4)
        factor = torch.exp2(exponents.double() - 127)
        factor[exponents == 255] = float("nan")  # UE8M0's NaN
        x = x * factor.repeat_interleave(32, dim=-1)
    return x


def key_bytes(cache: torch.Tensor, slot: int, fp4: bool, shuffle: bool, n: int):
    """The value and scale bytes of a slot, read with the contract's offsets."""
    num_blocks, block_size, _ = cache.shape
    flat = cache.as_strided((num_blocks * cache.stride(0),), (1,)).cpu()
    vals, scs = oracle.offsets(slot % block_size, block_size, fp4, shuffle, n)
    base = (slot // block_size) * cache.stride(0)
    return flat[[base + o for o in vals]], flat[[base + o for o in scs]]


def decode_key(values: torch.Tensor, scales: torch.Tensor, fp4: bool, mx: bool) -> torch.Tensor:
    if fp4:
        codes = torch.stack([values & 0xF, values >> 4], dim=-1).reshape(128)
        group_scale = torch.exp2(scales.double() - 127)
        group_scale[scales == 255] = float("nan")
        return E2M1[codes.long()] * group_scale.repeat_interleave(32)
    x = values.view(torch.float8_e4m3fn).double()
    if mx:
        scale = float("nan") if int(scales[0]) == 255 else 2.0 ** (int(scales[0]) - 127)
    else:
        scale = float(scales.contiguous().view(torch.float32)[0])
    return x * scale


def expected(call: dict, options: dict):
    """(want float64 [rows, max_model_len] with -inf where nothing is seen, bound)."""
    cache = call["k_cache"]
    if cache.dim() == 4:
        cache = cache[:, :, 0]
    num_blocks, block_size, row = cache.shape
    fp4 = row == 68
    mx = options.get("mx_scales", False) and not fp4
    shuffle, n = options.get("shuffle", False), options.get("mxfp4_n_per_tile", 0)
    q = decode_queries(call["q"])  # [B, next_n, H, 128]
    batch, next_n, heads, _ = q.shape
    w = call["weights"].double().cpu().reshape(batch, next_n, heads)
    lens = call["context_lens"].long().cpu()
    table = call["block_table"].long().cpu()
    width = call["max_model_len"]
    cols = min(width, table.shape[1] * block_size)
    want = torch.full((batch * next_n, width), float("-inf"), dtype=torch.float64)
    bound = torch.zeros(batch * next_n, width, dtype=torch.float64)
    keys = {}
    for b in range(batch):
        for i in range(next_n):
            limit = int(lens[b, i]) if lens.dim() == 2 else int(lens[b]) - next_n + i + 1
            limit = max(0, min(limit, cols))
            r = b * next_n + i
            for t in range(limit):
                block = int(table[b, t // block_size])
                if not 0 <= block < num_blocks:
                    continue
                slot = block * block_size + t % block_size
                if slot not in keys:
                    keys[slot] = decode_key(*key_bytes(cache, slot, fp4, shuffle, n), fp4, mx)
                k = keys[slot]
                dots = q[b, i] @ k  # [H]
                want[r, t] = (w[b, i] * torch.relu(dots)).sum()
                bound[r, t] = RELATIVE_BOUND * (w[b, i].abs() * ((q[b, i] * k).abs().sum(-1))).sum()
    return want, bound


def assert_close(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str = ""):
    got = got.double().cpu()
    assert got.shape == want.shape, what
    inf = torch.isneginf(want)
    assert torch.equal(torch.isneginf(got), inf), (
        f"{what}: -inf differs at {torch.nonzero(torch.isneginf(got) != inf)[:5].tolist()}")
    finite = ~inf
    assert torch.isfinite(got[finite]).all(), f"{what}: non-finite values where scores belong"
    err = (got - want).abs()
    bad = finite & (err > bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} values off by more than the bound; first "
        f"{torch.nonzero(bad)[0].tolist()}: got {got[bad][0].item()}, want {want[bad][0].item()}, "
        f"bound {bound[bad][0].item()}")


def assert_top_k_agrees(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, k: int = 64
                        ) -> int:
    """Rows whose k-th and (k+1)-th float64 values differ by more than their bounds must
    pick the same top-k columns. Returns how many rows were checked."""
    checked = 0
    got = got.double().cpu()
    for r in range(want.shape[0]):
        finite = torch.isfinite(want[r])
        if int(finite.sum()) <= k:
            continue
        order = torch.argsort(want[r], descending=True)
        top, rest = order[:k], order[k:]
        kth, next_one = top[-1], rest[0]
        if want[r, kth] - want[r, next_one] <= bound[r, kth] + bound[r, next_one]:
            continue  # too close to call within the bound
        checked += 1
        got_top = set(torch.topk(got[r], k).indices.tolist())
        assert got_top == set(top.tolist()), f"row {r}: top-{k} differs"
    return checked


def run_and_check(call, options, backend="triton", what=""):
    got = paged_mqa_logits(**call, **options, backend=backend)
    assert got.dtype == torch.float32 and got.device.type == torch.device(DEVICE).type
    want, bound = expected(call, options)
    assert_close(got, want, bound, what)
    return got, want, bound


# ---------------------------------------------------------------------------- accuracy
# Each case also takes one of next_n 1, 2, 4, one of the context_lens forms, a head count
# and a weights dtype, in turn.
ACCURACY_CASES = [
    pytest.param(fmt, layout_name, q_form, index, id=f"{fmt}-{layout_name}-q_{q_form}")
    for index, (fmt, layout_name, q_form) in enumerate(
        (f, name, q) for f, name in FORMAT_LAYOUTS for q in Q_FORMS)
]


@pytest.mark.parametrize("fmt, layout_name, q_form, index", ACCURACY_CASES)
def test_every_format_layout_and_query_form(fmt, layout_name, q_form, index):
    next_n = (1, 2, 4)[index % 3]
    call, options = make_call(fmt, layout_name, q_form, next_n=next_n, heads=HEADS[index % 4],
                              ctx_2d=index % 2 == 1, seed=index, weights_bf16=index % 5 == 0)
    run_and_check(call, options, what=f"{fmt} {layout_name} q {q_form} next_n {next_n}")


@pytest.mark.parametrize("ctx_2d", [False, True], ids=["ctx_1d", "ctx_2d"])
@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize("fmt, q_form", [("fp8", "e4m3"), ("mxfp4", "mxfp4"), ("fp8-mx", "bf16")],
                         ids=["fp8-q_e4m3", "mxfp4-q_mxfp4", "fp8-mx-q_bf16"])
def test_next_n_and_both_context_forms(fmt, q_form, next_n, ctx_2d):
    call, options = make_call(fmt, "row-major", q_form, next_n=next_n, heads=3, ctx_2d=ctx_2d,
                              seed=7 * next_n + ctx_2d)
    run_and_check(call, options)


@pytest.mark.parametrize("path", ["reference", "triton", "native-stacked"])
def test_int64_context_lens_at_their_limits_clamp_instead_of_wrapping(path):
    """``context_lens - next_n + i + 1`` of an int64 length near its minimum would wrap
    around to a huge positive limit: such a sequence sees nothing, one at the maximum every
    position its block table covers (the helper agrees)."""
    if path == "native-stacked" and not INTERPRETED:
        pytest.skip("on a GPU the Triton backend is the native path")
    call, options = make_call("fp8", "row-major", "e4m3", batch=2, next_n=2, heads=3, seed=5,
                              bad_blocks=False)
    lens = torch.tensor([-2**63, 2**63 - 1], dtype=torch.int64, device=DEVICE)
    call["context_lens"] = lens
    want, bound = expected(call, options)
    if path == "native-stacked":
        got = run_native(call, options, VARIANT_STACKED)
    else:
        got = paged_mqa_logits(**call, **options, backend=path)
    assert_close(got, want, bound, path)
    assert torch.isneginf(got[:2]).all() and torch.isfinite(got[2:, :16]).all()
    assert ik.lengths_from_context(lens, 2, 10).tolist() == [0, 0, 10, 10]


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("fmt, q_form", [("fp8", "e4m3"), ("mxfp4", "mxfp4")],
                         ids=["fp8-q_e4m3", "mxfp4-q_mxfp4"])
def test_longer_rows_and_their_top_64(fmt, q_form, backend):
    """A few hundred keys a row, so that the top-64 can be compared. Few heads with positive
    weights keep the bound tight enough for rows to be separated at the 64th value."""
    call, options = make_call(fmt, "row-major", q_form, batch=3, next_n=2, heads=2,
                              block_size=64, num_blocks=8, max_blocks=6, bad_blocks=False,
                              seed=3)
    call["weights"] = call["weights"].abs() + 0.5
    call["context_lens"] = torch.tensor([300, 384, 170], dtype=torch.int32, device=DEVICE)
    got, want, bound = run_and_check(call, options, backend=backend)
    assert assert_top_k_agrees(got, want, bound) > 0, "no row was separated enough to check"


def op_call(call: dict, options: dict):
    """The arguments of the op behind ``paged_mqa_logits`` (a fresh ``out``), as its named
    tuple."""
    values, scales = split_query(call["q"])
    out = torch.full((values.shape[0] * values.shape[1], call["max_model_len"]), 7.0,
                     device=values.device)
    return paged_mqa_logits_into.op.bind(values, scales, call["k_cache"], call["weights"],
                                         call["context_lens"], call["block_table"], out,
                                         **options)


VARIANTS = {"rows": VARIANT_ROWS, "stacked": VARIANT_STACKED}
# (query form, launch form) pairs the interpreter runs natively: bf16 queries in the
# stacked form only (``test_native_path_arithmetic_under_the_interpreter``).
NATIVE_FORMS = [(q, variant) for variant in VARIANTS for q in ("e4m3", "e4m3-mx", "mxfp4", "bf16")
                if not (q == "bf16" and variant == "rows")]


def run_native(call: dict, options: dict, variant: int, **changes):
    """The native (tensor-core) path of ``call`` in the given launch form (and other
    ``changes`` of its settings): under the interpreter, with integer decoding in place of
    the inline PTX; on a GPU, as it runs there. Returns ``out``."""
    arguments = op_call(call, options)
    plan = check_logits(arguments)
    if INTERPRETED:
        plan = dataclasses.replace(plan, native=True)
    elif not plan.native:
        pytest.skip("no native dots on this GPU")
    settings = logits_settings(plan.batch, plan.next_n, plan.heads, plan.num_cols,
                               plan.use_fp4_cache, plan.q_form, plan.sm_count, INTERPRETED,
                               True)._replace(variant=variant, **changes)
    with logits_settings.override(settings):
        run_logits(plan, arguments)
    return arguments.out


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU the native path is the one tested above")
@pytest.mark.parametrize("q_form, variant", NATIVE_FORMS,
                         ids=[f"q_{q}-{variant}" for q, variant in NATIVE_FORMS])
@pytest.mark.parametrize("fmt, layout_name", FORMAT_LAYOUTS, ids=[f"{f}-{n}" for f, n in FORMAT_LAYOUTS])
def test_native_path_arithmetic_under_the_interpreter(fmt, layout_name, q_form, variant):
    """The tensor-core path's arithmetic, run by the interpreter with integer decoding in
    place of the inline PTX, in both launch forms: row by row (E2M1 codes as e4m3 bytes in
    a permuted group order, per-group dots and scales) and stacked (the rows' queries side
    by side in one dot, MXFP4 keys decoded in the dot operand's order with their group
    scales folded in); query scales folded into the queries, key scales after the head sum.
    (bf16 queries in the stacked form only: the interpreter multiplies bf16 as integer
    bits, which the stacked form's dots widen first.)"""
    call, options = make_call(fmt, layout_name, q_form, next_n=2, heads=8, seed=21)
    want, bound = expected(call, options)
    assert_close(run_native(call, options, VARIANTS[variant]), want, bound)


@pytest.mark.skipif(not INTERPRETED, reason="the GPU's own native path is tested above")
@pytest.mark.parametrize("fmt, q_form, scales", [
    ("fp8", "e4m3", None), ("mxfp4", "e4m3", None), ("mxfp4", "mxfp4", None),
    ("fp8-mx", "e4m3-mx", None),
    # One head's group scaled by 2**127, the others far below: per-group dots whose
    # scaled partial sums overflow (the per-group path keeps the max).
    ("fp8", "e4m3-mx", "overflowing"), ("mxfp4", "e4m3-mx", "overflowing"),
    # Query scales of 2**-124: folded weights below the normal range.
    ("fp8", "e4m3-mx", "tiny"), ("mxfp4", "e4m3-mx", "tiny")],
    ids=lambda v: str(v))
def test_relu_by_abs_gives_the_same_logits(fmt, q_form, scales):
    """``relu(x) w`` computed as ``(x + |x|) w / 2`` (a launch setting of the stacked
    form): the same logits, bit for bit, NaN and -inf included, also where partial sums
    overflow or weights are subnormal."""
    call, options = make_call(fmt, "row-major", q_form, batch=2, next_n=2, heads=8, seed=5)
    if scales is not None:
        values, words = call["q"]
        scale_bytes = words.view(torch.uint8).reshape(*words.shape, 4).clone()
        if scales == "overflowing":
            scale_bytes[..., 0, 0] = 254
            scale_bytes[..., 0, 1:] = 200
        else:
            scale_bytes[...] = 3
        call["q"] = (values, scale_bytes.view(torch.int32).reshape(words.shape))
    arguments = op_call(call, options)
    plan = dataclasses.replace(check_logits(arguments), native=True)
    settings = logits_settings(plan.batch, plan.next_n, plan.heads, plan.num_cols,
                               plan.use_fp4_cache, plan.q_form, plan.sm_count, INTERPRETED,
                               True)
    outs = []
    for relu_by_abs in (False, True):
        arguments.out.fill_(7.0)
        with logits_settings.override(settings._replace(relu_by_abs=relu_by_abs)):
            run_logits(plan, arguments)
        outs.append(arguments.out.clone())
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["none", "early", "at-exit"])
def test_dependent_launch_mode_reaches_the_launch(monkeypatch, mode):
    """Where the GPU has dependent launch, the kernel gets the mode as USE_PDL and the
    launch option with it (built, not run, here); elsewhere neither."""
    call, options = make_call("fp8", "row-major", "e4m3", seed=2)
    plan = check_logits(op_call(call, options))
    settings = logits_module.settings_for(plan)._replace(pdl=mode)
    monkeypatch.setattr(logits_module.checks, "pdl_supported", lambda device: False)
    launch, _, _ = logits_module._logits_launch(plan, settings, True)
    assert launch.state.fixed["USE_PDL"] == 0
    assert "launch_pdl" not in launch.state.launch_options
    monkeypatch.setattr(logits_module.checks, "pdl_supported", lambda device: True)
    launch, _, _ = logits_module._logits_launch(plan, settings, True)
    assert launch.state.fixed["USE_PDL"] == mode
    assert launch.state.launch_options.get("launch_pdl", False) == (mode != 0)


@pytest.mark.parametrize("next_n, heads, ctx_2d", [(1, 16, False), (3, 3, True), (4, 20, False)],
                         ids=["n1-h16", "n3-h3-ctx_2d", "n4-h20"])
@pytest.mark.parametrize("fmt, q_form", [("fp8", "e4m3"), ("mxfp4", "mxfp4"), ("fp8-mx", "e4m3-mx")],
                         ids=["fp8-q_e4m3", "mxfp4-q_mxfp4", "fp8-mx-q_e4m3-mx"])
def test_stacked_rows_native(fmt, q_form, next_n, heads, ctx_2d):
    """Up to four query rows in one dot (three rows fill four column slots, one dead), head
    counts padded to a power of two, both forms of context lengths."""
    call, options = make_call(fmt, "row-major", q_form, next_n=next_n, heads=heads,
                              ctx_2d=ctx_2d, block_size=64, num_blocks=6, max_blocks=3,
                              seed=30 + next_n)
    want, bound = expected(call, options)
    assert_close(run_native(call, options, VARIANT_STACKED), want, bound)


@pytest.mark.parametrize("spread", [False, True], ids=["exact-fold", "inexact-fold"])
@pytest.mark.parametrize("next_n, heads, rows, splits", [(1, 8, 1, 1), (3, 5, 3, 1),
                                                         (5, 5, 2, 2)],
                         ids=["n1-h8", "n3-h5", "n5-h5-rows2-splits2"])
@pytest.mark.parametrize("fmt, q_form", [("mxfp4", "mxfp4"), ("mxfp4", "e4m3-mx"),
                                         ("fp8-mx", "e4m3-mx"), ("fp8", "mxfp4")],
                         ids=["mxfp4-q_mxfp4", "mxfp4-q_e4m3-mx", "fp8-mx-q_e4m3-mx",
                              "fp8-q_mxfp4"])
def test_prefolded_queries_score_the_same_bits(fmt, q_form, next_n, heads, rows, splits,
                                                spread):
    """Scaled queries folded once per row group by their own kernel give the logits of the
    fold in every program, bit for bit: several row groups a sequence (the last one part
    dead) and several programs a group included, both where the fold is exact and where
    one head's group exponents lie too far apart for it (its programs then rescan per
    group, and the spread group still counts: 16 binades down)."""
    call, options = make_call(fmt, "row-major", q_form, next_n=next_n, heads=heads,
                              block_size=64, num_blocks=6, max_blocks=3, seed=70 + next_n)
    if spread:  # sequence 1 (sequence 0 sees nothing), last row, last head
        values, scales = call["q"]
        exponents = scales.cpu().view(torch.uint8).reshape(*scales.shape, 4).clone()
        exponents[1, next_n - 1, heads - 1, :] = torch.tensor([130, 130, 114, 129],
                                                                dtype=torch.uint8)
        call["q"] = (values, exponents.view(torch.int32).reshape(scales.shape).to(DEVICE))
        assert int(call["context_lens"][1]) > 0
    want, bound = expected(call, options)
    settings = dict(rows=rows, splits=splits)
    folded_here = run_native(call, options, VARIANT_STACKED, prefold=False, **settings).clone()
    folded_before = run_native(call, options, VARIANT_STACKED, prefold=True, **settings)
    assert_close(folded_before, want, bound)
    torch.testing.assert_close(folded_before, folded_here, rtol=0, atol=0, equal_nan=True)


SCALED_QUERY_PATHS = [("fp8", None), ("fp8", 20), ("fp8", 130), ("fp8-mx", 20),
                      ("fp8-mx", 130), ("mxfp4", None), ("mxfp4", 20), ("mxfp4", 130),
                      ("mxfp4", "key-span")]
SPREAD_NAMES = {None: "e4m3-fold", 20: "bf16-fold", 130: "per-group"}


@pytest.mark.parametrize("q_form", ["e4m3-mx", "mxfp4"], ids=["q_e4m3-mx", "q_mxfp4"])
@pytest.mark.parametrize("next_n", [1, 3], ids=["n1", "n3"])
@pytest.mark.parametrize("fmt, spread", SCALED_QUERY_PATHS,
                         ids=[f"{f}-{SPREAD_NAMES.get(s, s)}" for f, s in SCALED_QUERY_PATHS])
def test_scaled_queries_every_fold(fmt, spread, next_n, q_form):
    """Queries with group scales (e4m3 or MXFP4 values) take one of three paths, each within
    the bound: the queries folded into e4m3 (exponents close), folded into bf16 (one head's
    exponents ``spread`` apart, too far for e4m3), or scored per group (apart by more than
    bf16 can shift: the far group's values fall below its range). MXFP4 keys against
    bf16-folded queries are decoded to bf16 per key; a key whose group exponents lie too
    far apart for that (``key-span``) sends the row to the per-group path too. The far
    groups carry their row's logits (the row's other heads and groups are zero, and the
    key's other groups), so that a path that loses them fails the bound. MXFP4 queries
    against MXFP4 keys are scored both as folded in each program and as folded ahead."""
    call, options = make_call(fmt, "row-major", q_form, next_n=next_n, heads=5,
                              block_size=64, num_blocks=6, max_blocks=3, seed=90 + next_n)
    values, scales = call["q"]
    exponents = scales.cpu().view(torch.uint8).reshape(*scales.shape, 4).clone()
    if spread is None:
        exponents[...] = 127
    else:  # sequence 1 (sequence 0 sees nothing), last row, last head
        apart = 20 if spread == "key-span" else spread
        exponents[1, next_n - 1, 4, :] = torch.tensor([140, 140 - apart, 139, 140],
                                                       dtype=torch.uint8)
        values = values.clone()
        values[1, next_n - 1, :4] = 0
        gen = torch.Generator().manual_seed(next_n)
        if q_form == "mxfp4":  # dims 32 to 63 are bytes 16 to 31, two E2M1 codes a byte
            values[1, next_n - 1, 4, :16] = 0
            values[1, next_n - 1, 4, 32:] = 0
            codes = torch.randint(1, 8, (32,), generator=gen) | 8 * torch.randint(0, 2, (32,),
                                                                                   generator=gen)
            values[1, next_n - 1, 4, 16:32] = (codes[0::2] | codes[1::2] << 4).to(values.dtype)
        else:
            values[1, next_n - 1, 4, :32] = 0
            values[1, next_n - 1, 4, 64:] = 0
            # Magnitudes 1 to 16: shifted by -126 they stay bf16 normals (the interpreter
            # rounds float32 subnormals to bf16 otherwise than the GPU).
            far = torch.randint(1, 17, (32,), generator=gen)
            values[1, next_n - 1, 4, 32:64] = (far * (1 - 2 * (far % 2))).float().to(
                values.dtype)
    call["q"] = (values, exponents.view(torch.int32).reshape(scales.shape).to(DEVICE))
    assert int(call["context_lens"][1]) > 1
    if spread == "key-span":  # sequence 1's position 1: exponents 160 and 160 - BF16_FOLD_SPAN
        cache = call["k_cache"].clone()
        block = int(call["block_table"][1, 0])
        value_at, scale_at = oracle.offsets(1, cache.shape[1], True, False, 0)
        page = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))
        for at, byte in zip(scale_at, (160, 160 - BF16_FOLD_SPAN.value, 159, 160), strict=True):
            page[block, at] = byte
        for group in (0, 2, 3):  # only the far group's 16 bytes stay
            for at in value_at[16 * group:16 * group + 16]:
                page[block, at] = 0
        call["k_cache"] = cache
    want, bound = expected(call, options)
    got = run_native(call, options, VARIANT_STACKED, prefold=False)
    assert_close(got, want, bound)
    if q_form == "mxfp4" and fmt == "mxfp4" and next_n == 1:
        got = got.clone()
        ahead = run_native(call, options, VARIANT_STACKED, prefold=True)
        torch.testing.assert_close(ahead, got, rtol=0, atol=0, equal_nan=True)


def test_settings_fold_mxfp4_queries_ahead_for_one_row_a_program():
    """The settings fold MXFP4 queries against MXFP4 keys ahead, one row a program only,
    and then give the programs twice the tiles only past one round of them."""
    def settings(batch, next_n, context, fp4=True, q_form=Q_MXFP4):
        return logits_settings(batch, next_n, 64, context, fp4, q_form, 132, False, True)

    one_round = 4 * 132
    for batch, context in ((1, 4096), (1, 131072), (8, 32768), (64, 8192)):
        s = settings(batch, 1, context)
        assert s.prefold and s.rows == 1
        assert batch * s.splits <= one_round  # not halved: one round holds them
        assert settings(batch, 1, context, q_form=Q_E4M3_MX).splits * 2 <= s.splits + 1
    big = settings(64, 1, 32768)
    assert big.prefold and 64 * big.splits <= one_round * 2
    assert not settings(64, 4, 8192).prefold  # two rows a program
    assert not settings(64, 1, 32768, q_form=Q_E4M3).prefold
    assert not settings(64, 1, 32768, fp4=False).prefold
    assert not logits_settings(64, 1, 64, 32768, True, Q_MXFP4, 132, False, False).prefold


def spread_group_scales(cache: torch.Tensor, options: dict, slots, drop: int) -> torch.Tensor:
    """A copy of an MXFP4 cache where, for each slot, one group's UE8M0 exponent is set
    ``drop`` binades below the largest of the key's other groups (at least 1): keys whose
    group scales lie far apart, still valid MXFP4 data."""
    cache = cache.clone()
    num_blocks, block_size, _ = cache.shape
    page = cache.as_strided((num_blocks, cache.stride(0)), (cache.stride(0), 1))
    for i, slot in enumerate(slots):
        _, scale_at = oracle.offsets(slot % block_size, block_size, True, options["shuffle"],
                                     options["mxfp4_n_per_tile"])
        block, group = slot // block_size, i % 4
        top = max(int(page[block, at]) for j, at in enumerate(scale_at) if j != group)
        page[block, scale_at[group]] = max(1, top - drop)
    return cache


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
@pytest.mark.parametrize("drop", [FP4_FOLD_SPAN - 1, FP4_FOLD_SPAN, 40], ids=lambda d: f"drop{d}")
@pytest.mark.parametrize("layout_name, q_form", [("row-major", "e4m3"), ("preshuffle16", "mxfp4"),
                                                 ("preshuffle64", "e4m3-mx")],
                         ids=["row-major-q_e4m3", "preshuffle16-q_mxfp4", "preshuffle64-q_e4m3-mx"])
def test_mxfp4_keys_with_far_apart_group_scales(layout_name, q_form, drop, variant):
    """The fold keeps group exponents within FP4_FOLD_SPAN - 1 of the key's largest exactly;
    a program with a key beyond that (one group's scale ``2**-drop`` of the largest) is
    scored again per group. Both are within the bound, for every key."""
    call, options = make_call("mxfp4", layout_name, q_form, next_n=2, heads=8, seed=40 + drop)
    cache = call["k_cache"]
    num_blocks, block_size, _ = cache.shape
    # A few keys of every block (every sequence sees some), each with another group lowered.
    slots = [b * block_size + p for b in range(num_blocks) for p in range(b % 3, block_size, 5)]
    call["k_cache"] = spread_group_scales(cache, options, slots, drop)
    want, bound = expected(call, options)
    assert_close(run_native(call, options, VARIANTS[variant]), want, bound)
    assert_close(paged_mqa_logits(**call, **options), want, bound)


def shift_key_exponents(call: dict, options: dict, first: int, shift: int) -> int:
    """Every MXFP4 key of every sequence at positions ``>= first`` (below its length, in a
    valid block) with all four group exponents moved by ``shift``, in a copy of the cache:
    the same keys times ``2**shift`` (each once, whichever sequences share its block).
    Returns how many were moved."""
    cache = call["k_cache"].clone()
    num_blocks, block_size, _ = cache.shape
    page = cache.as_strided((num_blocks, cache.stride(0)), (cache.stride(0), 1))
    table, lens = call["block_table"].cpu(), call["context_lens"].cpu()
    moved = set()
    for b in range(table.shape[0]):
        for t in range(first, min(int(lens[b]), table.shape[1] * block_size)):
            block = int(table[b, t // block_size])
            if 0 <= block < num_blocks and (block, t % block_size) not in moved:
                _, scale_at = oracle.offsets(t % block_size, block_size, True,
                                             options["shuffle"], options["mxfp4_n_per_tile"])
                for at in scale_at:
                    page[block, at] = int(page[block, at]) + shift
                moved.add((block, t % block_size))
    call["k_cache"] = cache
    return len(moved)


@pytest.mark.parametrize("layout_name, q_form", [("row-major", "e4m3"), ("preshuffle16", "mxfp4"),
                                                 ("preshuffle64", "e4m3-mx")],
                         ids=["row-major-q_e4m3", "preshuffle16-q_mxfp4", "preshuffle64-q_e4m3-mx"])
def test_program_fold_scores_the_same_bits(layout_name, q_form):
    """MXFP4 keys folded relative to one exponent a program (its first tile's largest,
    plus headroom) instead of each key's largest: the same logits bit for bit (powers of
    two move between the decoded keys and the factor after the head sum), a sequence whose
    first tile has no readable key (reference 127) included."""
    call, options = make_call("mxfp4", layout_name, q_form, next_n=2, heads=8, max_blocks=8,
                              seed=61)
    if call["k_cache"].shape[1] * 4 <= 64:  # blocks of 16: the first tile is four blocks
        call["block_table"][3, :4] = -1
    want, bound = expected(call, options)
    per_key = run_native(call, options, VARIANT_STACKED, splits=1, program_fold=False).clone()
    per_program = run_native(call, options, VARIANT_STACKED, splits=1, program_fold=True)
    assert_close(per_program, want, bound)
    torch.testing.assert_close(per_program, per_key, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("shift", [5, -14, 60], ids=lambda v: f"shift{v:+d}")
@pytest.mark.parametrize("q_form", ["e4m3", "mxfp4"])
def test_program_fold_rescans_keys_outside_its_window(q_form, shift):
    """Keys past a program's first tile whose exponents lie above its reference, or more
    than FP4_FOLD_SPAN - 1 below it (whole keys scaled, each still folding exactly on its
    own), score NaN in the program-wide fold: the program is scored again per group,
    within the bound everywhere."""
    call, options = make_call("mxfp4", "row-major", q_form, next_n=1, heads=8, max_blocks=8,
                              seed=62 + shift)
    assert shift_key_exponents(call, options, 64, shift) > 0
    want, bound = expected(call, options)
    assert_close(run_native(call, options, VARIANT_STACKED, splits=1, program_fold=True),
                 want, bound)


def test_settings_fold_per_program_for_long_mxfp4_programs():
    """The program-wide fold: MXFP4 keys against e4m3 operands, one or two rows a program
    of at least PROGRAM_FOLD_MIN_TILES tiles; not for short programs, bf16 queries, FP8
    keys or four rows a program."""
    def settings(batch, context, next_n=1, fp4=True, q_form=Q_E4M3):
        return logits_settings(batch, next_n, 64, context, fp4, q_form, 132, False, True)

    for q_form in (Q_E4M3, Q_E4M3_MX, Q_MXFP4):
        for batch, context, next_n in ((8, 32768, 1), (64, 8192, 1), (64, 32768, 1),
                                       (128, 65536, 1), (64, 32768, 2)):
            s = settings(batch, context, next_n, q_form=q_form)
            assert s.program_fold and s.rows == next_n, (q_form, batch, context, next_n)
            assert -(-context // s.block_n) / s.splits >= PROGRAM_FOLD_MIN_TILES
    # Scaled queries take two rows a program at next_n 4, e4m3 ones four.
    assert settings(64, 8192, next_n=4, q_form=Q_MXFP4).program_fold
    assert not settings(1, 4096).program_fold
    assert not settings(1, 131072).program_fold
    assert not settings(64, 32768, q_form=Q_BF16).program_fold
    assert not settings(64, 32768, fp4=False).program_fold
    assert not settings(64, 8192, next_n=4).program_fold  # four rows a program
    assert not logits_settings(64, 1, 64, 32768, True, Q_E4M3, 132, False, False).program_fold


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
@pytest.mark.parametrize("fmt, q_form", [("fp8", "e4m3-mx"), ("mxfp4", "mxfp4"), ("mxfp4", "e4m3-mx")],
                         ids=["fp8-q_e4m3-mx", "mxfp4-q_mxfp4", "mxfp4-q_e4m3-mx"])
def test_scaled_queries_that_do_not_fold(fmt, q_form, variant):
    """Query group exponents 40 binades apart in a head: no e4m3 holds both ends, so the
    stacked form scores the program's rows again one at a time with their queries folded
    into bf16, the row-by-row form per query group."""
    call, options = make_call(fmt, "row-major", q_form, next_n=2, heads=8, seed=50)
    values, scales = call["q"]
    exponents = scales.cpu().view(torch.uint8).reshape(*scales.shape, 4).clone()
    exponents[0, 1, 3, 2] = 150
    exponents[0, 1, 3, 0] = 110
    call["q"] = (values, exponents.view(torch.int32).reshape(scales.shape).to(DEVICE))
    want, bound = expected(call, options)
    assert_close(run_native(call, options, VARIANTS[variant]), want, bound)


@pytest.mark.parametrize("variant, program_fold", [("rows", False), ("stacked", False),
                                                   ("stacked", True)],
                         ids=["rows", "stacked", "stacked-program-fold"])
def test_poisoned_mxfp4_keys_native(variant, program_fold):
    """A UE8M0 byte 255 in one group of an MXFP4 key: NaN for that key, in both launch forms
    and both folds (the stacked form rescans the program per group, which keeps the NaN)."""
    call, options = make_call("mxfp4", "row-major", "e4m3", batch=1, next_n=1, seed=9,
                              bad_blocks=False)
    cache = call["k_cache"].clone()
    call["k_cache"] = cache
    call["context_lens"] = torch.tensor([40], dtype=torch.int32, device=DEVICE)
    block_size = cache.shape[1]
    block = int(call["block_table"][0, 21 // block_size])
    _, scale_at = oracle.offsets(21 % block_size, block_size, True, False, 0)
    page = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))
    page[block, scale_at[2]] = 255
    got = run_native(call, options, VARIANTS[variant], program_fold=program_fold).cpu()
    assert torch.isnan(got[0, 21])
    assert torch.isfinite(got[0, :40][torch.arange(40) != 21]).all()


def test_reference_backend_matches_too():
    call, options = make_call("mxfp4", "preshuffle16", "e4m3-mx", next_n=2, ctx_2d=True, seed=5)
    run_and_check(call, options, backend="reference")


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_logits_do_not_differentiate_under_either_backend(backend):
    """Weights and queries that require grad: the logits are a plain result under both
    backends (the reference computes in torch, but outside autograd, as the kernel)."""
    call, options = make_call("fp8", "row-major", "bf16", seed=6)
    call["weights"] = call["weights"].clone().requires_grad_()
    got = paged_mqa_logits(**call, **options, backend=backend)
    assert not got.requires_grad and got.grad_fn is None


def test_every_row_empty_and_zero_width():
    call, options = make_call("fp8", "row-major", "e4m3", batch=2, next_n=2)
    call["context_lens"] = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    got = paged_mqa_logits(**call, **options)
    assert torch.isneginf(got).all()
    call["max_model_len"] = 0
    assert paged_mqa_logits(**call, **options).shape == (4, 0)


@pytest.mark.parametrize("variant", [None, *VARIANTS], ids=["default", *VARIANTS])
@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_cache_without_blocks(fmt, variant):
    """A cache of zero blocks: nothing is read, every column is -inf."""
    call, options = make_call(fmt, "row-major", "e4m3", next_n=2, seed=13)
    call["k_cache"] = call["k_cache"][:0]
    if variant is None:
        got = paged_mqa_logits(**call, **options)
    else:
        got = run_native(call, options, VARIANTS[variant])
    assert torch.isneginf(got).all()


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_splits_past_the_grid_limit_make_longer_programs(fmt, monkeypatch):
    """More splits than the grid's second dimension holds (CUDA's 65535, lowered here to 2):
    each program takes more tiles, and the logits stay the same."""
    monkeypatch.setattr(logits_module, "MAX_GRID_Y", 2)
    grids = []
    split_columns = logits_module.split_columns
    monkeypatch.setattr(logits_module, "split_columns",
                        lambda *args: grids.append(split_columns(*args)) or grids[-1])
    call, options = make_call(fmt, "row-major", "e4m3", next_n=2, block_size=64, max_blocks=5,
                              num_blocks=12, seed=17)
    got = run_native(call, options, VARIANT_STACKED, splits=64)
    assert grids and all(splits == 2 for splits, _, _ in grids)
    want, bound = expected(call, options)
    assert_close(got, want, bound)


@pytest.mark.skipif(INTERPRETED or DEVICE == "cpu", reason="the grid limit is CUDA's")
def test_columns_past_the_grid_limit_on_the_gpu():
    """2**26 columns: more 64-key tiles than a grid's second dimension takes at one tile a
    program; the launch spreads them (was: CUDA 'invalid argument')."""
    call, options = make_call("fp8", "row-major", "e4m3", batch=2, heads=64, seed=19)
    block_size = call["k_cache"].shape[1]
    width = 2**26
    table = call["block_table"]
    unused = torch.full((2, width // block_size - table.shape[1]), -1, dtype=table.dtype,
                        device=table.device)
    wide = call | dict(block_table=torch.cat([table, unused], dim=1), max_model_len=width)
    got = paged_mqa_logits(**wide, **options)
    narrow = call["max_model_len"]
    want, bound = expected(call, options)
    assert_close(got[:, :narrow].contiguous(), want, bound)
    assert torch.isneginf(got[:, narrow:]).all()


def test_max_model_len_narrower_than_the_table():
    call, options = make_call("mxfp4", "row-major", "e4m3", next_n=2, max_model_len=37, seed=11)
    run_and_check(call, options)


# ------------------------------------------------------------------- options and forms
def seen_columns(call: dict) -> torch.Tensor:
    """bool [rows, max_model_len]: the columns each query row sees (below its limit)."""
    rows, width = call["weights"].shape[0], call["max_model_len"]
    seen = torch.zeros(rows, width, dtype=torch.bool)
    lens = call["context_lens"].long().cpu()
    next_n = split_query(call["q"])[0].shape[1]
    cols = min(width, call["block_table"].shape[1] * call["k_cache"].shape[1])
    for r in range(rows):
        b, i = divmod(r, next_n)
        limit = max(0, min(int(lens[b]) - next_n + i + 1, cols))
        seen[r, :limit] = True
    return seen


def test_unclean_logits_leave_the_other_columns_untouched():
    call, options = make_call("fp8", "tiled", "e4m3-mx", next_n=2, seed=2)
    rows, width = call["weights"].shape[0], call["max_model_len"]
    out = torch.full((rows, width), 12345.0, device=DEVICE)
    got = paged_mqa_logits(**call, **options, clean_logits=False, out=out)
    assert got is out
    want, bound = expected(call, options)
    seen = seen_columns(call)
    assert (got.cpu()[~seen] == 12345.0).all()
    assert_close(torch.where(seen.to(got.device), got, float("-inf")), want, bound)


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU the native path is the one tested above")
@pytest.mark.parametrize("fmt, layout_name", [("fp8", "tiled"), ("fp8", "row-major"),
                                              ("mxfp4", "preshuffle64"), ("mxfp4", "row-major")],
                         ids=["fp8-block64", "fp8-block16", "mxfp4-block64", "mxfp4-block16"])
def test_stacked_tiles_write_only_seen_columns_when_unclean(fmt, layout_name):
    """The stacked form's tile store, with its bounds folded (a block's readable bound with
    each row's limit; the store's limit with ``col_hi``), for tiles in one block and tiles
    across blocks, two rows a program, out-of-range block ids: the seen columns hold the
    logits (``-inf`` past a bad block id), every other column keeps what ``out`` held."""
    call, options = make_call(fmt, layout_name, "e4m3", next_n=2, seed=23)
    got = run_native(call, dict(options, clean_logits=False), VARIANT_STACKED).cpu()
    want, bound = expected(call, options)
    seen = seen_columns(call)
    assert (got[~seen] == 7.0).all()  # op_call's fill
    assert_close(torch.where(seen, got, float("-inf")), want, bound)


def test_out_is_written_in_place():
    call, options = make_call("mxfp4", "preshuffle32", "bf16", seed=4)
    fresh = paged_mqa_logits(**call, **options)
    out = torch.full_like(fresh, float("nan"))
    assert paged_mqa_logits(**call, **options, out=out) is out
    assert torch.equal(out, fresh)


def test_out_sharing_memory_with_an_input_is_rejected():
    """``out`` over ``weights`` (or any input) is an error before anything is written; the
    two side by side in one buffer are fine."""
    call, options = make_call("fp8", "row-major", "e4m3", next_n=1, seed=3)
    want = paged_mqa_logits(**call, **options)
    rows, heads = call["weights"].shape
    width = call["max_model_len"]
    buf = torch.full((rows * heads + rows * width,), 7.0, device=DEVICE)
    weights = buf[:rows * heads].view(rows, heads)
    weights.copy_(call["weights"])
    over = buf[rows * heads - 1:rows * heads - 1 + rows * width].view(rows, width)
    with pytest.raises(ValueError, match="out: expected memory apart from weights"):
        paged_mqa_logits(**(call | options | dict(weights=weights, out=over)))
    assert torch.equal(weights, call["weights"]) and buf[rows * heads:].eq(7.0).all()
    apart = buf[rows * heads:].view(rows, width)
    paged_mqa_logits(**(call | options | dict(weights=weights, out=apart)))
    assert torch.equal(apart, want)


def test_four_dim_cache_view_and_deepgemm_entry_point():
    call, options = make_call("fp8", "row-major", "e4m3", next_n=2, seed=6)
    want = paged_mqa_logits(**call, **options)
    cache4 = call["k_cache"].unsqueeze(2)
    got = paged_mqa_logits(**dict(call, k_cache=cache4), **options)
    assert torch.equal(got, want)
    schedule = compat.get_paged_mqa_logits_metadata(call["context_lens"], 16, 132)
    assert schedule.shape == (133, 2) and schedule.dtype == torch.int32
    out = compat.fp8_fp4_paged_mqa_logits(call["q"], cache4, call["weights"], call["context_lens"],
                                          call["block_table"], schedule, call["max_model_len"])
    # Unclean, as DeepGEMM's: columns past a row's limit are not written; the rest agrees.
    written = ~torch.isneginf(want)
    assert written.any() and torch.equal(out[written], want[written])


def _deepgemm_args(call):
    """The call's tensors in DeepGEMM's order (up to the schedule)."""
    schedule = compat.get_paged_mqa_logits_metadata(call["context_lens"], 16, 132, indices=None)
    return (call["k_cache"].unsqueeze(2), call["weights"], call["context_lens"],
            call["block_table"], schedule)


@pytest.mark.parametrize("fmt, q_form", [("fp8", "e4m3"), ("fp8-mx", "e4m3-mx"),
                                         ("fp8-mx", "mxfp4"), ("mxfp4", "mxfp4"),
                                         ("mxfp4", "e4m3")])
def test_deepgemm_entry_point_as_engines_call_it(fmt, q_form):
    """vLLM's call (six positional arguments, then ``max_model_len=`` and ``clean_logits=``)
    and DeepGEMM's conventions: an FP8 cache's scales are MX exactly when the queries have
    scales, packed MXFP4 queries may be int8, a bare e4m3 ``q`` is ``(q, None)``; rows
    padded to ``ROW_ALIGN`` columns; bf16 logits are the float32 ones rounded."""
    call, options = make_call(fmt, "row-major", q_form, next_n=2, ctx_2d=True, seed=12)
    want = paged_mqa_logits(**call, **options)
    kv_cache, weights, lens, table, schedule = _deepgemm_args(call)
    q = call["q"]
    if q_form == "mxfp4":
        q = (q[0].view(torch.int8), q[1])
    got = compat.fp8_fp4_paged_mqa_logits(q, kv_cache, weights, lens, table, schedule,
                                          max_model_len=call["max_model_len"], clean_logits=True)
    assert torch.equal(got, want)
    assert got.shape == want.shape and got.stride(0) % compat.ROW_ALIGN == 0
    written = ~torch.isneginf(want)
    unclean = compat.fp8_fp4_paged_mqa_logits(q, kv_cache, weights, lens, table, schedule,
                                              call["max_model_len"], False)
    assert torch.equal(unclean[written], want[written])
    rounded = compat.fp8_fp4_paged_mqa_logits(q, kv_cache, weights, lens, table, schedule,
                                              call["max_model_len"], True, torch.bfloat16)
    assert rounded.dtype == torch.bfloat16 and torch.equal(rounded, want.to(torch.bfloat16))
    assert rounded.stride(0) % compat.ROW_ALIGN == 0
    if q_form == "e4m3":
        bare = compat.fp8_paged_mqa_logits(q[0], kv_cache, weights, lens, table, schedule,
                                           call["max_model_len"], clean_logits=True)
        assert torch.equal(bare, want)


def test_deepgemm_entry_point_reads_the_row_major_layout_where_shuffle_is_the_default(
        monkeypatch):
    """On ROCm ``shuffle=None`` means a shuffled page layout; DeepGEMM's entry point reads
    its row-major layout everywhere (the default forced on here, as ROCm would have it)."""
    call, options = make_call("fp8", "row-major", "e4m3", next_n=1, seed=13)
    want = paged_mqa_logits(**call, **options)
    kv_cache, weights, lens, table, schedule = _deepgemm_args(call)
    monkeypatch.setattr(ik.checks, "default_shuffle", lambda device, block_size: True)
    got = compat.fp8_fp4_paged_mqa_logits(call["q"], kv_cache, weights, lens, table, schedule,
                                          call["max_model_len"], clean_logits=True)
    assert torch.equal(got, want)


def test_poisoned_keys_score_nan():
    """A NaN scale (UE8M0 byte 255, an fp32 NaN) makes its key's logits NaN, and only its."""
    for fmt in ("fp8", "fp8-mx", "mxfp4"):
        fp4, mx = FORMATS[fmt]
        call, options = make_call(fmt, "row-major", "e4m3", batch=1, next_n=1, seed=9,
                                  bad_blocks=False)
        cache = call["k_cache"].clone()
        call["k_cache"] = cache
        call["context_lens"] = torch.tensor([40], dtype=torch.int32, device=DEVICE)
        block_size = cache.shape[1]
        block = int(call["block_table"][0, 21 // block_size])  # position 21
        _, scale_at = oracle.offsets(21 % block_size, block_size, fp4, False, 0)
        page = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))
        if fmt == "fp8":
            page[block, scale_at[0]:scale_at[0] + 4] = torch.tensor(
                [0, 0, 0xC0, 0x7F], dtype=torch.uint8, device=DEVICE)  # fp32 NaN
        else:
            page[block, scale_at[1 if fp4 else 0]] = 255
        got = paged_mqa_logits(**call, **options).cpu()
        assert torch.isnan(got[0, 21]), fmt
        assert torch.isfinite(got[0, :40][torch.arange(40) != 21]).all(), fmt


@pytest.mark.parametrize("native", [False, True], ids=["default", "native-stacked"])
@pytest.mark.parametrize("fmt, q_form", [("fp8-mx", "e4m3-mx"), ("mxfp4", "e4m3-mx"),
                                         ("mxfp4", "mxfp4")],
                         ids=["fp8-mx-q_e4m3-mx", "mxfp4-q_e4m3-mx", "mxfp4-q_mxfp4"])
def test_poisoned_query_scale_scores_nan_in_its_row_only(fmt, q_form, native):
    """A query's NaN group scale (UE8M0 byte 255) makes every logit its row sees NaN, as
    the reference has it, and nothing else: its columns past the row's limit stay -inf and
    the other rows of the program (three rows side by side natively) keep their logits."""
    call, options = make_call(fmt, "row-major", q_form, next_n=3, heads=5, block_size=64,
                              num_blocks=6, max_blocks=3, seed=31)
    want, bound = expected(call, options)
    values, scales = call["q"]
    exponents = scales.cpu().view(torch.uint8).reshape(*scales.shape, 4).clone()
    exponents[1, 1, 3, 2] = 255  # sequence 1, its middle row, head 3, dims 64..95
    call["q"] = (values, exponents.view(torch.int32).reshape(scales.shape).to(DEVICE))
    if native:
        got = run_native(call, options, VARIANT_STACKED, prefold=False).double().cpu()
    else:
        got = paged_mqa_logits(**call, **options).double().cpu()
    poisoned = 1 * 3 + 1
    seen = torch.isfinite(want[poisoned])  # (a block id out of range scores -inf)
    assert 0 < int(seen.sum()) < want.shape[1]
    assert torch.isnan(got[poisoned, seen]).all()
    assert torch.isneginf(got[poisoned, ~seen]).all()
    others = torch.arange(want.shape[0]) != poisoned
    assert_close(got[others], want[others], bound[others])
    reference = paged_mqa_logits(**call, **options, backend="reference").double().cpu()
    assert torch.isnan(reference[poisoned, seen]).all()
    assert torch.isneginf(reference[poisoned, ~seen]).all()


# ----------------------------------------------------------------------------- settings
def test_settings_are_deterministic_and_split_long_rows():
    a = logits_settings(1, 1, 64, 131072, False, 1, 132, interpreted=False)
    assert a == logits_settings(1, 1, 64, 131072, False, 1, 132, interpreted=False)
    assert a.splits > 1 and a.rows == 1 and a.variant == VARIANT_STACKED
    assert logits_settings(64, 4, 64, 32768, False, 1, 132, interpreted=False).rows == 4
    # Scaled queries against MXFP4 keys: two rows a program (registers).
    assert logits_settings(64, 4, 64, 32768, True, 3, 132, interpreted=False).rows == 2
    # At most 256 columns (rows times padded heads) in one dot.
    assert logits_settings(2, 4, 128, 4096, False, 0, 132, interpreted=False).rows <= 2
    assert logits_settings(2, 4, 100, 4096, False, 1, 132, interpreted=False).rows == 2
    # A register cap where the rare exact paths would otherwise set the count.
    assert logits_settings(8, 1, 64, 32768, True, 1, 132, interpreted=False).max_registers > 0
    assert logits_settings(8, 1, 64, 32768, False, 1, 132, interpreted=False).max_registers == 0
    # FP8 in several rounds of programs: capped for six programs an SM.
    assert logits_settings(128, 1, 64, 65536, False, 1, 132,
                           interpreted=False).max_registers == 80
    assert logits_settings(64, 1, 64, 32768, False, 1, 132,
                           interpreted=False).max_registers == 0  # one round
    # MXFP4 keys in many programs: five an SM, but where Triton's code spills there.
    many_fp4 = logits_settings(128, 1, 64, 65536, True, 1, 132, interpreted=False)
    assert many_fp4.max_registers == (FALLBACK_REGISTERS if TRITON_SPILLS_AT_LARGE_CAP
                                      else LARGE_MXFP4_REGISTERS)
    # A small call: a tile a program.
    small = logits_settings(1, 1, 64, 4096, False, 1, 132, interpreted=False)
    assert small.splits == 4096 // small.block_n


def test_settings_pipeline_and_size_programs():
    """FP8 tile loops pipeline deeper; one FP8 row a program takes longer programs only
    while all of them stay within PROGRAMS_PER_SM an SM, else at most MAX_TILES tiles."""
    sms = 132
    wanted = logits_module.PROGRAMS_PER_SM * sms
    for batch, cols in [(1, 131072), (8, 32768), (64, 8192), (64, 32768), (128, 65536),
                        (1024, 2048), (4096, 2048), (600, 4096)]:
        s = logits_settings(batch, 1, 64, cols, False, 1, sms, interpreted=False)
        tiles = -(-cols // s.block_n)
        per_program = -(-tiles // s.splits)
        assert s.num_stages == logits_module.DEEP_STAGES
        if per_program > logits_module.MAX_TILES:
            assert batch * s.splits <= wanted and per_program <= logits_module.MAX_TILES_ONE_WAVE
    # 64 x 32768: 8 programs a row of 64 tiles; many short rows keep short programs.
    assert logits_settings(64, 1, 64, 32768, False, 1, sms, interpreted=False).splits == 8
    assert logits_settings(4096, 1, 64, 2048, False, 1, sms, interpreted=False).splits == 2
    # MXFP4 keys: deep too, every query form and shape; without native dots: two stages.
    for batch, q_form in [(8, 1), (64, 1), (64, 3), (64, 0), (1, 3)]:
        assert logits_settings(batch, 1, 64, 32768, True, q_form, sms,
                               interpreted=False).num_stages == logits_module.DEEP_STAGES
    assert logits_settings(64, 1, 64, 32768, False, 1, sms, native=False,
                           interpreted=False).num_stages == 2


@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "mxfp4"])
def test_settings_dependent_launch_by_program_count(fp4):
    """Released at once while the programs fit on the SMs, as they exit while they fit
    PROGRAMS_PER_SM an SM, plain launches beyond; relu by |x| for MXFP4 keys only; L2
    hints in launches released at once, with e4m3 queries."""
    sms = 132
    wanted = logits_module.PROGRAMS_PER_SM * sms
    seen = set()
    for batch, cols in [(1, 4096), (1, 131072), (8, 32768), (64, 8192), (64, 32768),
                        (128, 65536), (4096, 2048)]:
        s = logits_settings(batch, 1, 64, cols, fp4, 1, sms, interpreted=False)
        programs = batch * s.splits
        expected = (logits_module.PDL_EARLY if programs <= sms else
                    logits_module.PDL_AT_EXIT if programs <= wanted else logits_module.PDL_NONE)
        assert s.pdl == expected, (batch, cols, programs)
        assert s.relu_by_abs == fp4
        # The L2 hints in launches released at once (e4m3 queries), none otherwise.
        assert s.hint_tiles == (logits_module.HINT_TILES if expected == logits_module.PDL_EARLY
                                else 0)
        for q_form in (logits_module.Q_BF16, logits_module.Q_E4M3_MX, logits_module.Q_MXFP4):
            assert logits_settings(batch, 1, 64, cols, fp4, q_form, sms,
                                   interpreted=False).hint_tiles == 0
        seen.add(s.pdl)
    assert len(seen) == 3  # the shapes above reach every mode
    assert logits_settings(128, 1, 64, 65536, fp4, 1, sms, interpreted=True).pdl == 0


def test_plan_is_frozen_and_complete():
    call, options = make_call("mxfp4", "preshuffle16", "mxfp4", next_n=2, ctx_2d=True)
    plan = check_logits(op_call(call, options))
    assert (plan.use_fp4_cache, plan.n_per_tile, plan.next_n, plan.heads, plan.ctx_2d) == (
        True, 16, 2, 8, True)
    with pytest.raises(AttributeError):
        plan.heads = 3


# ------------------------------------------------------------------------------ errors
def bad_calls():
    """(id, exception, words in the message, change to a valid call's arguments)."""
    f8 = torch.float8_e4m3fn
    return [
        ("q-type", TypeError, "q", lambda c: dict(q="q")),
        ("q-dtype", TypeError, "q", lambda c: dict(q=c["q"][0].float())),
        ("q-values-dtype", TypeError, "q[0]", lambda c: dict(q=(c["q"][0].view(torch.int8), None))),
        ("q-scales-dtype", TypeError, "q[1]",
         lambda c: dict(q=(c["q"][0], torch.zeros(c["q"][0].shape[:3], device=DEVICE)))),
        ("q-shape", ValueError, "q[0]", lambda c: dict(q=(c["q"][0][..., :64], None))),
        ("q-mxfp4-no-scales", ValueError, "q[1]",
         lambda c: dict(q=(c["q"][0].view(torch.uint8)[..., :64], None))),
        ("q-scales-shape", ValueError, "q[1]",
         lambda c: dict(q=(c["q"][0], torch.zeros(2, dtype=torch.int32, device=DEVICE)))),
        ("q-heads", ValueError, "heads",
         lambda c: dict(q=(torch.zeros(4, 1, 129, 128, device=DEVICE).to(f8), None))),
        ("q-stride", ValueError, "q[0].stride(-1)",
         lambda c: dict(q=(c["q"][0].transpose(2, 3).contiguous().transpose(2, 3), None))),
        ("cache-dtype", TypeError, "k_cache", lambda c: dict(k_cache=c["k_cache"].view(torch.int8))),
        ("cache-row", ValueError, "k_cache.shape[-1]", lambda c: dict(k_cache=c["k_cache"][..., :100])),
        ("cache-2d", ValueError, "k_cache", lambda c: dict(k_cache=c["k_cache"][0])),
        ("cache-4d", ValueError, "k_cache.shape[2]",
         lambda c: dict(k_cache=c["k_cache"].unsqueeze(2).expand(-1, -1, 2, -1))),
        ("weights-dtype", TypeError, "weights", lambda c: dict(weights=c["weights"].half())),
        ("weights-shape", ValueError, "weights", lambda c: dict(weights=c["weights"][:, :2])),
        ("ctx-dtype", TypeError, "context_lens", lambda c: dict(context_lens=c["context_lens"].float())),
        ("ctx-shape", ValueError, "context_lens",
         lambda c: dict(context_lens=c["context_lens"][:2])),
        ("table-dtype", TypeError, "block_table",
         lambda c: dict(block_table=c["block_table"].float())),
        ("table-shape", ValueError, "block_table", lambda c: dict(block_table=c["block_table"][:2])),
        ("table-stride", ValueError, "block_table.stride(-1)",
         lambda c: dict(block_table=c["block_table"].t().contiguous().t())),
        ("max-len-type", TypeError, "max_model_len", lambda c: dict(max_model_len=64.0)),
        ("max-len-bool", TypeError, "max_model_len", lambda c: dict(max_model_len=True)),
        ("max-len-neg", ValueError, "max_model_len", lambda c: dict(max_model_len=-1)),
        ("device", ValueError, "device", lambda c: dict(weights=c["weights"].to("meta"))),
        ("out-dtype", TypeError, "out",
         lambda c: dict(out=torch.zeros(4, c["max_model_len"], dtype=torch.float64, device=DEVICE))),
        ("out-shape", ValueError, "out", lambda c: dict(out=torch.zeros(4, 3, device=DEVICE))),
        ("out-rows-overlap", ValueError, "out.stride(0)",
         lambda c: dict(out=torch.zeros(1, c["max_model_len"], device=DEVICE).expand(4, -1))),
        ("q-rank-with-out", ValueError, "q[0]: expected shape [B, next_n, H, 128]",
         lambda c: dict(q=(c["q"][0][:, 0], None),
                        out=torch.zeros(4, c["max_model_len"], device=DEVICE))),
        ("clean-type", TypeError, "clean_logits", lambda c: dict(clean_logits=1)),
        ("mx-type", TypeError, "mx_scales", lambda c: dict(mx_scales="no")),
        ("backend", ValueError, "backend", lambda c: dict(backend="cuda")),
        ("n-per-tile", NotImplementedError, "mxfp4_n_per_tile",
         lambda c: dict(k_cache=stored_cache("mxfp4", "row-major", 16, 12)[0], shuffle=True)),
        ("n-per-tile-value", ValueError, "mxfp4_n_per_tile",
         lambda c: dict(k_cache=stored_cache("mxfp4", "row-major", 16, 12)[0], shuffle=True,
                        mxfp4_n_per_tile=32)),
    ]


@pytest.mark.parametrize("name, error, words, change", bad_calls(), ids=[b[0] for b in bad_calls()])
def test_bad_arguments_raise_naming_them(name, error, words, change):
    call, options = make_call("fp8", "row-major", "e4m3")
    with pytest.raises(error, match=re.escape(words)):
        paged_mqa_logits(**(call | options | change(call)))


def test_out_rows_may_be_spaced():
    """An ``out`` whose rows lie further apart than ``max_model_len`` (a view of a wider
    buffer) is written in place; the columns between the rows stay as they were."""
    call, options = make_call("fp8", "row-major", "e4m3")
    width = call["max_model_len"]
    wide = torch.full((4, width + 5), 7.0, device=DEVICE)
    got = paged_mqa_logits(**(call | options | dict(out=wide[:, :width])))
    assert got.data_ptr() == wide.data_ptr()
    want = paged_mqa_logits(**(call | options))
    assert torch.equal(wide[:, :width], want)
    assert torch.equal(wide[:, width:], torch.full((4, 5), 7.0, device=DEVICE))


def test_deepgemm_entry_points_name_bad_arguments():
    call, _ = make_call("fp8", "row-major", "e4m3")
    with pytest.raises(NotImplementedError, match="indices"):
        compat.fp8_fp4_paged_mqa_logits(call["q"], call["k_cache"], call["weights"],
                                        call["context_lens"], call["block_table"], None,
                                        call["max_model_len"], indices=call["context_lens"])
    with pytest.raises(ValueError, match="num_sms"):
        compat.get_paged_mqa_logits_metadata(call["context_lens"], 16, 0)
    with pytest.raises(NotImplementedError, match="indices"):
        compat.get_paged_mqa_logits_metadata(call["context_lens"], 16, 132,
                                             indices=call["context_lens"])
    with pytest.raises(ValueError, match="logits_dtype"):
        compat.fp8_fp4_paged_mqa_logits(call["q"], call["k_cache"], call["weights"],
                                        call["context_lens"], call["block_table"], None,
                                        call["max_model_len"], logits_dtype=torch.float16)
    with pytest.raises(ValueError, match="weights"):  # named, not the out made from it
        compat.fp8_fp4_paged_mqa_logits(call["q"], call["k_cache"], call["weights"][1:],
                                        call["context_lens"], call["block_table"], None,
                                        call["max_model_len"])
    # Named as the caller passed them (DeepGEMM's kv_cache and block_tables).
    with pytest.raises(TypeError, match="^block_tables: expected a torch.Tensor, got list"):
        compat.fp8_fp4_paged_mqa_logits(call["q"], call["k_cache"], call["weights"],
                                        call["context_lens"], [[0, 1]], None,
                                        call["max_model_len"])
    with pytest.raises(TypeError, match="^kv_cache: expected"):
        compat.fp8_fp4_paged_mqa_logits(call["q"], call["k_cache"].view(torch.int8),
                                        call["weights"], call["context_lens"],
                                        call["block_table"], None, call["max_model_len"])
    with pytest.raises(TypeError, match="logits_dtype"):
        compat.fp8_fp4_paged_mqa_logits(call["q"], call["k_cache"], call["weights"],
                                        call["context_lens"], call["block_table"], None,
                                        call["max_model_len"], logits_dtype="float32")
    with pytest.raises(TypeError, match="clean_logits"):
        compat.fp8_fp4_paged_mqa_logits(call["q"], call["k_cache"], call["weights"],
                                        call["context_lens"], call["block_table"], None,
                                        call["max_model_len"], "no")


# --------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("fmt, q_form", [("fp8", "e4m3"), ("mxfp4", "mxfp4"), ("mxfp4", "e4m3"),
                                         ("fp8", "bf16")])
def test_cuda_graph_replays_with_new_inputs(fmt, q_form):
    call, options = make_call(fmt, "row-major", q_form, batch=3, next_n=2, heads=64,
                              block_size=64, num_blocks=8, max_blocks=6, seed=12)
    static = {k: (tuple(x.clone() if x is not None else None for x in v) if isinstance(v, tuple)
                  else v.clone() if isinstance(v, torch.Tensor) else v) for k, v in call.items()}
    paged_mqa_logits(**static, **options)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_mqa_logits(**static, **options)
    for seed in (13, 14):
        new, _ = make_call(fmt, "row-major", q_form, batch=3, next_n=2, heads=64,
                           block_size=64, num_blocks=8, max_blocks=6, seed=seed)
        for key in ("q", "weights", "context_lens", "block_table"):
            if isinstance(static[key], tuple):
                for dst, src in zip(static[key], new[key], strict=True):
                    if dst is not None:
                        dst.copy_(src)
            else:
                static[key].copy_(new[key])
        graph.replay()
        want, bound = expected(static, options)
        assert_close(out, want, bound, f"replay {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, q_form, ctx_2d", [("fp8", "e4m3", False), ("fp8", "e4m3", True),
                                                 ("mxfp4", "e4m3", False), ("mxfp4", "mxfp4", True)])
def test_l2_hints_change_no_logit(fmt, q_form, ctx_2d):
    """Pages hinted into L2 before the dependent-launch wait (``hint_tiles`` 1 to 4; 3 is
    rounded up) give an unhinted launch's logits bit for bit: ragged lengths, a sequence of
    length 0, block ids out of range."""
    call, options = make_call(fmt, "row-major", q_form, batch=3, next_n=2, heads=64,
                              block_size=64, num_blocks=8, max_blocks=6, seed=21, ctx_2d=ctx_2d)
    base = op_call(call, options)
    plan = check_logits(base)
    default = settings_for(plan)
    if not default.pdl:
        pytest.skip("the hints go with a dependent launch (NVIDIA sm_90+)")
    with logits_settings.override(default._replace(hint_tiles=0)):
        run_logits(plan, base)
    for tiles in (1, 2, 3, 4):
        hinted = op_call(call, options)
        with logits_settings.override(default._replace(hint_tiles=tiles)):
            run_logits(check_logits(hinted), hinted)
        assert torch.equal(hinted.out.view(torch.int32), base.out.view(torch.int32)), tiles


@pytest.mark.parametrize("n, d_chunk, lanes", [(8, 4, 2), (16, 64, 1), (4, 1, 4)],
                         ids=["n8-d4-l2", "n16-d64-l1", "n4-d1-l4"])
def test_aiter_mxfp4_orders_are_scored_in_place(n, d_chunk, lanes):
    """A cache written in one of aiter's MXFP4 page orders scores as the reference reads it."""
    order = dict(mxfp4_n_per_tile=n, mxfp4_d_per_tile=d_chunk, mxfp4_scale_lanes=lanes)
    case = make_case(48, use_fp4_cache=True, block_size=16, num_blocks=3, skip_every=0,
                     compress_ratio=1, generator=torch.Generator().manual_seed(n + d_chunk))
    cache = case.new_cache()
    ik.indexer_k_norm_rope_store(*case.args(cache), shuffle=True, **order)
    gen = torch.Generator().manual_seed(7)
    q = (torch.randn(2, 1, 4, 128, generator=gen) * 8).to(torch.float8_e4m3fn).to(DEVICE)
    weights = torch.randn(2, 4, generator=gen).to(DEVICE)
    context_lens = torch.tensor([40, 17], dtype=torch.int32, device=DEVICE)
    table = torch.tensor([[2, 0, 1], [1, 2, 0]], dtype=torch.int32, device=DEVICE)
    args = ((q, None), cache, weights, context_lens, table, 48)
    want = paged_mqa_logits(*args, shuffle=True, backend="reference", **order)
    got = paged_mqa_logits(*args, shuffle=True, **order)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    # The contract's bound, from the keys as the reference reads them in this order.
    from indexer_kcache.reference import logits as reference_logits

    keys, _ = reference_logits.sequence_keys(cache, table, 48, True, False,
                                             ik.layout.MXFP4_PRESHUFFLE, n, d_chunk, lanes)
    per_head = torch.einsum("bhd,btd->bht", q[:, 0].float().abs().double(),
                            keys.abs().double())
    bound = RELATIVE_BOUND * (weights.abs().double()[:, :, None] * per_head).sum(1)
    err = (got.double() - want.double()).abs()
    assert (err[finite] <= bound[finite] + 1e-6).all()


@triton.jit
def _decode_bf16_kernel(words_ptr, shift_ptr, out_ptr, BLOCK_N: tl.constexpr):
    key = tl.arange(0, BLOCK_N)
    group = tl.arange(0, 4)
    words = tl.load(words_ptr + key[:, None, None] * 16 + group[None, :, None] * 4
                    + tl.arange(0, 4)[None, None, :])
    shift = tl.load(shift_ptr + key[:, None] * 4 + group[None, :])
    operand = _fp4_operand_bf16(words, shift, BLOCK_N)
    tl.store(out_ptr + key[:, None] * 128 + tl.arange(0, 128)[None, :], operand)


def test_mxfp4_keys_decode_straight_to_the_bf16_operand():
    """Against bf16 queries, MXFP4 keys decode to bf16 in the dot operand's order (position
    ``p`` holds dim ``32 c + 8 k + 4 W + 2 J + h`` for ``p = 32 k + 16 W + 8 J + 2 c + h``),
    each group's values E2M1 times ``2**(6 + shift)``: every code, both signs, and shifts
    across the whole range the fold allows. (The inline PTX on a GPU, integer operations
    under the interpreter.)"""
    n = 32
    generator = torch.Generator().manual_seed(5)
    packed = torch.randint(0, 256, (n, 64), generator=generator, dtype=torch.uint8)
    packed[0, :8] = torch.arange(0, 256, 32, dtype=torch.uint8) + torch.arange(8, dtype=torch.uint8)
    shift = torch.randint(1 - BF16_FOLD_SPAN.value, 1, (n, 4), generator=generator,
                          dtype=torch.int32)
    shift[0] = torch.tensor([0, 1 - BF16_FOLD_SPAN.value, -12, -1])
    words = packed.view(torch.int32)  # little-endian: byte 4 w + i is byte i of word w
    out = torch.empty(n, 128, dtype=torch.bfloat16, device=DEVICE)
    _decode_bf16_kernel[(1,)](words.to(DEVICE), shift.to(DEVICE), out, BLOCK_N=n, num_warps=4)
    p = torch.arange(128)
    dim = 32 * ((p // 2) % 4) + 2 * (p // 8) + p % 2
    codes = (packed.long()[:, dim // 2] >> (4 * (dim % 2))) & 0xF
    want = E2M1[codes] * torch.exp2(6.0 + shift.double()[:, dim // 32])
    assert want.abs().min() == 0 and want[want != 0].abs().min() >= 2.0**-126
    assert torch.equal(out.cpu().double(), want)
    assert torch.equal(out.cpu().double().signbit(), want.signbit())
