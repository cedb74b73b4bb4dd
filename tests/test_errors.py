"""Bad arguments raise TypeError / ValueError / NotImplementedError naming the argument,
before any byte of the cache changes."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import indexer_kcache as ik
from indexer_kcache import compat, fast_path, layout

from .cases import DEVICE, make_case, pages

ROW = layout.cache_row_bytes(False)  # an FP8 cache's row
ARG_NAMES = ["k_pre", "positions", "cos_sin_cache", "rms_norm_weight", "rms_norm_eps", "k_cache",
             "kv_slot_mapping", "compress_ratio", "use_fp4_cache"]


def _replace(args, **changes):
    args = list(args)
    for name, value in changes.items():
        args[ARG_NAMES.index(name)] = value
    return args


def bad_calls():
    """(id, exception, words the message must contain, function of (case, cache) -> call)."""
    t = torch.tensor
    return [
        ("k_pre-dtype", TypeError, "k_pre",
         lambda c, k: dict(k_pre=c.k_pre.double())),
        ("k_pre-width", ValueError, "k_pre",
         lambda c, k: dict(k_pre=torch.zeros(40, layout.HEAD_DIM // 2, dtype=torch.bfloat16,
                                            device=DEVICE))),
        ("k_pre-stride1", ValueError, "k_pre.stride(1)",
         lambda c, k: dict(k_pre=torch.zeros(layout.HEAD_DIM, 40, dtype=torch.bfloat16,
                                            device=DEVICE).t())),
        ("k_pre-short", ValueError, "k_pre.shape[0]",
         lambda c, k: dict(k_pre=c.k_pre[:3])),
        ("k_pre-not-tensor", TypeError, "k_pre",
         lambda c, k: dict(k_pre=[1.0] * layout.HEAD_DIM)),
        ("k_pre-sparse", TypeError, "k_pre: expected a dense (strided)",
         lambda c, k: dict(k_pre=c.k_pre.to_sparse())),
        ("k_cache-sparse", TypeError, "k_cache: expected a dense (strided)",
         lambda c, k: dict(k_cache=k.to_sparse())),
        ("positions-dtype", TypeError, "positions",
         lambda c, k: dict(positions=c.positions.float())),
        ("positions-short", ValueError, "positions",
         lambda c, k: dict(positions=c.positions[:3])),
        ("positions-2d", ValueError, "positions",
         lambda c, k: dict(positions=c.positions.view(1, -1))),
        ("cos_sin-dtype", TypeError, "cos_sin_cache",
         lambda c, k: dict(cos_sin_cache=c.cos_sin_cache.double())),
        ("cos_sin-width", ValueError, "cos_sin_cache",
         lambda c, k: dict(cos_sin_cache=torch.zeros(300, 2 * layout.ROPE_DIM, device=DEVICE))),
        ("weight-dtype", TypeError, "rms_norm_weight",
         lambda c, k: dict(rms_norm_weight=c.weight.to(torch.int32))),
        ("weight-shape", ValueError, "rms_norm_weight",
         lambda c, k: dict(rms_norm_weight=torch.ones(layout.HEAD_DIM // 2, device=DEVICE))),
        ("eps-type", TypeError, "rms_norm_eps",
         lambda c, k: dict(rms_norm_eps="1e-6")),
        ("eps-nan", ValueError, "rms_norm_eps: expected a finite float >= 0",
         lambda c, k: dict(rms_norm_eps=float("nan"))),
        ("eps-negative", ValueError, "rms_norm_eps", lambda c, k: dict(rms_norm_eps=-1e-6)),
        ("eps-inf", ValueError, "rms_norm_eps", lambda c, k: dict(rms_norm_eps=float("inf"))),
        ("eps-past-float32", ValueError, "rms_norm_eps: expected a finite float >= 0",
         lambda c, k: dict(rms_norm_eps=1e39)),
        ("eps-huge-int", ValueError, "rms_norm_eps", lambda c, k: dict(rms_norm_eps=10**400)),
        ("cache-dtype", TypeError, "k_cache",
         lambda c, k: dict(k_cache=k.view(torch.int8))),
        ("cache-2d", ValueError, "k_cache",
         lambda c, k: dict(k_cache=k[0])),
        ("cache-row-bytes", ValueError, "k_cache.shape[2]",
         lambda c, k: dict(k_cache=k[:, :, :layout.FP8_VALUE_BYTES])),
        ("cache-fp4-row-bytes", ValueError, "k_cache.shape[2]",
         lambda c, k: dict(use_fp4_cache=True)),
        ("cache-row-stride", ValueError, "k_cache.stride",
         lambda c, k: dict(k_cache=torch.zeros(4, 16 * (ROW + 4), dtype=torch.uint8, device=DEVICE)
                           .as_strided((4, 16, ROW), (16 * (ROW + 4), ROW + 4, 1)))),
        ("cache-page-stride", ValueError, "k_cache.stride(0)",
         lambda c, k: dict(k_cache=k.as_strided(k.shape, (100, ROW, 1)))),
        ("slots-dtype", TypeError, "kv_slot_mapping",
         lambda c, k: dict(kv_slot_mapping=c.slots.float())),
        ("slots-stride", ValueError, "kv_slot_mapping.stride(0)",
         lambda c, k: dict(kv_slot_mapping=torch.zeros(20, dtype=torch.int64,
                                                       device=DEVICE)[::2])),
        ("ratio-3", ValueError, "compress_ratio",
         lambda c, k: dict(compress_ratio=3)),
        ("ratio-type", TypeError, "compress_ratio",
         lambda c, k: dict(compress_ratio=1.0)),
        ("fp4-type", TypeError, "use_fp4_cache",
         lambda c, k: dict(use_fp4_cache="yes")),
        ("device-mismatch", ValueError, "device",
         lambda c, k: dict(kv_slot_mapping=t([0, 1], device="meta"))),
    ]


@pytest.mark.parametrize("name, error, words, change", bad_calls(), ids=[b[0] for b in bad_calls()])
def test_bad_argument_raises_before_writing(name, error, words, change):
    case = make_case(8, block_size=16, num_blocks=4, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    before = pages(cache).clone()
    args = _replace(case.args(cache), **change(case, cache))
    with pytest.raises(error) as info:
        ik.indexer_k_norm_rope_store(*args)
    assert words in str(info.value)
    assert "expected" in str(info.value) and "got" in str(info.value)
    assert torch.equal(pages(cache), before)


PATHS = [pytest.param(True, id="fast-path"), pytest.param(False, id="plain-path")]


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("change, words", [
    (dict(use_fp4_cache=np.bool_(False)), "use_fp4_cache: expected a bool, got numpy."),
    (dict(compress_ratio=np.int64(1)), "compress_ratio: expected an int, got numpy."),
], ids=["numpy-bool", "numpy-int"])
def test_numpy_scalars_are_named_with_their_module(change, words, fast):
    """The public function takes Python bools and ints; a numpy scalar is a TypeError that
    names its type with the module, on either host path. (A direct ``torch.ops`` call takes
    the op's schema conversions first, as torch does for any op.)"""
    case, cache, before = _small_store()
    with _host_path(fast):
        with pytest.raises(TypeError, match=words):
            ik.indexer_k_norm_rope_store(*_replace(case.args(cache), **change))
    assert torch.equal(pages(cache), before)


def _small_store():
    """(case, its cache, the cache's pages as they are)."""
    case = make_case(8, block_size=16, num_blocks=4, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    return case, cache, pages(cache).clone()


def _host_path(fast: bool):
    return contextlib.nullcontext() if fast else fast_path.disabled()


# Values the op's schema would convert (to False, to an int, to a float) rather than refuse.
CONVERTIBLE_OPTIONS = [
    ("use_fp4_cache-None", dict(use_fp4_cache=None), "use_fp4_cache: expected a bool"),
    ("use_fp4_cache-tensor", dict(use_fp4_cache=torch.tensor(False)),
     "use_fp4_cache: expected a bool, got torch.Tensor"),
    ("compress_ratio-bool", dict(compress_ratio=True), "compress_ratio: expected an int, got bool"),
    ("compress_ratio-tensor", dict(compress_ratio=torch.tensor(1)), "compress_ratio: expected an int"),
    ("eps-tensor", dict(rms_norm_eps=torch.tensor(1e-6)), "rms_norm_eps: expected a float"),
    ("eps-bool", dict(rms_norm_eps=True), "rms_norm_eps: expected a float, got bool"),
]


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("change, words", [pytest.param(c, w, id=i)
                                           for i, c, w in CONVERTIBLE_OPTIONS])
def test_options_the_schema_would_convert_are_refused_on_every_path(change, words, fast):
    case, cache, before = _small_store()
    with _host_path(fast):
        with pytest.raises(TypeError, match=words):
            ik.indexer_k_norm_rope_store(*_replace(case.args(cache), **change))
        # Keyword options too: check_bounds=None would turn the bounds check off.
        with pytest.raises(TypeError, match="check_bounds: expected a bool, got NoneType"):
            ik.indexer_k_norm_rope_store(*case.args(cache), check_bounds=None)
        with pytest.raises(TypeError, match="mx_scales: expected a bool or None, got int"):
            ik.indexer_k_norm_rope_store(*case.args(cache), mx_scales=0)
        slots = torch.tensor([0, 1], device=DEVICE)
        with pytest.raises(TypeError, match="check_bounds: expected a bool, got NoneType"):
            ik.gather_indexer_k(cache, slots, False, check_bounds=None)
        with pytest.raises(TypeError, match="use_fp4_cache: expected a bool, got NoneType"):
            ik.dequantize_indexer_k(cache, slots, None)
        with pytest.raises(TypeError, match="mx_scales: expected a bool or None, got int"):
            ik.dequantize_indexer_k(cache, slots, False, mx_scales=1)
        # The schema would take bytes for a str.
        with pytest.raises(TypeError, match="backend: expected a str or None, got bytes"):
            ik.indexer_k_norm_rope_store(*case.args(cache), backend=b"triton")
        with pytest.raises(TypeError, match="backend: expected a str or None, got bytes"):
            ik.top_k_indices(torch.randn(2, 40, device=DEVICE), 3, backend=b"reference")
    assert torch.equal(pages(cache), before)


def layout_errors():
    return [
        ("tiled-block-size", False, 24, dict(shuffle=True), ValueError, "block_size"),
        ("mxfp4-shuffle-no-tile", True, 64, dict(shuffle=True), NotImplementedError,
         "mxfp4_n_per_tile"),
        ("mxfp4-tile-not-dividing", True, 48, dict(shuffle=True, n=32), ValueError,
         "mxfp4_n_per_tile"),
        ("mxfp4-tile-not-a-choice", True, 64, dict(shuffle=True, n=8), ValueError,
         "mxfp4_n_per_tile"),
        ("backend-name", False, 16, dict(backend="cuda"), ValueError, "backend"),
        ("shuffle-type", False, 16, dict(shuffle="yes"), TypeError, "shuffle"),
        ("mx-scales-type", False, 16, dict(mx_scales="no"), TypeError, "mx_scales"),
        ("enable-pdl-type", False, 16, dict(enable_pdl=1), TypeError, "enable_pdl"),
    ] + ([] if DEVICE == "cuda" and torch.cuda.get_device_capability() >= (9, 0) else [
        ("enable-pdl-unsupported", False, 16, dict(enable_pdl=True), NotImplementedError,
         "enable_pdl"),
    ])


@pytest.mark.parametrize("name, fp4, block_size, options, error, words", layout_errors(),
                         ids=[e[0] for e in layout_errors()])
def test_bad_layout_options(name, fp4, block_size, options, error, words):
    case = make_case(8, use_fp4_cache=fp4, block_size=block_size, num_blocks=2, skip_every=0)
    cache = case.new_cache()
    before = pages(cache).clone()
    n = options.pop("n", 0)
    with pytest.raises(error) as info:
        ik.indexer_k_norm_rope_store(*case.args(cache), n, **options)
    assert words in str(info.value)
    assert torch.equal(pages(cache), before)


def test_no_asserts_for_validation():
    """Validation must survive ``python -O``: no assert statement in the package."""
    import ast
    import pathlib

    root = pathlib.Path(ik.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        asserts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        assert not asserts, f"{path.name}: assert at lines {asserts}"


def test_strided_vector_rejected_after_a_one_element_call_with_that_stride():
    """A one-element vector may have any stride; a cached plan for it must not let a longer
    vector with the same stride through."""
    case = make_case(10, block_size=16, num_blocks=4, skip_every=0, compress_ratio=1)
    cache = case.new_cache()
    for name in ("positions", "kv_slot_mapping"):
        vector = case.positions if name == "positions" else case.slots
        strided = torch.repeat_interleave(vector[:10], 5)[::5]  # stride 5, same values
        short = dict(positions=case.positions, kv_slot_mapping=case.slots[:1])
        short[name] = strided[:1]
        args = _replace(case.args(cache), **short)
        ik.indexer_k_norm_rope_store(*args)
        before = pages(cache).clone()
        args = _replace(case.args(cache), **{name: strided})
        with pytest.raises(ValueError, match=rf"{name}.stride\(0\)"):
            ik.indexer_k_norm_rope_store(*args)
        assert torch.equal(pages(cache), before)


@pytest.mark.parametrize("call, error, words", [
    pytest.param(lambda: ik.allocate_k_cache(4, 8, "no"), TypeError, "use_fp4_cache",
                 id="allocate-fp4-flag-str"),
    pytest.param(lambda: ik.allocate_k_cache(4.0, 8, False), TypeError, "num_blocks",
                 id="allocate-blocks-float"),
    pytest.param(lambda: ik.allocate_k_cache(4, 0, False), ValueError, "block_size",
                 id="allocate-block-size-0"),
    pytest.param(lambda: ik.allocate_k_cache(4, 8, False, page_bytes=2000.0), TypeError,
                 "page_bytes", id="allocate-page-bytes-float"),
    pytest.param(lambda: ik.cache_row_bytes(None), TypeError, "use_fp4_cache",
                 id="row-bytes-none"),
    pytest.param(lambda: ik.lengths_from_context(torch.tensor([2**32 + 3]), 1, 2**32 + 10),
                 ValueError, "num_cols", id="lengths-num-cols-past-int32"),
    pytest.param(lambda: ik.paged_mqa_logits(
        torch.zeros(1, 1, 4, 128, dtype=torch.float8_e4m3fn),
        torch.zeros(1, 64, 132, dtype=torch.uint8), torch.ones(1, 4),
        torch.ones(1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), 64),
        TypeError, "as a pair", id="scorer-bare-e4m3-query"),
    pytest.param(lambda: ik.paged_mqa_logits(
        torch.zeros(1, 1, 4, 128, dtype=torch.bfloat16), torch.zeros(1, 64, 132, dtype=torch.uint8),
        torch.ones(1, 4, dtype=torch.float16), torch.ones(1, dtype=torch.int32),
        torch.zeros(1, 1, dtype=torch.int32), 2**45),
        ValueError, r"max_model_len: expected <= 2147483647, got 35184372088832",
        id="scorer-width-past-int32-before-allocating"),
    pytest.param(lambda: compat.fp8_fp4_paged_mqa_logits(
        (torch.zeros(1, 1, 4, 128, dtype=torch.float8_e4m3fn), None),
        torch.zeros(1, 64, 1, 132, dtype=torch.uint8), torch.ones(1, 4),
        torch.ones(1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), None, 2**62),
        ValueError, r"max_model_len: expected <= 2147483647",
        id="deepgemm-width-past-int32-before-allocating"),
    pytest.param(lambda: compat.fp8_fp4_paged_mqa_logits(
        torch.zeros(1, 1, 4, 64, dtype=torch.int8), torch.zeros(1, 64, 1, 68, dtype=torch.uint8),
        torch.ones(1, 4), torch.ones(1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32),
        None, 64),
        ValueError, r"q\[1\]: expected int32 scales .* \(MXFP4 values need them\)",
        id="deepgemm-bare-int8-fp4-query"),
    pytest.param(lambda: ik.top_k_indices(torch.randn(4, 64), 2**44), ValueError,
                 r"k: expected <= 2147483647, got 17592186044416", id="topk-k-past-int32"),
    pytest.param(lambda: ik.top_k_indices(torch.randn(4, 64).to_sparse_csr(), 3), TypeError,
                 "logits: expected a dense", id="topk-sparse-csr-logits",
                 marks=pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")),
    pytest.param(lambda: ik.top_k_indices(torch.randn(4, 64), 3,
                                          out=torch.zeros(4, 3, dtype=torch.int32).to_sparse()),
                 TypeError, "out: expected a dense", id="topk-sparse-out"),
])
def test_helpers_and_query_forms_name_bad_arguments(call, error, words):
    """The helpers check their arguments as the ops do; a bare e4m3 query says it needs the
    (values, scales) pair."""
    with pytest.raises(error, match=words):
        call()


def test_gather_by_blocks_on_meta_tensors_says_why():
    """Its row count is data (cu_seq_lens[-1]): meta tensors cannot give it, FakeTensors can."""
    cache = torch.empty(4, 8, 132, dtype=torch.uint8, device="meta")
    table = torch.zeros(2, 2, dtype=torch.int32, device="meta")
    cu_seq_lens = torch.zeros(3, dtype=torch.int32, device="meta")
    with pytest.raises(NotImplementedError, match="cu_seq_lens"):
        ik.gather_indexer_k_by_blocks(cache, table, cu_seq_lens, False)


def test_store_cache_apart_from_its_inputs():
    """A cache sharing bytes with an input is refused before any byte changes (checked when
    the call's plan is made)."""
    buf = torch.zeros(12000, dtype=torch.uint8)
    cache = buf[6000:6000 + 4 * 8 * 132].view(4, 8, 132)
    weight = torch.ones(128, dtype=torch.bfloat16)
    before = buf.clone()
    with pytest.raises(ValueError, match="k_cache: expected memory apart from k_pre, got"):
        ik.indexer_k_norm_rope_store(buf[:24 * 256].view(torch.bfloat16).view(24, 128),
                                     torch.arange(24), torch.randn(64, 64), weight, 1e-6, cache,
                                     torch.arange(24), 1, False)
    with pytest.raises(ValueError, match="apart from cos_sin_cache, got"):
        ik.indexer_k_norm_rope_store(
            torch.randn(2, 128).bfloat16(), torch.arange(2),
            buf[6000:6000 + 16 * 256].view(torch.float32).view(16, 64), weight, 1e-6, cache,
            torch.arange(2), 1, False)
    assert torch.equal(buf, before)


def test_store_cache_apart_from_its_inputs_on_each_new_token_count():
    """A plan made and launched by a clean call still compares the memory of a later call with
    other token counts (the same shapes as before are not compared again)."""
    buf = torch.randint(0, 256, (12000,), dtype=torch.uint8)
    cache = buf[6000:6000 + 4 * 8 * 132].view(4, 8, 132)
    weight = torch.ones(128, dtype=torch.bfloat16)
    cos_sin = torch.randn(64, 64)
    ik.indexer_k_norm_rope_store(torch.randn(3, 128).bfloat16(), torch.arange(3), cos_sin,
                                 weight, 1e-6, cache, torch.arange(3), 1, False)
    before = buf.clone()
    with pytest.raises(ValueError, match="k_cache: expected memory apart from k_pre, got"):
        ik.indexer_k_norm_rope_store(buf[5000:5000 + 5 * 256].view(torch.bfloat16).view(5, 128),
                                     torch.arange(5), cos_sin, weight, 1e-6, cache,
                                     torch.arange(5), 1, False)
    assert torch.equal(buf, before)
