"""The store's and the readers' sweeps: against the copy bandwidth, the launch floor and
torch peers.

GPU time per call is the median over CUDA-graph replays of a graph holding ``calls``
calls, timed with CUDA events; eager time is wall time per call of a plain Python loop
(host launch cost included), for the store in loops alternating with an empty Triton
launch's (both medians are recorded, and their ratio shown). Minimal bytes count each
input read once and each output written once: 16 B per token (position, slot) and, per
written token, the key row (256 B in bf16), the 64 cos/sin values and the stored row.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .. import layout, reference
from ..checks import pdl_supported
from ..store import indexer_k_norm_rope_store
from .timing import (
    eager_time_us,
    eager_vs_baseline_us,
    empty_launch_fn,
    graph_time_us,
    progress,
    pyplot,
    save_plot,
)

FORMATS = layout.FORMATS
GPU_TOKENS = (1, 64, 512, 4096, 32768, 262144)
CPU_TOKENS = (1, 64, 512)
PEER_TOKENS = (512, 4096, 32768)
READER_TOKENS = (32768, 262144)
BLOCK_SIZE = 64


@dataclass
class Record:
    impl: str
    format: str
    compress_ratio: int
    tokens: int
    graph_us: float | None
    eager_us: float | None
    bytes: int
    op: str = "store"  # or "gather" / "dequantize" (the readers)
    graph_us_no_pdl: float | None = None  # the store with enable_pdl=False, where PDL exists
    # The empty launch's eager time, measured in loops alternating with this record's.
    empty_launch_eager_us: float | None = None


# ----------------------------------------------------------------------------- inputs
def make_inputs(tokens: int, fmt: str, compress_ratio: int, device, seed: int = 0,
                k_pre_dtype: torch.dtype = torch.bfloat16) -> dict:
    """A realistic batch: random keys, consecutive positions from a random start (so that
    ``compress_ratio`` 2 writes half the tokens), whole blocks in scrambled order."""
    g = torch.Generator(device="cpu").manual_seed(seed + tokens)
    fp4, _ = FORMATS[fmt]
    num_blocks = -(-tokens // BLOCK_SIZE) + 8
    max_pos = 2 * tokens + 4096
    start = int(torch.randint(0, max_pos - tokens, (1,), generator=g))
    blocks = torch.randperm(num_blocks, generator=g)
    t = torch.arange(tokens)
    angles = torch.rand(max_pos, layout.ROPE_DIM // 2, generator=g) * 6.3
    return dict(
        k_pre=(torch.randn(tokens, layout.HEAD_DIM, generator=g) * 2).to(k_pre_dtype).to(device),
        positions=(start + t).to(device),
        cos_sin_cache=torch.cat([angles.cos(), angles.sin()], 1).to(device),
        rms_norm_weight=(1 + 0.1 * torch.randn(layout.HEAD_DIM, generator=g)).to(torch.bfloat16)
        .to(device),
        rms_norm_eps=1e-6,
        k_cache=torch.zeros(num_blocks, BLOCK_SIZE, layout.cache_row_bytes(fp4),
                            dtype=torch.uint8, device=device),
        kv_slot_mapping=(blocks[t // BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE).to(device),
        compress_ratio=compress_ratio,
        use_fp4_cache=fp4,
    )


def minimal_store_bytes(inputs: dict) -> int:
    tokens = inputs["kv_slot_mapping"].numel()
    pos = inputs["positions"][:tokens]
    written = int(((pos + 1) % inputs["compress_ratio"] == 0).sum())
    key_row = layout.HEAD_DIM * inputs["k_pre"].element_size()
    cos_sin_row = layout.ROPE_DIM * inputs["cos_sin_cache"].element_size()
    per_written = key_row + cos_sin_row + layout.cache_row_bytes(inputs["use_fp4_cache"])
    return 16 * tokens + written * per_written


STORE_ARGS = ("k_pre", "positions", "cos_sin_cache", "rms_norm_weight", "rms_norm_eps",
              "k_cache", "kv_slot_mapping", "compress_ratio", "use_fp4_cache")


def store_call(inputs: dict, mx_scales: bool, backend: str | None = None,
               **options) -> Callable[[], None]:
    args = [inputs[k] for k in STORE_ARGS]
    return lambda: indexer_k_norm_rope_store(*args, mx_scales=mx_scales, backend=backend,
                                             **options)


def torch_store_dense(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                      kv_slot_mapping, compress_ratio, use_fp4_cache, mx_scales=False):
    """The reference's numerics without data-dependent shapes, so that torch.compile and CUDA
    graphs can take it: every token is computed, skipped ones write back the old bytes.
    (Benchmark peer only: assumes valid, distinct slots.)"""
    num_blocks, block_size, _ = k_cache.shape
    tokens = kv_slot_mapping.numel()
    pos = positions[:tokens].long()
    slots = kv_slot_mapping.long()
    group_pos = torch.div(pos, compress_ratio, rounding_mode="floor") * compress_ratio
    written = (slots >= 0) & ((pos + 1) % compress_ratio == 0)
    k = reference.normalize_and_rope(k_pre[:tokens], group_pos.clamp(0, cos_sin_cache.shape[0] - 1),
                                     cos_sin_cache, rms_norm_weight, rms_norm_eps)
    if use_fp4_cache:
        values, scales = reference.quantize_mxfp4(k)
    else:
        values, scales = reference.quantize_fp8(k, mx_scales)
    value_at, scale_at = reference.token_byte_offsets(k_cache, slots.clamp_min(0), use_fp4_cache,
                                                      layout.ROW_MAJOR, 0)
    flat = reference.cache_bytes(k_cache)
    flat[value_at] = torch.where(written[:, None], values, flat[value_at])
    flat[scale_at] = torch.where(written[:, None], scales, flat[scale_at])


# ----------------------------------------------------------------------------- sweeps
def check_store_bytes(inputs: dict, mx_scales: bool) -> bool:
    got = dict(inputs, k_cache=torch.full_like(inputs["k_cache"], 0xA5))
    want = dict(inputs, k_cache=torch.full_like(inputs["k_cache"], 0xA5))
    store_call(got, mx_scales)()
    store_call(want, mx_scales, backend="reference")()
    return torch.equal(got["k_cache"], want["k_cache"])


def run_gpu(result: dict, tokens=GPU_TOKENS, formats=tuple(FORMATS), ratios=(1, 2),
            calls: int = 200, peers: bool = True, readers: bool = True,
            peer_tokens=PEER_TOKENS) -> None:
    """The store's sweep (and its peers', and the readers'), added to ``result``'s records;
    byte mismatches against the reference in ``result["byte_mismatches"]``."""
    device = torch.device("cuda")
    empty = empty_launch_fn()
    records, mismatches = [], []
    cases = [(f, cr, t) for f in formats for cr in ratios for t in tokens]
    pdl = pdl_supported(device)
    for fmt, cr, t in progress(cases, "store"):
        inputs = make_inputs(t, fmt, cr, device)
        mx = FORMATS[fmt][1]
        if not check_store_bytes(inputs, mx):
            mismatches.append(f"{fmt} cr{cr} {t}")
        fn = store_call(inputs, mx)
        no_pdl_us = graph_time_us(store_call(inputs, mx, enable_pdl=False), calls) if pdl else None
        eager_us, empty_us = eager_vs_baseline_us(fn, empty, calls)
        records.append(Record("indexer_kcache", fmt, cr, t, graph_time_us(fn, calls), eager_us,
                              minimal_store_bytes(inputs), graph_us_no_pdl=no_pdl_us,
                              empty_launch_eager_us=empty_us))
        del inputs, fn
    # float32 keys (a wk GEMM's accumulator, rounded to bf16 as they are loaded) at the
    # largest size: twice the key bytes read.
    float_cases = [(f, cr) for f in formats for cr in ratios] if tokens else []
    for fmt, cr in progress(float_cases, "float32 keys"):
        inputs = make_inputs(max(tokens), fmt, cr, device, k_pre_dtype=torch.float32)
        mx = FORMATS[fmt][1]
        if not check_store_bytes(inputs, mx):
            mismatches.append(f"{fmt} cr{cr} {max(tokens)} float32 keys")
        fn = store_call(inputs, mx)
        records.append(Record("kcache fp32 keys", fmt, cr, max(tokens),
                              graph_time_us(fn, calls), eager_time_us(fn, calls, torch.cuda.synchronize),
                              minimal_store_bytes(inputs)))
        del inputs, fn
    if peers:
        records += run_peers(device, formats, peer_tokens, calls)
    if readers:
        records += run_readers(device, calls)
    result["records"] += [asdict(r) for r in records]
    result["byte_mismatches"] += mismatches


def run_peers(device, formats, peer_tokens, calls) -> list[Record]:
    records = []
    for fmt in [f for f in ("fp8", "mxfp4") if f in formats]:
        compiled = torch.compile(torch_store_dense, dynamic=True)
        for t in progress(peer_tokens, f"peers {fmt}"):
            inputs = make_inputs(t, fmt, 1, device)
            nbytes = minimal_store_bytes(inputs)
            for impl, fn in (("torch-eager", torch_store_dense), ("torch-compile", compiled)):
                call = lambda fn=fn, inputs=inputs: fn(**inputs)
                call()
                try:
                    graph_us = graph_time_us(call, max(calls // 20, 5))
                except Exception as error:  # report what could be measured
                    print(f"{impl} {fmt} {t}: no CUDA-graph time ({type(error).__name__})")
                    graph_us = None
                records.append(Record(impl, fmt, 1, t, graph_us,
                                      eager_time_us(call, 20, torch.cuda.synchronize), nbytes))
    return records


def run_readers(device, calls) -> list[Record]:
    from ..readers import dequantize_indexer_k, gather_indexer_k

    records = []
    for fmt in ("fp8", "mxfp4"):
        for t in READER_TOKENS:
            inputs = make_inputs(t, fmt, 1, device)
            store_call(inputs, False)()
            cache, slots = inputs["k_cache"], inputs["kv_slot_mapping"]
            fp4 = inputs["use_fp4_cache"]
            row = layout.cache_row_bytes(fp4)
            args = (cache, slots, fp4)
            ops = (
                ("gather", lambda a=args: gather_indexer_k(*a, check_bounds=False),
                 t * (8 + 2 * row)),
                ("dequantize", lambda a=args: dequantize_indexer_k(*a, mx_scales=False,
                                                                   check_bounds=False),
                 t * (8 + row + 512)),
            )
            for op, fn, nbytes in ops:
                records.append(Record("indexer_kcache", fmt, 1, t, graph_time_us(fn, 20),
                                      eager_time_us(fn, 20, torch.cuda.synchronize), nbytes, op))
    return records


def run_cpu(tokens=CPU_TOKENS, formats=tuple(FORMATS), ratios=(1, 2)) -> dict:
    """No GPU: a tiny sweep of the reference and of the kernel under the Triton interpreter."""
    from ..kernels import INTERPRETED

    records = []
    impls = [("reference", "reference")] + ([("triton-interpreter", "triton")] if INTERPRETED else [])
    for fmt, cr, t in progress([(f, cr, t) for f in formats for cr in ratios for t in tokens],
                                "cpu"):
        inputs = make_inputs(t, fmt, cr, "cpu")
        for impl, backend in impls:
            fn = store_call(inputs, FORMATS[fmt][1], backend)
            records.append(Record(impl, fmt, cr, t, None, eager_time_us(fn, 3, lambda: None),
                                  minimal_store_bytes(inputs)))
    return {"gpu": None, "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__, "note": "CPU only: wall times, not GPU performance",
            "records": [asdict(r) for r in records]}


# ----------------------------------------------------------------------------- output
def format_table(result: dict) -> str:
    """The store's and the readers' records as a table (records of other ops are skipped)."""
    copy = result.get("copy_GBps")
    lines = []
    if result.get("gpu"):
        lines.append(f"{result['gpu']}  torch {result['torch']}  triton {result['triton']}  "
                     f"copy {copy:.0f} GB/s  empty launch {result['empty_launch_graph_us']:.2f} us "
                     f"graph / {result['empty_launch_eager_us']:.2f} us eager")
    else:
        lines.append(f"CPU ONLY ({result['cpu']}), torch {result['torch']}: {result['note']}")
    lines.append(f"{'op':10} {'impl':18} {'format':7} {'cr':>2} {'tokens':>7} {'graph us':>9} "
                 f"{'eager us':>9} {'/ empty':>7} {'GB/s':>7} {'% copy':>7} {'no-PDL us':>9}")
    for r in result["records"] + result.get("readers", []):
        if r["op"] not in ("store", "gather", "dequantize"):
            continue
        t = r["graph_us"] if r["graph_us"] is not None else r["eager_us"]
        gbps = r["bytes"] / t / 1e3 if t else 0.0
        pct = f"{100 * gbps / copy:6.1f}%" if copy else "      -"
        graph = f"{r['graph_us']:9.2f}" if r["graph_us"] is not None else "        -"
        no_pdl = r.get("graph_us_no_pdl")
        no_pdl = f"{no_pdl:9.2f}" if no_pdl is not None else "        -"
        empty = r.get("empty_launch_eager_us")
        ratio = f"{r['eager_us'] / empty:6.2f}x" if empty else "      -"
        lines.append(f"{r['op']:10} {r['impl']:18} {r['format']:7} {r['compress_ratio']:>2} "
                     f"{r['tokens']:>7} {graph} {r['eager_us']:9.2f} {ratio} {gbps:7.0f} {pct} {no_pdl}")
    if result.get("byte_mismatches"):
        lines.append("DIFFERS FROM THE REFERENCE (bytes; the scorer: beyond its bound): "
                     + ", ".join(result["byte_mismatches"]))
    return "\n".join(lines)


def plot(result: dict, path: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    store = [r for r in result["records"] if r["op"] == "store" and r["graph_us"]]
    if not store:
        return False
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for (impl, fmt, cr) in sorted({(r["impl"], r["format"], r["compress_ratio"]) for r in store}):
        rs = sorted((r for r in store if (r["impl"], r["format"], r["compress_ratio"]) ==
                     (impl, fmt, cr)), key=lambda r: r["tokens"])
        style = "-o" if impl == "indexer_kcache" else "--s"
        ax.plot([r["tokens"] for r in rs], [r["graph_us"] for r in rs], style, ms=4,
                label=f"{impl} {fmt} cr{cr}")
    fp8 = sorted((r for r in store if r["impl"] == "indexer_kcache" and r["format"] == "fp8"
                  and r["compress_ratio"] == 1), key=lambda r: r["tokens"])
    if all(r.get("graph_us_no_pdl") for r in fp8):
        ax.plot([r["tokens"] for r in fp8], [r["graph_us_no_pdl"] for r in fp8], ":o", ms=3,
                color="tab:blue", label="indexer_kcache fp8 cr1, enable_pdl=False")
    floor = [(r["tokens"], r["bytes"] / result["copy_GBps"] / 1e3) for r in fp8]
    floor = [(t, us) for t, us in floor if us >= 0.05]  # below that it only squashes the plot
    ax.plot([t for t, _ in floor], [us for _, us in floor], "k:",
            label="bandwidth floor (fp8 cr1 bytes / copy GB/s)")
    ax.axhline(result["empty_launch_graph_us"], color="gray", ls="-.", label="empty launch (graph)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per call")
    ax.set_ylabel("GPU time per call (us, CUDA-graph replay)")
    ax.set_title(f"indexer K store on {result['gpu']}")
    return save_plot(fig, ax, path, grid="both", legend_size=7)
