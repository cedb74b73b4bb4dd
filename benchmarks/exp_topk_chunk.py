"""Experiment: the top-k's rank kernel at 128 pairs a program instead of 256 (the setting
of short launches), at 512, 256 and 128 rows; CUDA-graph replay, the two alternated
three times, medians; each one's indices checked against the reference.

    python benchmarks/exp_topk_chunk.py
"""

from __future__ import annotations

import statistics

import torch

from indexer_kcache import topk
from indexer_kcache.bench.timing import graph_time_us
from indexer_kcache.bench.topk import K, make_logits
from indexer_kcache.reference import topk as reference_topk

SHAPES = [(512, 8192), (256, 8192), (1024, 8192), (128, 65536), (64, 65536)]


def main():
    device = torch.device("cuda")
    lines = []
    for rows, cols in SHAPES:
        buffers = make_logits(rows, cols, device)
        outs = [torch.empty(rows, K, dtype=torch.int32, device=device) for _ in buffers]
        default = topk.topk_settings(rows, cols, K)
        variants = {f"chunk {default.chunk}": default}
        other = topk.SHORT_RANK_CHUNK if default.chunk != topk.SHORT_RANK_CHUNK else topk.RANK_CHUNK
        variants[f"chunk {other}"] = default._replace(chunk=other)
        times = {name: [] for name in variants}
        exact = {}
        for _ in range(3):
            for name, settings in variants.items():
                def call(x, o, settings=settings):
                    with topk.topk_settings.override(settings):
                        topk.top_k_indices(x, K, out=o)

                calls = [lambda x=x, o=o: call(x, o) for x, o in zip(buffers, outs, strict=True)]
                calls[0]()
                exact[name] = torch.equal(outs[0], reference_topk.top_k_indices(buffers[0], K))
                times[name].append(graph_time_us(calls, 40))
        lines.append(f"{rows:>5} x {cols:<6} " + "  ".join(
            f"{name} {statistics.median(t):7.2f} us ({' '.join(f'{v:.1f}' for v in t)})"
            f"{'' if exact[name] else ' MISMATCH'}" for name, t in times.items()))
        print(lines[-1], flush=True)
        del buffers
        torch.cuda.empty_cache()
    print(f"# python benchmarks/exp_topk_chunk.py ({torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}; medians of three alternated rounds, each round in brackets)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
