"""Experiment: the scorer's kernel with deeper software pipelining and other program
sizes, against its defaults, on the issue's shapes (CUDA-graph replay over rotations
larger than the L2).

    python benchmarks/exp_scorer_stages.py
"""

from __future__ import annotations

import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps, graph_time_us  # noqa: E402

CASES = [  # (cache, q form, batch, context, next_n, stages, tiles a program)
    *[("fp8", "e4m3", b, c, 1, (3, 5, 6, 8), (8, 16, 32, 64))
      for b, c in [(1, 131072), (8, 32768), (64, 8192), (64, 32768), (128, 65536)]],
    *[("fp8", "e4m3", b, c, 4, (3, 6), (4, 8, 16)) for b, c in [(64, 8192), (64, 32768)]],
    *[("mxfp4", "e4m3", b, c, 1, (3, 4, 6), (16, 32, 64))
      for b, c in [(8, 32768), (64, 32768), (128, 65536)]],
    ("fp8", "bf16", 64, 32768, 1, (3, 6), (16, 32, 64)),
]


def main():
    copy = copy_bandwidth_GBps()
    lines, records = [], []
    for fmt, q_form, batch, context, next_n, stages, sizes in CASES:
        calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, next_n)
        _, default, _ = logits_gpu.ours(calls[0])
        tiles = -(-context // default.block_n)
        results = {"default": graph_time_us([logits_gpu.ours(c)[0] for c in calls], 40)}
        for s, x in itertools.product(stages, sizes):
            settings = default._replace(num_stages=s, splits=max(1, -(-tiles // x)))
            try:
                results[f"s{s} x{x}"] = graph_time_us(
                    [logits_gpu.ours(c, settings)[0] for c in calls], 40)
            except Exception as e:  # noqa: BLE001
                results[f"s{s} x{x}"] = f"{type(e).__name__}: {str(e)[:120]}"
        timed = sorted(((v, k) for k, v in results.items() if isinstance(v, float)))
        pct = lambda us, nbytes=nbytes: nbytes / (us * 1e-6) / 1e9 / copy * 100  # noqa: E731
        d = results["default"]
        name = f"{fmt:5} {q_form:5} {batch}x{context} n{next_n}"
        lines.append(f"{name}: default {default.num_stages}/{-(-tiles // default.splits)} "
                     f"{d:.1f} us ({pct(d):.0f} %); best " + ", ".join(
                         f"{k} {v:.1f} ({pct(v):.0f} %)" for v, k in timed[:5]))
        records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                            next_n=next_n, bytes=nbytes, default=default._asdict(),
                            results=results))
        del calls
        print(lines[-1], flush=True)
    logits_gpu.report("exp_scorer_stages", copy, records, lines)


if __name__ == "__main__":
    main()
