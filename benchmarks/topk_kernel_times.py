"""Per-kernel device time of the top-k's default settings, by torch.profiler.

    PYTHONPATH=<a revision's src> python benchmarks/topk_kernel_times.py LABEL [ROWSxCOLS ...]

Each shape: 8 inputs of random normal logits, each selected once to compile and warm, then
40 eager calls (the 8, five times) under the profiler; prints the mean device time of each
top-k kernel. Eager calls: a kernel's time here includes no wait for the one before (the
bench's graphs launch them dependently). Run it alternately on two revisions to see which
kernel a change moved.
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from indexer_kcache import top_k_indices

K = 2048


def main() -> None:
    label, shapes = sys.argv[1], sys.argv[2:] or ["64x65536", "512x8192"]
    for shape in shapes:
        rows, cols = (int(n) for n in shape.split("x"))
        inputs = [torch.randn(rows, cols, device="cuda") for _ in range(8)]
        for x in inputs:
            top_k_indices(x, K)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                for x in inputs:
                    top_k_indices(x, K)
            torch.cuda.synchronize()
        times = collections.defaultdict(list)
        for event in prof.events():
            if event.device_type.name == "CUDA" and "topk" in event.name:
                times[event.name.split("_kernel")[0]].append(event.device_time)
        print(label, shape, " ".join(f"{name}:{sum(t) / len(t):.1f}" for name, t in times.items()),
              flush=True)


if __name__ == "__main__":
    main()
