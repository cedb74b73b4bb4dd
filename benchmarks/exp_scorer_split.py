"""Experiment: how the few-long-rows shapes split their positions over programs. For
each shape, the default settings against shorter programs (1 or 2 tiles, more of them
resident an SM with a shallower pipeline) and longer ones, with the dependent-launch
modes around the default's. Variants timed in alternation, ``--rounds`` times each; each
one's logits checked bit for bit against the default's.

    python benchmarks/exp_scorer_split.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.kernels.dependent_launch import PDL_AT_EXIT, PDL_NONE  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(1, 131072, 1), (8, 32768, 1), (64, 8192, 1)],
    ("mxfp4", "e4m3"): [(1, 131072, 1), (8, 32768, 1)],
}
# (tiles a program, pipelining stages, dependent-launch mode)
CANDIDATES = [(1, 1, PDL_NONE), (1, 1, PDL_AT_EXIT), (2, 2, PDL_NONE), (2, 2, PDL_AT_EXIT),
              (2, 3, PDL_AT_EXIT), (4, 4, PDL_AT_EXIT), (8, 6, PDL_AT_EXIT)]


def variants(default, case):
    found = {"default": default}
    for per_program, stages, pdl in CANDIDATES:
        found[f"t{per_program} s{stages} pdl{int(pdl)}"] = default._replace(
            splits=-(-case["tiles"] // per_program), num_stages=stages, pdl=pdl, hint_tiles=0)
    return found


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_split", SHAPES, variants,
                                  logits_gpu.experiment_rounds(__doc__))
