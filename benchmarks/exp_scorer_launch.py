"""Experiment: the scorer with programmatic dependent launch (the next call's programs
launched while this one runs: PDL_EARLY, PDL_AT_EXIT) and with ``relu(x) w`` computed as
``(x + |x|) (w / 2)`` (``relu_by_abs``), against its defaults, on the bench's shapes
(CUDA-graph replay of back-to-back calls over rotations larger than the L2). Variants
timed in alternation, ``--rounds`` times each; each one's logits checked bit for bit
against the default's.

    python benchmarks/exp_scorer_launch.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402

SHAPES = {
    ("fp8", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                      (64, 32768, 1), (128, 65536, 1)],
    ("mxfp4", "e4m3"): [(1, 4096, 1), (8, 32768, 1), (64, 32768, 1), (128, 65536, 1)],
    ("mxfp4", "mxfp4"): [(64, 32768, 1)],
}
VARIANTS = {  # name: changes to the default settings
    "pdl early": dict(pdl=1),
    "pdl at exit": dict(pdl=2),
    "relu by abs": dict(relu_by_abs=True),
    "both (at exit)": dict(pdl=2, relu_by_abs=True),
}


def variants(default, case):
    return {"default": default,
            **{name: default._replace(**changes) for name, changes in VARIANTS.items()}}


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_launch", SHAPES, variants,
                                  logits_gpu.experiment_rounds(__doc__))
