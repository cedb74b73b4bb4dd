"""Experiment: the top-k's four kernels launched without programmatic dependent launch,
with it and the next kernel released at once (``PDL_EARLY``), or with it and the next
kernel released as the programs exit (``PDL_AT_EXIT``), at the bench's shapes;
CUDA-graph replay, the three alternated twice.

    python benchmarks/exp_topk_pdl.py
"""

from __future__ import annotations

import torch

from indexer_kcache import topk
from indexer_kcache.bench.timing import graph_time_us
from indexer_kcache.bench.topk import SHAPES, K, make_logits
from indexer_kcache.reference import topk as reference_topk


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
            settings = default._replace(pdl=pdl)

            def call(x, o, settings=settings):
                with topk.topk_settings.override(settings):
                    topk.top_k_indices(x, K, out=o)

            calls = [lambda x=x, o=o: call(x, o) for x, o in zip(buffers, outs, strict=True)]
            calls[0]()
            exact[pdl] = torch.equal(outs[0], reference_topk.top_k_indices(buffers[0], K))
            times[pdl].append(graph_time_us(calls, 40))
        best = {mode: min(runs) for mode, runs in times.items()}
        lines.append(f"{rows:>4} x {cols:<6}  no PDL {best[topk.PDL_NONE]:6.1f} us  early "
                     f"{best[topk.PDL_EARLY]:6.1f} us  at exit {best[topk.PDL_AT_EXIT]:6.1f} us  "
                     f"exact: {all(exact.values())}  runs {times}")
        print(lines[-1], flush=True)
        del buffers, outs
    print("\n".join(lines))


if __name__ == "__main__":
    main()
