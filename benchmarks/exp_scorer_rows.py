"""Experiment: ``next_n`` 4 with fewer query rows a program. The default stacks a
sequence's four rows in one dot (each key read once, 256 columns, two programs an SM);
two or one rows a program read each page two or four times, from programs that run side
by side (the row groups of a sequence are neighbours in the grid), so that the L2 may
serve the repeats, with fewer registers and more programs an SM. Variants timed in
alternation, ``--rounds`` times each; logits compared with the default's (a different
dot shape may round differently: ``max |diff|`` is printed).

    python benchmarks/exp_scorer_rows.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(64, 8192, 4), (64, 32768, 4)],
    ("mxfp4", "e4m3"): [(64, 8192, 4), (64, 32768, 4)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    copy = copy_bandwidth_GBps()
    lines, records = [], []
    for (fmt, q_form), shapes in SHAPES.items():
        for batch, context, next_n in shapes:
            calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, next_n)
            run, default, out = logits_gpu.ours(calls[0])
            run()
            want = out.clone()
            variants = {"default": default}
            for rows in (2, 1):
                for longer in (1, 2):
                    variants[f"rows {rows} x{longer}"] = default._replace(
                        rows=rows, splits=max(default.splits // longer, 1),
                        max_registers=128 if rows == 1 and fmt == "mxfp4" else 0)
            diffs = {}
            for name, settings in variants.items():
                run, _, out = logits_gpu.ours(calls[0], settings)
                run()
                seen = ~torch.isneginf(want)
                diffs[name] = float((out[seen] - want[seen]).abs().max())
            runs = {name: [logits_gpu.ours(c, s)[0] for c in calls] for name, s in variants.items()}
            times = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name in variants:
                    times[name].append(logits_gpu.bench.graph_time_us(runs[name], 40))
            median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
            lines.append(
                f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} n{next_n}  " + "  ".join(
                    f"{name} {median[name]:.2f} us ({logits_gpu.pct(nbytes, median[name], copy):.0f} %,"
                    f" max|diff| {diffs[name]:.2g})" for name in variants))
            print(lines[-1], flush=True)
            records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                                next_n=next_n, bytes=nbytes, default=default._asdict(),
                                times_us=times, max_abs_diff=diffs))
            del calls
    logits_gpu.report("exp_scorer_rows", copy, records, lines)


if __name__ == "__main__":
    main()
