"""The top-k as one program a row, the row in registers (measured, not kept).

    python benchmarks/exp_topk_one_program.py

Each program loads its row (up to 16384 columns), maps the values to keys that sort as
the ranking does, finds the k-th largest key by a bit-by-bit count search (one or two bits
a pass, ``DIGIT_BITS``), marks the row's top k (ties at the k-th key by column, from one
packed running count), compacts their (key, column) pairs into a scratch row and orders
them with ``tl.sort``. Exact (checked here against ``reference.topk`` on normal rows, rows
of ties, and rows with NaN and -inf), and slower than the library's kernels at every shape
measured: ``tl.sort`` of 2048 pairs is the cost (BENCHMARKS.md, "The top-k"). Prints each
shape's time beside ``torch.topk`` (graph replay, 256 MB of logits rotated).
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

from indexer_kcache.bench.timing import copy_bandwidth_GBps, graph_time_us
from indexer_kcache.reference.topk import top_k_indices as reference_top_k


@triton.jit
def topk_one_program_kernel(logits_ptr, row_stride, lengths_ptr, out_ptr, out_row_stride,
                            scratch_ptr, cols, k, IS_BF16: tl.constexpr,
                            HAS_LENGTHS: tl.constexpr, COLS_P: tl.constexpr, K_P: tl.constexpr,
                            OUT_BLOCK: tl.constexpr, DIGIT_BITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, COLS_P)
    if HAS_LENGTHS:
        n = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), cols)
    else:
        n = cols + tl.zeros([], tl.int32)
    eligible = c < n
    x = tl.load(logits_ptr + row * row_stride + c, mask=eligible, other=0.0)
    if IS_BF16:
        x = x.to(tl.float32)
    bits = x.to(tl.uint32, bitcast=True)
    bits = tl.where(x == 0.0, 0, bits)  # -0.0 ties +0.0
    key = tl.where((bits & 0x80000000) != 0, ~bits, bits | 0x80000000)
    key = tl.where(x != x, 1, key)  # NaN below every number
    key = tl.where(eligible, key, 0)  # never selected
    kk = tl.minimum(n, k)
    # The largest t with #(key >= t) >= kk (t >= 1 when kk >= 1).
    t = tl.zeros([], tl.uint32)
    if DIGIT_BITS == 1:
        for b in tl.static_range(31, -1, -1):
            cand = t | (1 << b)
            cnt = tl.sum((key >= cand).to(tl.int32), axis=0)
            t = tl.where(cnt >= kk, cand, t)
    else:
        for b in tl.static_range(30, -1, -2):
            c1 = t | (1 << b)
            c2 = t | (2 << b)
            c3 = t | (3 << b)
            packed3 = ((key >= c1).to(tl.int64) + ((key >= c2).to(tl.int64) << 21)
                       + ((key >= c3).to(tl.int64) << 42))
            tot = tl.sum(packed3, axis=0)
            n1 = (tot & 0x1FFFFF).to(tl.int32)
            n2 = ((tot >> 21) & 0x1FFFFF).to(tl.int32)
            n3 = (tot >> 42).to(tl.int32)
            t = tl.where(n3 >= kk, c3, tl.where(n2 >= kk, c2, tl.where(n1 >= kk, c1, t)))
    gt = key > t
    eq = key == t
    n_gt = tl.sum(gt.to(tl.int32), axis=0)
    need = kk - n_gt
    incl = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
    gt_before = (incl & 0xFFFF) - gt.to(tl.int32)
    eq_before = (incl >> 16) - eq.to(tl.int32)
    sel = gt | (eq & (eq_before < need))
    pos = gt_before + tl.minimum(eq_before, need)
    pair = ((~key).to(tl.uint64) << 32) | c.to(tl.uint64)  # ascending: key down, column up
    base = scratch_ptr + row * K_P
    j = tl.arange(0, K_P)
    tl.store(base + j, tl.full([K_P], 0xFFFFFFFFFFFFFFFF, tl.uint64), mask=j >= kk)
    tl.store(base + pos, pair, mask=sel)
    tl.debug_barrier()
    y = tl.sort(tl.load(base + j))
    col = tl.where(j < kk, (y & 0xFFFFFFFF).to(tl.int32), -1)
    out = out_ptr + row * out_row_stride
    tl.store(out + j, col, mask=j < k)
    for start in range(K_P, k, OUT_BLOCK):
        o = start + tl.arange(0, OUT_BLOCK)
        tl.store(out + o, tl.full([OUT_BLOCK], -1, tl.int32), mask=o < k)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def top_k_one_program(logits, k, lengths=None, num_warps=8, out=None, scratch=None, digit_bits=1):
    rows, cols = logits.shape
    k_p = max(next_power_of_2(min(k, cols)), 32)
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    if scratch is None:
        scratch = torch.empty((rows, k_p), dtype=torch.uint64, device=logits.device)
    topk_one_program_kernel[(rows,)](
        logits, logits.stride(0), lengths if lengths is not None else out, out, out.stride(0),
        scratch, cols, k, IS_BF16=logits.dtype == torch.bfloat16, HAS_LENGTHS=lengths is not None,
        COLS_P=max(next_power_of_2(cols), 32), K_P=k_p, OUT_BLOCK=1024, DIGIT_BITS=digit_bits,
        num_warps=num_warps)
    return out


def main() -> None:
    torch.manual_seed(1)
    t0 = time.time()
    copy = copy_bandwidth_GBps()
    print(f"copy {copy:.0f} GB/s", flush=True)
    k = 2048
    variants = {8192: [(8, 1), (8, 2), (16, 1)], 16384: [(16, 1)]}  # (warps, digit bits)
    for cols, settings in variants.items():
        rows = 64
        x = torch.randn(rows, cols, device="cuda")
        x[torch.rand_like(x) < 0.3] = float("nan")
        x[torch.rand_like(x) < 0.1] = float("-inf")
        data = {"normal": torch.randn(rows, cols, device="cuda"),
                "ties": torch.randint(-3, 3, (rows, cols), device="cuda").float(), "nan": x}
        for warps, digit_bits in settings:
            start = time.time()
            top_k_one_program(data["normal"], k, None, num_warps=warps, digit_bits=digit_bits)
            torch.cuda.synchronize()
            print(f"compile cols {cols} w{warps} d{digit_bits}: {time.time() - start:.1f}s", flush=True)
            for name, x in data.items():
                got = top_k_one_program(x, k, None, num_warps=warps, digit_bits=digit_bits)
                print(f"  exact {name}: {torch.equal(got, reference_top_k(x, k))}", flush=True)
    lines = []
    for rows, cols in [(512, 8192), (64, 8192), (1024, 8192), (128, 8192), (256, 16384),
                       (64, 16384)]:
        xs = [torch.randn(rows, cols, device="cuda")
              for _ in range(max(2, (256 << 20) // (rows * cols * 4)))]
        outs = [torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in xs]
        scratch = torch.empty((rows, max(next_power_of_2(min(k, cols)), 32)), dtype=torch.uint64,
                              device="cuda")
        res = {"torch.topk": graph_time_us([lambda x=x: torch.topk(x, k, dim=1) for x in xs], 20)}
        for warps, digit_bits in variants[cols]:
            res[f"w{warps}d{digit_bits}"] = graph_time_us(
                [lambda x=x, o=o, s=scratch, w=warps, d=digit_bits: top_k_one_program(
                    x, k, None, num_warps=w, out=o, scratch=s, digit_bits=d)
                 for x, o in zip(xs, outs, strict=True)], 20)
        best = min(v for name, v in res.items() if name.startswith("w"))
        line = (f"{rows:5d} x {cols:6d}  " + "  ".join(f"{n} {t:7.1f}us" for n, t in res.items())
                + f"   best {res['torch.topk'] / best:.2f}x torch, "
                f"{rows * cols * 4 / best / 1e3 / copy * 100:.1f}% copy")
        print(line, flush=True)
        lines.append(line)
    print(f"total {time.time() - t0:.0f}s")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
