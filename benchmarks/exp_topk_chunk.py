"""Experiment: the top-k's rank kernel at 128 and 256 pairs a program (before this
experiment, 256 from 4M elements and 128 below; now 128 everywhere) at 8192 and 65536
columns; CUDA-graph replay, the two alternated three times, medians; each one's indices
checked against the reference.

    python benchmarks/exp_topk_chunk.py
"""

from __future__ import annotations

from indexer_kcache.bench.topk import variant_experiment

SHAPES = [(512, 8192), (256, 8192), (1024, 8192), (128, 65536), (64, 65536)]


def variants(default):
    return {f"chunk {chunk}": default._replace(chunk=chunk) for chunk in (128, 256)}


if __name__ == "__main__":
    variant_experiment("exp_topk_chunk", SHAPES, variants, rounds=3)
