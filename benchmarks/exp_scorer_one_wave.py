"""Experiment: the scorer's few-long-rows shapes as one wave of long programs (at most one
an SM, released at once, with and without the L2 hints) against the default settings
(about four programs an SM, released as they exit). The variants are timed in
alternation, ``--rounds`` times each; each one's logits are checked bit for bit against
the default's first.

    python benchmarks/exp_scorer_one_wave.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.checks import PDL_EARLY  # noqa: E402

SHAPES = {("fp8", "e4m3"): [(1, 131072, 1), (8, 32768, 1)],
          ("mxfp4", "e4m3"): [(1, 131072, 1), (8, 32768, 1)]}


def variants(default, case):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    wave = default._replace(splits=max(sms // case["batch"], 1), pdl=PDL_EARLY, hint_tiles=0)
    return {"default": default, "one wave": wave,
            "one wave, hint 2": wave._replace(hint_tiles=2)}


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_one_wave", SHAPES, variants,
                                  logits_gpu.experiment_rounds(__doc__))
