"""Experiment: does a minimal FP8 scorer reach the copy bandwidth, with pointer loads or
with TMA (tensor-descriptor) loads of whole pages? Row-major FP8 cache, e4m3 queries,
next_n 1, H 64, block 64. Times against the library's kernel on the same rotations.

    python benchmarks/exp_scorer_tma.py
"""

from __future__ import annotations

import itertools
import json
import os

import torch
import triton
import triton.language as tl

from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.bench.timing import copy_bandwidth_GBps, graph_time_us

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

H = 64


@triton.jit
def minimal_fp8_kernel(q_ptr, w_ptr, k_desc, cache_ptr, page_stride, num_blocks, table_ptr,
                       table_sb, ctx_ptr, out_ptr, out_sr, chunk, H: tl.constexpr,
                       STAGES: tl.constexpr, USE_TMA: tl.constexpr):
    b = tl.program_id(0)
    s = tl.program_id(1)
    limit = tl.load(ctx_ptr + b)
    lo = s * chunk
    hi = tl.minimum(lo + chunk, limit)
    h = tl.arange(0, H)
    d = tl.arange(0, 128)
    q = tl.load(q_ptr + b * H * 128 + h[None, :] * 128 + d[:, None]).to(tl.float8e4nv,
                                                                       bitcast=True)
    w = tl.load(w_ptr + b * H + h)
    lanes = tl.arange(0, 64)
    for t0 in tl.range(lo, hi, 64, num_stages=STAGES):
        blk = tl.load(table_ptr + b * table_sb + t0 // 64)
        ok = (blk >= 0) & (blk < num_blocks)
        page = cache_ptr + tl.where(ok, blk, 0).to(tl.int64) * page_stride
        if USE_TMA:
            k = k_desc.load([blk, 0, 0]).reshape(64, 128)
        else:
            k = tl.load(page + lanes[:, None] * 128 + d[None, :]).to(tl.float8e4nv, bitcast=True)
        sc = tl.load((page + 8192 + lanes * 4).to(tl.pointer_type(tl.float32)))
        acc = tl.dot(k, q)
        score = tl.sum(tl.maximum(acc, 0.0) * w[None, :], axis=1) * sc
        t = t0 + lanes
        score = tl.where(ok, score, float("-inf"))
        tl.store(out_ptr + b * out_sr + t, score, mask=t < limit)


def minimal(call, tiles_per_program, stages, use_tma, warps):
    values = call["q"][0].view(torch.uint8)
    cache, table, out = call["k_cache"], call["block_table"], call["out"]
    batch = table.shape[0]
    context = call["max_model_len"]
    tiles = -(-context // 64)
    splits = -(-tiles // tiles_per_program)
    desc = None
    if use_tma:
        fp8 = cache.view(torch.float8_e4m3fn)
        desc = TensorDescriptor(fp8, [cache.shape[0], 64, 128], [cache.stride(0), 128, 1],
                                [1, 64, 128])
    return lambda: minimal_fp8_kernel[(batch, splits)](
        values, call["weights"], desc, cache, cache.stride(0), cache.shape[0], table,
        table.stride(0), call["context_lens"], out, out.stride(0), tiles_per_program * 64,
        H=H, STAGES=stages, USE_TMA=use_tma, num_warps=warps)


def main():
    device = torch.device("cuda")
    copy = copy_bandwidth_GBps()
    shapes = [(1, 131072), (8, 32768), (64, 8192), (64, 32768), (128, 65536)]
    records = []
    lines = []
    for batch, context in shapes:
        calls, nbytes = bench_logits.make_calls("fp8", "e4m3", batch, context, 1, device)
        base = graph_time_us([bench_logits.scorer_call(c) for c in calls], 40)
        bench_logits.scorer_call(calls[0])()
        want = calls[0]["out"].clone()
        results = {"ours": base}
        for tpp, stages, tma, warps in itertools.product((8, 16, 32, 64, 128), (3, 4, 6),
                                                         (False, True), (4, 8)):
            name = f"{'tma' if tma else 'ptr'} x{tpp} s{stages} w{warps}"
            if tma and TensorDescriptor is None:
                continue
            try:
                fn = minimal(calls[0], tpp, stages, tma, warps)
                calls[0]["out"].fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                got = calls[0]["out"]
                err = ((got - want).abs() / (want.abs() + 1e-3)).max().item()
                if not err < 1e-2:
                    results[name] = f"wrong {err:.3g}"
                    continue
                results[name] = graph_time_us([minimal(c, tpp, stages, tma, warps)
                                               for c in calls], 40)
            except Exception as e:  # noqa: BLE001
                results[name] = f"error {type(e).__name__}: {str(e)[:200]}"
        timed = {k: v for k, v in results.items() if isinstance(v, float)}
        best = sorted(timed.items(), key=lambda kv: kv[1])[:6]
        pct = lambda us, nbytes=nbytes: nbytes / (us * 1e-6) / 1e9 / copy * 100  # noqa: E731
        lines.append(f"{batch}x{context}: ours {base:.1f} us ({pct(base):.0f} %); best: "
                     + ", ".join(f"{k} {v:.1f} ({pct(v):.0f} %)" for k, v in best))
        errors = {k: v for k, v in results.items() if not isinstance(v, float)}
        if errors:
            lines.append("   not timed: " + "; ".join(f"{k}: {v}" for k, v in
                                                      list(errors.items())[:4]))
        records.append(dict(batch=batch, context=context, bytes=nbytes, results=results))
        del calls
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "exp_scorer_tma.json"), "w") as f:
        json.dump(dict(copy_GBps=copy, records=records), f, indent=1)
    print(f"copy {copy:.0f} GB/s")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
