"""Experiment: how many pages the scorer's tile loop keeps in flight. The page load
depends on the block id loaded before it, and Triton's software pipeliner splits the
loop's stages between the two: by an offline sm_90 compile (Triton 3.6) the default six
stages hold two pages a program in shared memory (and four block ids); eight stages hold
three, ten four. The default against eight and ten stages, at the large shapes of every
key format with e4m3 queries (MXFP4 queries at one); variants timed in alternation,
``--rounds`` times each, each one's logits checked bit for bit against the default's.

    python benchmarks/exp_scorer_key_buffers.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(1, 131072, 1), (8, 32768, 1), (64, 32768, 1), (128, 65536, 1)],
    ("mxfp4", "e4m3"): [(8, 32768, 1), (64, 8192, 1), (64, 32768, 1), (128, 65536, 1)],
    ("mxfp4", "mxfp4"): [(64, 32768, 1)],
}


def deeper(default, case):
    found = {"default": default}
    for stages in (8, 10):
        if stages != default.num_stages:
            found[f"s{stages}"] = default._replace(num_stages=stages)
    return found


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_key_buffers", SHAPES, deeper,
                                  logits_gpu.experiment_rounds(__doc__))
