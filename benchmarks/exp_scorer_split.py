"""Experiment: how the few-long-rows shapes split their positions over programs. For
each shape, the default settings against shorter programs (1 or 2 tiles, more of them
resident an SM with a shallower pipeline) and longer ones, with the dependent-launch
modes around the default's. Variants timed in alternation, ``--rounds`` times each; each
one's logits checked bit for bit against the default's.

    python benchmarks/exp_scorer_split.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps  # noqa: E402
from indexer_kcache.kernels.dependent_launch import PDL_AT_EXIT, PDL_NONE  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(1, 131072, 1), (8, 32768, 1), (64, 8192, 1)],
    ("mxfp4", "e4m3"): [(1, 131072, 1), (8, 32768, 1)],
}
# (tiles a program, pipelining stages, dependent-launch mode)
CANDIDATES = [(1, 1, PDL_NONE), (1, 1, PDL_AT_EXIT), (2, 2, PDL_NONE), (2, 2, PDL_AT_EXIT),
              (2, 3, PDL_AT_EXIT), (4, 4, PDL_AT_EXIT), (8, 6, PDL_AT_EXIT)]


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
            tiles = -(-context // default.block_n)
            variants = {"default": default}
            for per_program, stages, pdl in CANDIDATES:
                variants[f"t{per_program} s{stages} pdl{pdl}"] = default._replace(
                    splits=-(-tiles // per_program), num_stages=stages, pdl=pdl, hint_tiles=0)
            same, times, median = logits_gpu.time_variants(calls, variants, args.rounds)
            head = (f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} default t{-(-tiles // default.splits)}"
                    f" s{default.num_stages} pdl{default.pdl}")
            body = "  ".join(
                f"{name} {median[name]:.2f} ({logits_gpu.pct(nbytes, median[name], copy):.0f} %"
                f"{'' if same[name] else ' DIFFERS'})" for name in variants)
            lines.append(head + "\n    " + body)
            print(lines[-1], flush=True)
            records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                                next_n=next_n, bytes=nbytes, default=default._asdict(),
                                times_us=times, identical=same))
            del calls
    logits_gpu.report("exp_scorer_split", copy, records, lines)


if __name__ == "__main__":
    main()
