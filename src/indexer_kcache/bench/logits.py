"""The scorer's sweep: ``paged_mqa_logits`` at the indexer's decode shapes (H = 64, block 64)
against the copy bandwidth, next to peers measured in the same run: unfused torch and two
small baseline kernels written after the descriptions of vLLM 0.33.0's Triton FP8 kernel
and SGLang 0.5.23's Triton MXFP4 kernel (our code, not theirs).

Inputs: keys written by the store into blocks in scrambled order; the calls of one CUDA
graph rotate over caches and block tables that together exceed the L2, so every call
reads its keys from device memory. ``bytes`` counts the cache bytes read (132 or 68 per
position and sequence).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import layout
from ..logits import paged_mqa_logits
from ..reference import logits as reference_logits
from ..reference.cache import E2M1_VALUES
from .store import STORE_ARGS, make_inputs
from .timing import event_time_us, graph_time_us, progress, pyplot, save_plot

BLOCK = 64
HEADS = 64
ROTATION_BYTES = 256 << 20  # the calls of one graph read at least this much (L2: 50 MB)
SOURCE_BLOCKS = 512  # blocks written by the store, then repeated into larger caches
# (cache format, query form, batch, context, next_n)
CASES = (
    [("fp8", "e4m3", b, c, 1) for b, c in ((1, 4096), (1, 131072), (8, 32768), (64, 8192),
                                           (64, 32768), (128, 65536))]
    + [("mxfp4", q, b, c, 1) for q in ("e4m3", "mxfp4")
       for b, c in ((1, 4096), (1, 131072), (8, 32768), (64, 8192), (64, 32768), (128, 65536))]
    + [(f, q, 64, c, 4) for f, q in (("fp8", "e4m3"), ("mxfp4", "e4m3"), ("mxfp4", "mxfp4"))
       for c in (8192, 32768)]
    + [(f, "bf16", b, c, 1) for f in ("fp8", "fp8-mx", "mxfp4") for b, c in ((64, 32768),)]
    + [("fp8-mx", "e4m3-mx", 64, 32768, 1)]
)
TORCH_PEER_KEYS = 1 << 19  # the unfused torch peer materialises every key: small shapes only


def store_cache(fmt: str, num_blocks: int, device, seed: int = 0) -> torch.Tensor:
    """``num_blocks`` blocks of keys written by the store (every slot, scrambled order)."""
    fp4, mx = layout.FORMATS[fmt]
    inputs = make_inputs(num_blocks * BLOCK, fmt, 1, device, seed=seed)
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(num_blocks * BLOCK)
    blocks = torch.randperm(num_blocks, generator=g)
    inputs["kv_slot_mapping"] = (blocks[t // BLOCK] * BLOCK + t % BLOCK).to(device)
    inputs["k_cache"] = torch.empty((num_blocks, BLOCK, layout.cache_row_bytes(fp4)),
                                    dtype=torch.uint8, device=device)
    from ..store import indexer_k_norm_rope_store

    indexer_k_norm_rope_store(*[inputs[k] for k in STORE_ARGS], mx_scales=mx)
    return inputs["k_cache"]


def big_cache(fmt: str, num_blocks: int, device, seed: int = 0) -> torch.Tensor:
    """A cache of ``num_blocks`` blocks: ``SOURCE_BLOCKS`` stored ones, repeated."""
    source = store_cache(fmt, min(num_blocks, SOURCE_BLOCKS), device, seed)
    cache = torch.empty((num_blocks, *source.shape[1:]), dtype=torch.uint8, device=device)
    for start in range(0, num_blocks, source.shape[0]):
        n = min(source.shape[0], num_blocks - start)
        cache[start:start + n] = source[:n]
    return cache


def make_queries(q_form: str, batch: int, next_n: int, g: torch.Generator, device,
                 heads: int = HEADS, exponents: tuple[int, int] = (121, 131)):
    """Random queries of a form: bf16, (e4m3, None), (e4m3, scales) or (MXFP4, scales),
    the scales' UE8M0 bytes drawn from ``exponents``."""
    shape = (batch, next_n, heads)
    x = torch.randn(*shape, 128, generator=g, device=device)
    if q_form == "bf16":
        return x.to(torch.bfloat16)
    if q_form == "mxfp4":
        values = torch.randint(0, 256, (*shape, 64), generator=g, device=device,
                               dtype=torch.uint8)
    else:
        values = (x * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    if q_form in ("e4m3-mx", "mxfp4"):
        e = torch.randint(*exponents, (*shape, 4), generator=g, device=device, dtype=torch.uint8)
        return values, e.view(torch.int32).reshape(shape)
    return values, None


def make_calls(fmt: str, q_form: str, batch: int, context: int, next_n: int, device,
               seed: int = 0) -> tuple[list[dict], int]:
    """Rotations of one shape (distinct pages, queries, tables and outputs per call),
    together at least ``ROTATION_BYTES`` of keys; and the key bytes of one call."""
    fp4, mx = layout.FORMATS[fmt]
    blocks = -(-context // BLOCK)
    nbytes = batch * context * layout.cache_row_bytes(fp4)
    rotations = max(1, min(256, -(-ROTATION_BYTES // nbytes)))
    cache = big_cache(fmt, rotations * batch * blocks, device, seed)
    g = torch.Generator(device=device).manual_seed(seed)
    order = torch.randperm(cache.shape[0], generator=g, device=device).to(torch.int32)
    calls = []
    for r in range(rotations):
        table = order[r * batch * blocks:(r + 1) * batch * blocks].view(batch, blocks)
        calls.append(dict(
            q=make_queries(q_form, batch, next_n, g, device), k_cache=cache,
            weights=torch.randn(batch * next_n, HEADS, generator=g, device=device),
            context_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
            block_table=table.contiguous(), max_model_len=context, mx_scales=mx,
            out=torch.empty(batch * next_n, context, device=device)))
    return calls, nbytes


def scorer_call(call: dict):
    """Our scorer on one of ``make_calls``' calls, as a function of nothing (for timing)."""
    return lambda: paged_mqa_logits(call["q"], call["k_cache"], call["weights"],
                                    call["context_lens"], call["block_table"],
                                    call["max_model_len"], mx_scales=call["mx_scales"],
                                    out=call["out"])


# ------------------------------------------------------------------------------ peers
def torch_unfused(call: dict, fp4: bool, mx: bool):
    """Unfused torch: gather and dequantize the keys, einsum, relu, weighted head sum."""
    cache, table = call["k_cache"], call["block_table"].long()
    batch, blocks = table.shape
    context = call["max_model_len"]
    magnitudes = torch.tensor(E2M1_VALUES, device=cache.device)
    e2m1 = torch.cat([magnitudes, -magnitudes])  # by code: sign << 3 | magnitude index
    vb = layout.value_bytes(fp4)
    pages = cache.reshape(cache.shape[0], -1)  # a page: all value bytes, then all scales
    page_values = pages[:, :BLOCK * vb].view(-1, BLOCK, vb)
    page_scales = pages[:, BLOCK * vb:BLOCK * (vb + layout.SCALE_BYTES)].view(-1, BLOCK, 4)

    def run():
        values = page_values[table].reshape(batch, blocks * BLOCK, vb)
        scales = page_scales[table].reshape(batch, blocks * BLOCK, 4)
        q = reference_logits.dequantize_q(call["q"])
        w = call["weights"].view(*q.shape[:3], 1)
        if fp4:
            codes = torch.stack([values & 0xF, values >> 4], -1).reshape(batch, -1, 4, 32)
            k = e2m1[codes.long()] * torch.exp2(scales.float() - 127)[..., None]
            k = k.reshape(batch, -1, 128)
        else:
            scale = (torch.exp2(scales[..., 0].float() - 127) if mx
                     else scales.contiguous().view(torch.float32)[..., 0])
            k = values.view(torch.float8_e4m3fn).float() * scale[..., None]
        s = torch.einsum("bihd,btd->biht", q, k[:, :context])
        return (torch.relu(s) * w).sum(2)

    return run


@triton.jit
def fp8_baseline_kernel(q_ptr, w_ptr, cache_ptr, page_stride, table_ptr, table_sb, ctx_ptr,
                         out_ptr, out_sr, NEXT_N: tl.constexpr, H: tl.constexpr,
                         SPLITS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """After the description of vLLM 0.33.0's Triton FP8 kernel: program (row, split)
    scores every SPLITS-th 64-key tile of its row with one FP8 dot, relu, weights, head
    sum, times the key's fp32 scale."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // NEXT_N
    limit = tl.load(ctx_ptr + b) - NEXT_N + row % NEXT_N + 1
    h = tl.arange(0, H)
    d = tl.arange(0, 128)
    q = tl.load(q_ptr + row * H * 128 + h[None, :] * 128 + d[:, None])
    w = tl.load(w_ptr + row * H + h)
    for tile in range(split, tl.cdiv(limit, 64), SPLITS):
        t = tile * 64 + tl.arange(0, 64)
        block = tl.load(table_ptr + b * table_sb + t // BLOCK_SIZE).to(tl.int64)
        page = cache_ptr + block * page_stride
        p = t % BLOCK_SIZE
        k = tl.load(page[:, None] + p[:, None] * 128 + d[None, :]).to(tl.float8e4nv, bitcast=True)
        scale = tl.load((page + BLOCK_SIZE * 128 + p * 4).to(tl.pointer_type(tl.float32)))
        s = tl.dot(k, q)
        logit = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1) * scale
        tl.store(out_ptr + row * out_sr + t, logit, mask=t < limit)


@triton.jit
def _e2m1_exp2(code):
    """An E2M1 code decoded with exp2, as the description of SGLang 0.5.23's kernel says."""
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, m * 0.5, (1.0 + 0.5 * m) * tl.exp2((e - 1).to(tl.float32)))
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def mxfp4_baseline_kernel(q_ptr, w_ptr, cache_ptr, page_stride, table_ptr, table_sb, ctx_ptr,
                           out_ptr, out_sr, NEXT_N: tl.constexpr, H: tl.constexpr,
                           SPLITS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """After the description of SGLang 0.5.23's MXFP4 kernel: bf16 queries; each nibble
    decoded with exp2, scaled, rounded to bf16; two bf16 dots (even and odd dims)."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // NEXT_N
    limit = tl.load(ctx_ptr + b) - NEXT_N + row % NEXT_N + 1
    h = tl.arange(0, H)
    j = tl.arange(0, 64)
    q_even = tl.load(q_ptr + row * H * 128 + h[None, :] * 128 + 2 * j[:, None])
    q_odd = tl.load(q_ptr + row * H * 128 + h[None, :] * 128 + 2 * j[:, None] + 1)
    w = tl.load(w_ptr + row * H + h)
    for tile in range(split, tl.cdiv(limit, 64), SPLITS):
        t = tile * 64 + tl.arange(0, 64)
        block = tl.load(table_ptr + b * table_sb + t // BLOCK_SIZE).to(tl.int64)
        page = cache_ptr + block * page_stride
        p = t % BLOCK_SIZE
        packed = tl.load(page[:, None] + p[:, None] * 64 + j[None, :]).to(tl.int32)
        scale_byte = tl.load(page[:, None] + BLOCK_SIZE * 64 + p[:, None] * 4 + j[None, :] // 16)
        scale = tl.exp2(scale_byte.to(tl.float32) - 127.0)
        lo = (_e2m1_exp2(packed & 0xF) * scale).to(tl.bfloat16)
        hi = (_e2m1_exp2(packed >> 4) * scale).to(tl.bfloat16)
        s = tl.dot(lo, q_even) + tl.dot(hi, q_odd)
        logit = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
        tl.store(out_ptr + row * out_sr + t, logit, mask=t < limit)


def baseline(call: dict, fp4: bool):
    """The baseline kernel of the cache's format: grid (rows, splits <= 1024 / rows), as
    vLLM's kernel is described; bf16 queries for the MXFP4 one."""
    q = call["q"][0] if isinstance(call["q"], tuple) else call["q"]
    if fp4:
        q = reference_logits.dequantize_q(call["q"]).to(torch.bfloat16)
    batch, next_n = q.shape[:2]
    rows = batch * next_n
    splits = max(1, min(1024 // rows, -(-call["max_model_len"] // 64)))
    out, cache, table = call["out"], call["k_cache"], call["block_table"]
    kernel = mxfp4_baseline_kernel if fp4 else fp8_baseline_kernel
    return lambda: kernel[(rows, splits)](
        q_ptr=q, w_ptr=call["weights"], cache_ptr=cache, page_stride=cache.stride(0),
        table_ptr=table, table_sb=table.stride(0), ctx_ptr=call["context_lens"], out_ptr=out,
        out_sr=out.stride(0), NEXT_N=next_n, H=HEADS, SPLITS=splits, BLOCK_SIZE=BLOCK,
        num_warps=4)


# ------------------------------------------------------------------------------ check
BOUND = 2e-3  # the contract's: |got - want| <= BOUND * sum_h |w_h| sum_d |q_hd K_td|


def contract_bound(q, keys: torch.Tensor, weights: torch.Tensor,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The bound ``BOUND * sum_h |w_h| sum_d |q_hd K_td|`` of every row and position,
    ``[B * next_n, T]``, from the queries (any form), the dequantized keys ``[B, T, 128]``
    and the weights, computed in ``dtype``."""
    q = reference_logits.dequantize_q(q).to(dtype).abs()
    batch, next_n, heads, _ = q.shape
    per_head = torch.einsum("bihd,btd->biht", q, keys.to(dtype).abs())
    w = weights.to(dtype).abs().view(batch, next_n, heads, 1)
    return BOUND * (w * per_head).sum(2).reshape(batch * next_n, -1)


def within_bound(call: dict, fp4: bool, mx: bool) -> bool:
    """Our logits of ``call`` against the torch reference: within the contract's bound
    where finite, ``-inf`` exactly where the reference has it. Run once per timed shape
    (long tile loops with the timed settings). Row-major caches (the bench's)."""
    args = (call["q"], call["k_cache"], call["weights"], call["context_lens"],
            call["block_table"], call["max_model_len"])
    got = paged_mqa_logits(*args, mx_scales=mx)
    want = paged_mqa_logits(*args, mx_scales=mx, backend="reference")
    keys, _ = reference_logits.sequence_keys(call["k_cache"], call["block_table"],
                                             call["max_model_len"], fp4, mx, 0, 0)
    bound = contract_bound(call["q"], keys, call["weights"])
    del keys
    return within(got, want, bound)


def within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> bool:
    """Logits ``got`` against the reference's ``want``: ``-inf`` exactly where it has
    ``-inf``, and within ``bound`` (``contract_bound``) where it is finite."""
    finite = torch.isfinite(want)
    err = (got - want).abs()
    return (torch.equal(torch.isneginf(got), torch.isneginf(want))
            and bool((err[finite] <= bound[finite] + 1e-6 * want[finite].abs()).all()))


# ------------------------------------------------------------------------------ sweep
def run_gpu(result: dict, calls: int = 40, cases=CASES, peers: bool = True) -> None:
    """Time every case (ours, and the peers where they apply) into ``result["records"]``."""
    device = torch.device("cuda")
    for fmt, q_form, batch, context, next_n in progress(cases, "logits"):
        fp4, mx = layout.FORMATS[fmt]
        rotations, nbytes = make_calls(fmt, q_form, batch, context, next_n, device)
        record = dict(op="logits", format=fmt, q_format=q_form, batch=batch, context=context,
                      next_n=next_n, heads=HEADS, bytes=nbytes)

        if not within_bound(rotations[0], fp4, mx):
            result["byte_mismatches"].append(
                f"logits {fmt} {q_form} {batch}x{context} next_n {next_n}")
        result["records"].append(dict(record, impl="indexer_kcache",
                                      gpu_us=graph_time_us([scorer_call(c) for c in rotations], calls)))
        if peers and next_n == 1 and q_form in ("e4m3", "mxfp4") and fmt in ("fp8", "mxfp4"):
            name = "sglang-like-triton" if fp4 else "vllm-like-triton"
            result["records"].append(dict(
                record, impl=name,
                gpu_us=graph_time_us([baseline(c, fp4) for c in rotations], calls)))
            if batch * context <= TORCH_PEER_KEYS:
                # Not capturable in a graph (host tensors): CUDA events around eager calls.
                result["records"].append(dict(
                    record, impl="torch-unfused",
                    gpu_us=event_time_us(torch_unfused(rotations[0], fp4, mx), 5)))
        del rotations


def format_table(result: dict) -> str:
    """Our times with the peers beside them, % of copy bandwidth on the key bytes."""
    rows = [r for r in result["records"] if r["op"] == "logits"]
    copy = result["copy_GBps"]
    lines = [f"{'cache':7} {'q':8} {'B x context':>13} {'n':>2} {'ours us':>8} {'% copy':>7} "
             f"{'peer':>18} {'peer us':>8} {'x peer':>7} {'torch us':>9}"]
    ours = [r for r in rows if r["impl"] == "indexer_kcache"]
    for r in ours:
        key = (r["format"], r["q_format"], r["batch"], r["context"], r["next_n"])
        same = {p["impl"]: p for p in rows
                if (p["format"], p["q_format"], p["batch"], p["context"], p["next_n"]) == key}
        peer = same.get("vllm-like-triton") or same.get("sglang-like-triton")
        torch_us = same.get("torch-unfused", {}).get("gpu_us")
        pct = 100 * r["bytes"] / r["gpu_us"] / 1e3 / copy
        lines.append(
            f"{r['format']:7} {r['q_format']:8} {r['batch']:>5} x {r['context']:<6} "
            f"{r['next_n']:>2} {r['gpu_us']:8.1f} {pct:6.1f}% "
            f"{peer['impl'] if peer else '-':>18} "
            f"{peer['gpu_us'] if peer else float('nan'):8.1f} "
            f"{peer['gpu_us'] / r['gpu_us'] if peer else float('nan'):6.2f}x "
            f"{torch_us if torch_us else float('nan'):9.1f}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> bool:
    """% of copy bandwidth by shape, ours and the baseline kernels, next_n 1."""
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in result["records"] if r["op"] == "logits" and r["next_n"] == 1
            and r["impl"] != "torch-unfused" and r["q_format"] != "bf16"]
    if not rows:
        return False
    copy = result["copy_GBps"]
    series = sorted({(r["impl"], r["format"], r["q_format"]) for r in rows})
    shapes = sorted({(r["batch"], r["context"]) for r in rows}, key=lambda s: s[0] * s[1])
    fig, ax = plt.subplots(figsize=(9, 5))
    width = 0.8 / len(series)
    for i, key in enumerate(series):
        by_shape = {(r["batch"], r["context"]): r for r in rows
                    if (r["impl"], r["format"], r["q_format"]) == key}
        ax.bar([j + i * width for j in range(len(shapes))],
               [100 * by_shape[s]["bytes"] / by_shape[s]["gpu_us"] / 1e3 / copy
                if s in by_shape else 0 for s in shapes], width, label=" ".join(key))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))],
                  [f"{b}x{c}" for b, c in shapes])
    ax.set_ylabel("% of copy bandwidth (cache bytes / time)")
    ax.set_title(f"paged MQA logits, H = {HEADS}, on {result['gpu']}")
    return save_plot(fig, ax, path, legend_size=7)
