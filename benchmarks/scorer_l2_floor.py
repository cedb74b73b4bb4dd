"""How much of the scorer's time is the cache's bytes: each shape timed as the bench times
it (CUDA-graph replay over calls that rotate over more keys than the L2 holds), then again
with every block-table entry pointing at one of 64 pages (which the L2 holds), so that
what is left is the kernel's own work and latency:

    python benchmarks/scorer_l2_floor.py

Prints, for each shape, the time from device memory (and its % of the copy bandwidth),
the time from L2, and both per key.
"""

from __future__ import annotations

import argparse

import torch

from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.bench.timing import copy_bandwidth_GBps, graph_time_us

CASES = [("fp8", "e4m3", 64, 32768), ("mxfp4", "e4m3", 64, 32768), ("mxfp4", "mxfp4", 64, 32768),
         ("mxfp4", "bf16", 64, 32768), ("fp8", "e4m3", 128, 65536), ("mxfp4", "e4m3", 128, 65536),
         ("fp8", "e4m3", 1, 131072), ("mxfp4", "e4m3", 1, 131072)]
HOT_PAGES = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per CUDA graph")
    calls_per_graph = parser.parse_args().calls
    device = torch.device("cuda")
    copy = copy_bandwidth_GBps()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s")
    for fmt, q_form, batch, context in CASES:
        calls, nbytes = bench_logits.make_calls(fmt, q_form, batch, context, 1, device)
        from_memory = graph_time_us([bench_logits.scorer_call(c) for c in calls], calls_per_graph)
        hot = []
        for call in calls:
            table = call["block_table"]
            pages = torch.arange(table.numel(), device=device, dtype=torch.int32) % HOT_PAGES
            hot.append(dict(call, block_table=pages.view_as(table).contiguous()))
        from_l2 = graph_time_us([bench_logits.scorer_call(c) for c in hot], calls_per_graph)
        keys = batch * context
        print(f"{fmt:6} {q_form:6} {batch}x{context}: memory {from_memory:8.2f} us "
              f"({100 * nbytes / from_memory / 1e3 / copy:5.1f} %)  L2 {from_l2:8.2f} us  "
              f"ps a key: memory {1e6 * from_memory / keys:6.1f}, L2 {1e6 * from_l2 / keys:6.1f}")
        del calls, hot


if __name__ == "__main__":
    main()
