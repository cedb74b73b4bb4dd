"""Experiment: the top-k's four kernels launched with and without programmatic dependent
launch (each kernel waits for the previous one on the GPU instead of in the stream), at
the bench's shapes; CUDA-graph replay, alternating A B A B.

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
        times = {True: [], False: []}
        exact = {}
        for pdl in (True, False) * 2:
            settings = default._replace(pdl=pdl)

            def call(x, o, settings=settings):
                with topk.topk_settings.override(settings):
                    topk.top_k_indices(x, K, out=o)

            calls = [lambda x=x, o=o: call(x, o) for x, o in zip(buffers, outs, strict=True)]
            calls[0]()
            exact[pdl] = torch.equal(outs[0], reference_topk.top_k_indices(buffers[0], K))
            times[pdl].append(graph_time_us(calls, 40))
        on, off = min(times[True]), min(times[False])
        lines.append(f"{rows:>4} x {cols:<6}  PDL {on:6.1f} us  no PDL {off:6.1f} us  "
                     f"({off / on:.3f}x)  exact: {exact[True]}, {exact[False]}  "
                     f"runs {times[True]} / {times[False]}")
        print(lines[-1], flush=True)
        del buffers, outs
    print("\n".join(lines))


if __name__ == "__main__":
    main()
