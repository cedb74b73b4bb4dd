"""Experiment: MXFP4 keys (e4m3 and MXFP4 queries) at the shapes where the settings keep
three pipelining stages (fewer than ``16 * PROGRAMS_PER_SM`` tiles a wave): three, four
and six stages, the default tiles a program and twice as many, the default register cap
and 96. Variants timed in alternation, ``--rounds`` times each; each one's logits checked
bit for bit against the default's.

    python benchmarks/exp_scorer_fp4_stages.py [--rounds 3] [--set sweep|deep]

``--set deep``: the default against six stages only (the default tiles and cap) at the
other shapes whose settings keep three: MXFP4 and bf16 queries, ``next_n`` 4, the
largest shapes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps  # noqa: E402

SWEEP = {  # (cache, query form): [(batch, context, next_n)]
    ("mxfp4", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                        (64, 32768, 1)],
    ("mxfp4", "mxfp4"): [(1, 131072, 1), (8, 32768, 1), (64, 8192, 1)],
}
DEEP = {
    ("mxfp4", "e4m3"): [(64, 8192, 4), (64, 32768, 4)],
    ("mxfp4", "mxfp4"): [(1, 4096, 1), (64, 32768, 1), (128, 65536, 1), (64, 8192, 4),
                         (64, 32768, 4)],
    ("mxfp4", "bf16"): [(1, 131072, 1), (64, 8192, 1), (64, 32768, 1), (64, 32768, 4)],
    ("fp8", "bf16"): [(64, 32768, 4)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", choices=("sweep", "deep"), default="sweep")
    args = parser.parse_args()
    copy = copy_bandwidth_GBps()
    lines, records = [], []
    for (fmt, q_form), shapes in (SWEEP if args.set == "sweep" else DEEP).items():
        for batch, context, next_n in shapes:
            calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, next_n)
            _, default, _ = logits_gpu.ours(calls[0])
            tiles = -(-context // default.block_n)
            per_program = -(-tiles // default.splits)
            variants = {"default": default}
            grid = (itertools.product((3, 4, 6), (1, 2), (default.max_registers, 96))
                    if args.set == "sweep" else [(6, 1, default.max_registers)])
            for stages, longer, regs in grid:
                if (stages, longer, regs) == (default.num_stages, 1, default.max_registers):
                    continue
                name = f"s{stages} t{per_program * longer} r{regs}"
                if name in variants:
                    continue
                variants[name] = default._replace(
                    num_stages=stages, splits=-(-tiles // (per_program * longer)),
                    max_registers=regs)
            same, times, median = logits_gpu.time_variants(calls, variants, args.rounds)
            head = (f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} default s{default.num_stages}"
                    f" t{per_program} r{default.max_registers} pdl{int(default.pdl)}"
                    f" hint{default.hint_tiles}")
            ranked = sorted(variants, key=lambda name: median[name])
            body = "  ".join(
                f"{name} {median[name]:.2f} ({logits_gpu.pct(nbytes, median[name], copy):.0f} %"
                f"{'' if same[name] else ' DIFFERS'})" for name in ranked)
            lines.append(head + "\n    " + body)
            print(lines[-1], flush=True)
            records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                                next_n=next_n, bytes=nbytes, default=default._asdict(),
                                times_us=times, identical=same))
            del calls
    logits_gpu.report(f"exp_scorer_fp4_stages_{args.set}", copy, records, lines)


if __name__ == "__main__":
    main()
