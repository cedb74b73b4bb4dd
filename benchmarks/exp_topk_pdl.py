"""Experiment: the top-k's four kernels launched without programmatic dependent launch,
with it and the next kernel released at once (``PDL_EARLY``), or with it and the next
kernel released as the programs exit (``PDL_AT_EXIT``), at the bench's shapes;
CUDA-graph replay, the three alternated twice.

    python benchmarks/exp_topk_pdl.py
"""

from __future__ import annotations

import torch

from indexer_kcache import topk
from indexer_kcache.bench.topk import SHAPES, K, make_logits, time_settings


def main():
    device = torch.device("cuda")
    lines = []
    for rows, cols in SHAPES:
        buffers = make_logits(rows, cols, device)
        outs = [torch.empty(rows, K, dtype=torch.int32, device=device) for _ in buffers]
        default = topk.topk_settings(rows, cols, K)
        times = {topk.PDL_NONE: [], topk.PDL_EARLY: [], topk.PDL_AT_EXIT: []}
        exact = {}
        for pdl in (topk.PDL_EARLY, topk.PDL_AT_EXIT, topk.PDL_NONE) * 2:
            exact[pdl], us = time_settings(buffers, outs, default._replace(pdl=pdl))
            times[pdl].append(us)
        best = {mode: min(runs) for mode, runs in times.items()}
        lines.append(f"{rows:>4} x {cols:<6}  no PDL {best[topk.PDL_NONE]:6.1f} us  early "
                     f"{best[topk.PDL_EARLY]:6.1f} us  at exit {best[topk.PDL_AT_EXIT]:6.1f} us  "
                     f"exact: {all(exact.values())}  runs {times}")
        print(lines[-1], flush=True)
        del buffers, outs
    print("\n".join(lines))


if __name__ == "__main__":
    main()
