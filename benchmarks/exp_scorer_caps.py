"""Experiment: register caps for more scorer programs an SM. By an offline sm_90 compile
(Triton 3.6) the MXFP4 tile loop (e4m3 queries, one row a program) keeps its length
under a cap of 80 registers (300 instructions a tile, against 302 at the default 96: the
spills are outside the loop), which fits six 4-warp programs an SM instead of five, and
72 fits seven (321 a tile); FP8's loop takes 195 instructions at 80 (188 uncapped, 86
registers: five programs) and 216 at 72. The default against those caps at the shapes
with many programs; variants timed in alternation, ``--rounds`` times each, each one's
logits checked bit for bit against the default's.

    python benchmarks/exp_scorer_caps.py [--rounds 3] [--set all | fp8]

``--set fp8``: FP8 keys only, the default against a cap of 80, at its many-program shapes.
``--set mxfp4-loose``: MXFP4 keys against e4m3 queries, the default against looser caps
(104, 112, 128 registers and none): for another Triton's code (``triton_cubins.py``),
which spills more under the default's.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("mxfp4", "e4m3"): [(8, 32768, 1), (64, 8192, 1), (64, 32768, 1), (128, 65536, 1)],
    ("mxfp4", "mxfp4"): [(64, 32768, 1), (128, 65536, 1)],
    ("fp8", "e4m3"): [(1, 131072, 1), (8, 32768, 1), (64, 32768, 1), (128, 65536, 1)],
}


def capped(default, case):
    found = {"default": default}
    for cap in (72, 80, 88, 96):
        if cap != default.max_registers:
            found[f"r{cap}"] = default._replace(max_registers=cap)
    return found


FP8_SHAPES = {("fp8", "e4m3"): [(64, 8192, 1), (64, 32768, 1), (128, 65536, 1)]}


def capped_80(default, case):
    return {"default": default, "r80": default._replace(max_registers=80)}


MXFP4_SHAPES = {("mxfp4", "e4m3"): [(8, 32768, 1), (64, 8192, 1), (64, 32768, 1), (128, 65536, 1)]}


def loosened(default, case):
    found = {"default": default}
    for cap in (104, 112, 128, 0):
        found[f"r{cap}" if cap else "uncapped"] = default._replace(max_registers=cap)
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", choices=("all", "fp8", "mxfp4-loose"), default="all")
    args = parser.parse_args()
    shapes, variants = {"all": (SHAPES, capped), "fp8": (FP8_SHAPES, capped_80),
                        "mxfp4-loose": (MXFP4_SHAPES, loosened)}[args.set]
    logits_gpu.variant_experiment(f"exp_scorer_caps_{args.set}", shapes, variants, args.rounds,
                                  ranked=True)
