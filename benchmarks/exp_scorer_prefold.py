"""Experiment: scaled queries (MXFP4 or e4m3 with MX scales) folded to e4m3 once per row
group by a kernel of their own (``fold_queries_kernel``, setting ``prefold``) before the
scorer, instead of once in every program that scores the group: the fold is most of a
short program's time (BENCHMARKS.md, "The scorer"). Also with twice the splits (the
settings halve them for folded MXFP4 programs: the fold's cost a program) and with the
first pages hinted into L2 where the launch is released at once. Variants timed in
alternation, ``--rounds`` times each; each one's logits checked bit for bit against the
default's.

    python benchmarks/exp_scorer_prefold.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.logits import HINT_TILES  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("mxfp4", "mxfp4"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                         (64, 32768, 1), (128, 65536, 1), (64, 32768, 4)],
    ("fp8-mx", "e4m3-mx"): [(1, 4096, 1), (64, 32768, 1)],
}


def variants(default, case):
    found = {"default": default, "prefold": default._replace(prefold=True),
             "prefold x2": default._replace(prefold=True, splits=min(2 * default.splits,
                                                                      case["tiles"]))}
    if default.pdl == 1:
        found["prefold hint"] = default._replace(prefold=True, hint_tiles=HINT_TILES)
    return found


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_prefold", SHAPES, variants,
                                  logits_gpu.experiment_rounds(__doc__))
