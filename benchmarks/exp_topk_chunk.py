"""Experiment: the top-k's rank kernel at 128 and 256 pairs a program (before this
experiment, 256 from 4M elements and 128 below; now 128 everywhere) at 8192 and 65536
columns; CUDA-graph replay, the two alternated three times, medians; each one's indices
checked against the reference.

    python benchmarks/exp_topk_chunk.py
"""

from __future__ import annotations

import statistics

import torch

from indexer_kcache import topk
from indexer_kcache.bench.topk import K, make_logits, time_settings

SHAPES = [(512, 8192), (256, 8192), (1024, 8192), (128, 65536), (64, 65536)]


def main():
    device = torch.device("cuda")
    lines = []
    for rows, cols in SHAPES:
        buffers = make_logits(rows, cols, device)
        outs = [torch.empty(rows, K, dtype=torch.int32, device=device) for _ in buffers]
        default = topk.topk_settings(rows, cols, K)
        variants = {f"chunk {chunk}": default._replace(chunk=chunk) for chunk in (128, 256)}
        times = {name: [] for name in variants}
        exact = {}
        for _ in range(3):
            for name, settings in variants.items():
                exact[name], us = time_settings(buffers, outs, settings)
                times[name].append(us)
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
