"""Experiment: the scorer with its L2 hints (the pages of each program's first 2 or 4 tiles
asked for into L2 before the dependent-launch wait, ``LogitsSettings.hint_tiles``) against
none (the settings otherwise the defaults), on shapes the settings launch dependently (CUDA-graph replay of
back-to-back calls over rotations larger than the L2). The variants are timed in
alternation, ``--rounds`` times each; each one's logits are checked bit for bit against
the unhinted launch's first.

    python benchmarks/exp_scorer_hint.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                      (64, 32768, 1), (64, 8192, 4)],
    ("mxfp4", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                        (64, 32768, 1)],
    ("mxfp4", "mxfp4"): [(1, 131072, 1)],
}
HINTS = (2, 4)  # tiles hinted a program


def variants(default, case):
    if not default.pdl:  # launched plainly: no hints
        return None
    return {"none": default._replace(hint_tiles=0),
            **{f"hint {n}": default._replace(hint_tiles=n) for n in HINTS}}


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_hint", SHAPES, variants,
                                  logits_gpu.experiment_rounds(__doc__))
