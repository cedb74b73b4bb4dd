"""Experiment: each program's first block-table line prefetched at its start (right after
the dependent-launch wait, beside the context-length read), into L1 or L2
(``LogitsSettings.prefetch_table`` 1 or 2), against none, the settings otherwise the
defaults. Without it the tile loop asks for its first block id only once the context
length has arrived (the loop's bound), so a program's first page waits on three
dependent reads; with it, on two. Variants timed in alternation, ``--rounds`` times each;
each one's logits are checked bit for bit against the first variant's.

    python benchmarks/exp_scorer_prefetch.py [--rounds 3]

It runs at 07ed6a6, which added the setting; the setting was removed after it measured no
gain (BENCHMARKS.md, "The scorer").
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                      (64, 32768, 1), (128, 65536, 1), (64, 8192, 4)],
    ("mxfp4", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 32768, 1)],
}
VARIANTS = {"none": 0, "L1": 1, "L2": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    copy = copy_bandwidth_GBps()
    lines, records = [], []
    for (fmt, q_form), shapes in SHAPES.items():
        for batch, context, next_n in shapes:
            calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, next_n)
            _, default, _ = logits_gpu.ours(calls[0])
            variants = {name: default._replace(prefetch_table=level)
                        for name, level in VARIANTS.items()}
            same, times, median = logits_gpu.time_variants(calls, variants, args.rounds)
            lines.append(
                f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} n{next_n} pdl {default.pdl}  "
                + "  ".join(
                    f"{name} {median[name]:.2f} us ({logits_gpu.pct(nbytes, median[name], copy):.0f} %"
                    f"{'' if same[name] else ', DIFFERS'}) [" + " ".join(f"{t:.2f}" for t in times[name])
                    + "]" for name in variants))
            print(lines[-1], flush=True)
            records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                                next_n=next_n, bytes=nbytes, default=default._asdict(),
                                times_us=times, identical=same))
            del calls
    logits_gpu.report("exp_scorer_prefetch", copy, records, lines)


if __name__ == "__main__":
    main()
