"""Experiment: pipelining depth of the scorer's MXFP4 tile loop (e4m3, MXFP4 and bf16
queries): three, four and six stages, the default tiles a program and twice as many, the
default register cap and 96. Variants timed in alternation, ``--rounds`` times each;
each one's logits checked bit for bit against the default's. (It measured the settings
before f4513be, which kept three stages for MXFP4 keys but with e4m3 queries and many
programs; the settings now take six.)

    python benchmarks/exp_scorer_fp4_stages.py [--rounds 3] [--set sweep|deep]

``--set deep``: the default against six stages only (the default tiles and cap), at MXFP4
and bf16 queries, ``next_n`` 4 and the largest shapes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402

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


def sweep(default, case):
    per_program = -(-case["tiles"] // default.splits)
    found = {"default": default}
    for stages, longer, cap in itertools.product((3, 4, 6), (1, 2), (default.max_registers, 96)):
        name = f"s{stages} t{per_program * longer} r{cap}"
        if (stages, longer, cap) != (default.num_stages, 1, default.max_registers):
            found.setdefault(name, default._replace(
                num_stages=stages, splits=-(-case["tiles"] // (per_program * longer)),
                max_registers=cap))
    return found


def deep(default, case):
    found = {"default": default}
    if default.num_stages != 6:
        found["s6"] = default._replace(num_stages=6)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", choices=("sweep", "deep"), default="sweep")
    args = parser.parse_args()
    shapes, variants = (SWEEP, sweep) if args.set == "sweep" else (DEEP, deep)
    logits_gpu.variant_experiment(f"exp_scorer_fp4_stages_{args.set}", shapes, variants,
                                  args.rounds, ranked=True)


if __name__ == "__main__":
    main()
