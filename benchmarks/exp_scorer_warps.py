"""Experiment: the scorer's programs at eight warps instead of four. The stacked dot of a
tile (64 keys by ``rows x 64`` heads) then splits its columns over two warp groups, so
each thread holds half the float32 result: four rows a program drop from 253 registers
a thread to 162 (FP8 keys, an offline sm_90 compile with Triton 3.6), and to 128 with a
cap (96 bytes of spills), two programs of eight warps an SM instead of two of four.
Variants timed in alternation, ``--rounds`` times each; each one's logits checked bit for
bit against the default's.

    python benchmarks/exp_scorer_warps.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(64, 8192, 4), (64, 32768, 4), (64, 32768, 2), (1, 131072, 1),
                      (8, 32768, 1), (64, 32768, 1)],
    ("mxfp4", "e4m3"): [(64, 8192, 4), (64, 32768, 4), (64, 32768, 1)],
}


def variants(default, case):
    found = {"default": default, "w8": default._replace(num_warps=8)}
    if case["next_n"] > 1:
        found["w8 cap 128"] = default._replace(num_warps=8, max_registers=128)
        found["w8 cap 128 x2"] = default._replace(num_warps=8, max_registers=128,
                                                  splits=max(default.splits // 2, 1))
    return found


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_warps", SHAPES, variants,
                                  logits_gpu.experiment_rounds(__doc__))
