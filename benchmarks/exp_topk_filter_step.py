"""Experiment: the top-k filter kernel's step (columns a program loads, counts and appends
at once, with one atomic) at 1024 (the default, four warps, one or two steps a program)
against larger steps with more warps (2048 at four warps, 4096 at eight, 8192 at
sixteen, one step a program), so that each program has more bytes in flight and fewer
round trips (block-wide sum, atomic, scan) per byte. A larger step means fewer filter
programs: each variant also takes the dependent-launch choice the settings
make for its program count. CUDA-graph replay, the variants alternated three times,
medians; every result checked against the reference.

    python benchmarks/exp_topk_filter_step.py
"""

from __future__ import annotations

from indexer_kcache import topk
from indexer_kcache.bench.topk import variant_experiment

SHAPES = [(1, 131072), (64, 8192), (64, 65536), (128, 65536), (512, 8192)]
STEPS = ((2048, 4), (4096, 8), (8192, 16))  # (columns a step, warps)


def variants_for(rows: int):
    def variants(default):
        found = {"default": default}
        if not default.splits:
            return found
        cols = default.splits * default.step * default.split_steps
        for step, warps in STEPS:
            if step > cols:
                continue
            splits = -(-cols // step)
            programs = rows * splits
            found[f"step {step} w{warps}"] = default._replace(
                step=step, filter_warps=warps, split_steps=1, splits=splits,
                pdl=topk.PDL_EARLY if programs <= topk.PDL_MAX_PROGRAMS else topk.PDL_AT_EXIT)
        return found
    return variants


if __name__ == "__main__":
    for rows, cols in SHAPES:
        variant_experiment("exp_topk_filter_step", [(rows, cols)], variants_for(rows), rounds=3)
