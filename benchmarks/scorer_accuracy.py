"""The scorer's accuracy and time at a few of the bench's shapes, for the package on
``PYTHONPATH`` (run it once per revision to compare two):

    python benchmarks/scorer_accuracy.py [label]

For each shape: the GPU time as the bench measures it (CUDA-graph replay over calls that
rotate over more keys than the L2 holds), the largest error against a float64
computation on the dequantized inputs as a fraction of the contract's bound (``2e-3 *
sum_h |w_h| sum_d |q_hd K_td|``), and how many of each row's float64 top-2048 positions
the scorer's own top-2048 keeps (the first four sequences' rows, at least 4096 positions).
One line a shape, starting with ``label``.
"""

from __future__ import annotations

import sys

import torch

from indexer_kcache import layout, paged_mqa_logits
from indexer_kcache.bench import graph_time_us
from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.reference import logits as reference_logits

CASES = [("fp8", "e4m3", 1, 131072, 1), ("fp8", "e4m3", 8, 32768, 1),
         ("fp8", "e4m3", 64, 8192, 1), ("fp8", "e4m3", 64, 32768, 1),
         ("fp8", "e4m3", 64, 8192, 4), ("fp8", "e4m3", 64, 32768, 4),
         ("mxfp4", "e4m3", 8, 32768, 1), ("mxfp4", "e4m3", 64, 8192, 1),
         ("mxfp4", "e4m3", 64, 32768, 1), ("mxfp4", "e4m3", 64, 8192, 4),
         ("mxfp4", "mxfp4", 64, 32768, 1), ("mxfp4", "bf16", 64, 32768, 1)]
TOP = 2048


def accuracy(call: dict, fp4: bool, mx: bool) -> tuple[float, list[int]]:
    """(largest error / bound, positions of the float64 top-TOP kept, a row each)."""
    got = paged_mqa_logits(call["q"], call["k_cache"], call["weights"], call["context_lens"],
                           call["block_table"], call["max_model_len"], mx_scales=mx).double()
    keys, _ = reference_logits.sequence_keys(call["k_cache"], call["block_table"],
                                             call["max_model_len"], fp4, mx, 0, 0)
    q = reference_logits.dequantize_q(call["q"]).double()
    batch, next_n, heads, _ = q.shape
    w = call["weights"].double().view(batch, next_n, heads)
    worst, kept = 0.0, []
    for b in range(batch):
        k = keys[b].double()
        want = (torch.einsum("ihd,td->iht", q[b], k).clamp_min(0) * w[b][:, :, None]).sum(1)
        bound = bench_logits.BOUND * (w[b].abs()[:, :, None] * torch.einsum(
            "ihd,td->iht", q[b].abs(), k.abs())).sum(1)
        ours = got[b * next_n:(b + 1) * next_n, :want.shape[1]]
        finite = torch.isfinite(ours) & torch.isfinite(want)
        worst = max(worst, float(((ours - want).abs() / bound.clamp_min(1e-300))[finite].max()))
        for i in range(next_n if b < 4 else 0):
            seen = int(finite[i].sum())
            if seen >= 2 * TOP:
                mine = set(torch.topk(ours[i, :seen], TOP).indices.tolist())
                exact = set(torch.topk(want[i, :seen], TOP).indices.tolist())
                kept.append(len(mine & exact))
    return worst, kept


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this"
    device = torch.device("cuda")
    for fmt, q_form, batch, context, next_n in CASES:
        fp4, mx = layout.FORMATS[fmt]
        calls, _ = bench_logits.make_calls(fmt, q_form, batch, context, next_n, device)
        worst, kept = accuracy(calls[0], fp4, mx)
        us = graph_time_us([bench_logits.scorer_call(c) for c in calls], 40)
        span = f"{min(kept)}..{max(kept)}" if kept else "-"
        print(f"{label} {fmt:5} {q_form:5} {batch:>3}x{context:<6} n{next_n} {us:8.2f} us  "
              f"worst {worst:.4f} of the bound  top-{TOP} kept {span}", flush=True)
        del calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
