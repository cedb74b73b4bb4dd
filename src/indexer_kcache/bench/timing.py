"""Timing on a GPU: CUDA-graph replay and events, eager loops, the copy bandwidth and the
cost of an empty Triton launch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl


def graph_time_us(fn: Callable[[], None] | Sequence[Callable[[], None]], calls: int,
                  replays: int = 7) -> float:
    """Median GPU time per call over replays of one CUDA graph holding ``calls`` calls.

    Given several functions (the same call on different inputs), the graph cycles through
    them, each at least once (``calls`` grows to their number): inputs whose total exceeds
    the L2 cache make every call read from device memory.
    """
    fns = list(fn) if isinstance(fn, Sequence) else [fn]
    calls = max(calls, len(fns))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns * 2:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def event_time_us(fn: Callable[[], None], calls: int) -> float:
    """GPU time per call of ``calls`` eager calls between two CUDA events (the gaps between
    launches included): for peers that a CUDA graph cannot capture."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def loop_us(fn: Callable[[], None], calls: int, sync: Callable[[], None]) -> float:
    """Wall time per call of a plain loop of ``calls`` calls ending in ``sync()``."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / calls


def eager_time_us(fn: Callable[[], None], calls: int, sync: Callable[[], None]) -> float:
    """Wall time per call of a plain loop; median of five loops."""
    fn()
    sync()
    return statistics.median(loop_us(fn, calls, sync) for _ in range(5))


def eager_vs_baseline_us(fn: Callable[[], None], baseline: Callable[[], None], calls: int,
                         rounds: int = 9) -> tuple[float, float]:
    """Eager wall time per call of ``fn`` and of ``baseline`` (the empty launch), in
    alternating loops of ``calls`` calls: (median of fn's loops, median of baseline's).
    A shared host's speed drifts over tens of milliseconds; alternating gives both the
    same drift."""
    loops: tuple[list, list] = ([], [])
    for f in (fn, baseline):
        f()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for f, times in zip((fn, baseline), loops, strict=True):
            times.append(loop_us(f, calls, torch.cuda.synchronize))
    return statistics.median(loops[0]), statistics.median(loops[1])


def copy_bandwidth_GBps(num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy: bytes read plus bytes written per second (median of 20)."""
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(22):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * num_bytes / statistics.median(times[2:]) / 1e9


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


def empty_launch_fn() -> Callable[[], None]:
    """One launch of an empty Triton kernel, the way any Triton kernel is called."""
    x = torch.empty(1, device="cuda")
    return lambda: _empty_kernel[(1,)](x, 1, BLOCK=16)


def empty_launch_us(calls: int) -> tuple[float, float]:
    """Cost of launching an empty Triton kernel: (GPU us in a graph, eager wall us)."""
    fn = empty_launch_fn()
    return graph_time_us(fn, calls), eager_time_us(fn, calls, torch.cuda.synchronize)



def progress(items, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, leave=False)
    except ImportError:
        return items


def pyplot():
    """matplotlib's pyplot, drawing to files (Agg), or None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_plot(fig, ax, path: str, *, grid: str = "y", legend_size: int | None = None,
              legend_loc: str = "best") -> bool:
    """The bench plots' common finish: legend, grid, layout, a PNG at ``path``."""
    ax.legend(fontsize=legend_size, loc=legend_loc)
    if grid == "both":
        ax.grid(True, which="both", alpha=0.3)
    else:
        ax.grid(True, axis=grid, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True
