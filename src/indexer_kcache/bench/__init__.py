"""Benchmarks: ``python -m indexer_kcache bench --help``.

Every figure is GPU time per call, the median over replays of a CUDA graph timed with CUDA
events, next to the minimal bytes the call must move and the device-to-device copy
bandwidth and empty-launch cost measured in the same run. Sections: ``store`` and
``readers`` (``bench.store``), ``logits`` (``bench.logits``), ``topk`` (``bench.topk``).
Without a GPU, a tiny CPU sweep of the store shows that the code runs (wall times, not
performance).
"""

from __future__ import annotations

import json
import os

import torch
import triton

from .store import (
    CPU_TOKENS,
    FORMATS,
    GPU_TOKENS,
    STORE_ARGS,
    check_store_bytes,
    format_table,
    make_inputs,
    minimal_store_bytes,
    plot,
    run_cpu,
    run_gpu,
    store_call,
)
from .timing import (
    copy_bandwidth_GBps,
    eager_time_us,
    empty_launch_fn,
    empty_launch_us,
    graph_time_us,
    loop_us,
)

SECTIONS = ("store", "readers", "logits", "topk")

__all__ = [
    "FORMATS", "STORE_ARGS", "check_store_bytes", "copy_bandwidth_GBps", "eager_time_us",
    "empty_launch_fn", "empty_launch_us", "format_table", "graph_time_us", "gpu_header",
    "loop_us", "main", "make_inputs", "minimal_store_bytes", "plot", "run_cpu", "run_gpu",
    "store_call",
]


def gpu_header(calls: int) -> dict:
    """The machine and its two reference figures: copy bandwidth (bytes read plus written
    per second) and an empty Triton launch's cost (in a graph, and eager)."""
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "copy_GBps": copy_bandwidth_GBps()}
    result["empty_launch_graph_us"], result["empty_launch_eager_us"] = empty_launch_us(calls)
    result["records"], result["byte_mismatches"] = [], []
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m indexer_kcache bench",
                                     description="Benchmark the ops on this machine's GPU.")
    parser.add_argument("--out", default="bench-out", help="folder for the JSON and the PNGs")
    parser.add_argument("--sections", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--tokens", type=int, nargs="*", help="store: token counts to sweep")
    parser.add_argument("--formats", nargs="*", choices=sorted(FORMATS), default=list(FORMATS))
    parser.add_argument("--calls", type=int, default=200, help="calls per CUDA graph")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not torch.cuda.is_available():
        result = run_cpu(tuple(args.tokens or CPU_TOKENS), tuple(args.formats))
        with open(os.path.join(args.out, "cpu.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(format_table(result))
        return 0
    result = gpu_header(args.calls)
    if "store" in args.sections or "readers" in args.sections:
        run_gpu(result, tuple(args.tokens or GPU_TOKENS) if "store" in args.sections else (),
                tuple(args.formats), calls=args.calls,
                peers=not args.no_peers and "store" in args.sections,
                readers="readers" in args.sections)
        plot(result, os.path.join(args.out, "gpu.png"))
    if "logits" in args.sections:
        from . import logits

        logits.run_gpu(result, peers=not args.no_peers)
        logits.plot(result, os.path.join(args.out, "gpu-logits.png"))
    if "topk" in args.sections:
        from . import topk

        topk.run_gpu(result)
        topk.plot(result, os.path.join(args.out, "gpu-topk.png"))
    with open(os.path.join(args.out, "gpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    tables = [format_table(result)]  # names any byte mismatch last
    if "logits" in args.sections:
        tables.insert(0, logits.format_table(result))
    if "topk" in args.sections:
        tables.insert(0, topk.format_table(result))
    print("\n\n".join(tables))
    return 1 if result["byte_mismatches"] else 0
