"""The top-k's sweep: ``top_k_indices`` with k = 2048 at the indexer's shapes, against
``torch.topk(sorted=True)`` in the same run and the copy bandwidth. The calls of one CUDA
graph rotate over logits buffers that together exceed the L2, so every call reads its
logits from device memory; ``bytes`` counts the logits read."""

from __future__ import annotations

import contextlib
import statistics

import torch

from ..topk import top_k_indices
from .timing import graph_time_us, progress, pyplot, save_plot

SHAPES = ((1, 131072), (64, 8192), (64, 65536), (128, 65536), (512, 8192))
K = 2048
ROTATION_BYTES = 256 << 20


def make_logits(rows: int, cols: int, device, seed: int = 0) -> list[torch.Tensor]:
    """Random normal fp32 logits, enough buffers to exceed ``ROTATION_BYTES`` together."""
    g = torch.Generator(device=device).manual_seed(seed)
    count = max(1, min(256, -(-ROTATION_BYTES // (rows * cols * 4))))
    return [torch.randn(rows, cols, generator=g, device=device) for _ in range(count)]


def logits_and_outputs(rows: int, cols: int, device, k: int = K) -> tuple[list, list]:
    """``make_logits`` and an int32 ``[rows, k]`` output for each buffer."""
    buffers = make_logits(rows, cols, device)
    return buffers, [torch.empty(rows, k, dtype=torch.int32, device=device) for _ in buffers]


def run_gpu(result: dict, calls: int = 40, shapes=SHAPES, k: int = K) -> None:
    """Time ours and torch.topk at every shape into ``result["records"]``; any row that
    differs from the reference is named in ``result["byte_mismatches"]``."""
    device = torch.device("cuda")
    for rows, cols in progress(shapes, "topk"):
        buffers, outs = logits_and_outputs(rows, cols, device, k)
        exact, us = time_settings(buffers, outs, None, k, calls)
        if not exact:
            result["byte_mismatches"].append(f"topk {rows}x{cols}")
        record = dict(op="topk", rows=rows, cols=cols, k=k, bytes=rows * cols * 4)
        result["records"].append(dict(record, impl="indexer_kcache", gpu_us=us))
        theirs = [lambda x=x: torch.topk(x, k, dim=1, sorted=True) for x in buffers]
        result["records"].append(dict(record, impl="torch-topk",
                                      gpu_us=graph_time_us(theirs, calls)))
        del buffers, outs


def time_settings(buffers: list, outs: list, settings, k: int = K,
                  calls: int = 40) -> tuple[bool, float]:
    """(exact, GPU us a call) of ``top_k_indices`` under ``settings`` (a ``TopKSettings``;
    None: the default) over ``buffers`` (their ``outs``): the first call's indices against
    the reference, then the graph time."""
    from .. import topk
    from ..reference import topk as reference_topk

    def call(x, o):
        with (contextlib.nullcontext() if settings is None
              else topk.topk_settings.override(settings)):
            top_k_indices(x, k, out=o)

    fns = [lambda x=x, o=o: call(x, o) for x, o in zip(buffers, outs, strict=True)]
    fns[0]()
    exact = torch.equal(outs[0], reference_topk.top_k_indices(buffers[0], k))
    return exact, graph_time_us(fns, calls)


def variant_experiment(name: str, shapes, variants_of, rounds: int, k: int = K) -> None:
    """The loop of a top-k settings experiment: at each (rows, cols) of ``shapes``,
    ``variants_of(default)`` gives the variants ({label: settings}), timed in alternation
    ``rounds`` times (``time_settings``); a line a shape (the median and each round's time,
    and whether every result equalled the reference), all lines again at the end."""
    from .. import topk

    device = torch.device("cuda")
    lines = []
    for rows, cols in shapes:
        buffers, outs = logits_and_outputs(rows, cols, device, k)
        variants = variants_of(topk.topk_settings(rows, cols, k))
        times = {label: [] for label in variants}
        exact = True
        for _ in range(rounds):
            for label, settings in variants.items():
                same, us = time_settings(buffers, outs, settings, k)
                exact &= same
                times[label].append(us)
        lines.append(f"{rows:>5} x {cols:<6} " + "  ".join(
            f"{label} {statistics.median(t):7.2f} us ({' '.join(f'{v:.1f}' for v in t)})"
            for label, t in times.items()) + ("" if exact else "  MISMATCH"))
        print(lines[-1], flush=True)
        del buffers, outs
        torch.cuda.empty_cache()
    print(f"# python benchmarks/{name}.py ({torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}; medians of {rounds} alternated rounds, each round in brackets)")
    print("\n".join(lines))


def format_table(result: dict) -> str:
    rows = [r for r in result["records"] if r["op"] == "topk"]
    copy = result["copy_GBps"]
    lines = [f"{'rows x cols':>13} {'k':>5} {'ours us':>8} {'torch us':>9} {'x torch':>8} "
             f"{'% copy':>7}"]
    for r in (r for r in rows if r["impl"] == "indexer_kcache"):
        torch_us = next(p["gpu_us"] for p in rows if p["impl"] == "torch-topk"
                        and (p["rows"], p["cols"], p["k"]) == (r["rows"], r["cols"], r["k"]))
        pct = 100 * r["bytes"] / r["gpu_us"] / 1e3 / copy
        lines.append(f"{r['rows']:>5} x {r['cols']:<6} {r['k']:>5} {r['gpu_us']:8.1f} "
                     f"{torch_us:9.1f} {torch_us / r['gpu_us']:7.2f}x {pct:6.1f}%")
    return "\n".join(lines)


def plot(result: dict, path: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in result["records"] if r["op"] == "topk"]
    if not rows:
        return False
    shapes = sorted({(r["rows"], r["cols"]) for r in rows}, key=lambda s: s[0] * s[1])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, impl in enumerate(("indexer_kcache", "torch-topk")):
        us = {(r["rows"], r["cols"]): r["gpu_us"] for r in rows if r["impl"] == impl}
        ax.bar([j + 0.4 * i for j in range(len(shapes))], [us.get(s, 0) for s in shapes], 0.4,
               label=impl)
    ax.set_xticks([j + 0.2 for j in range(len(shapes))], [f"{r}x{c}" for r, c in shapes])
    ax.set_ylabel(f"GPU time per call, k = {rows[0]['k']} (us)")
    ax.set_title(f"top-k selection on {result['gpu']}")
    return save_plot(fig, ax, path)
