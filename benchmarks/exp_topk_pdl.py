"""Experiment: the top-k's four kernels launched without programmatic dependent launch,
with it and the next kernel released at once (``PDL_EARLY``), or with it and the next
kernel released as the programs exit (``PDL_AT_EXIT``), at the bench's shapes;
CUDA-graph replay, the three alternated twice (medians of two: their means; the committed
``h200-topk-pdl.txt`` was printed as the best of each).

    python benchmarks/exp_topk_pdl.py
"""

from __future__ import annotations

from indexer_kcache import topk
from indexer_kcache.bench.topk import SHAPES, variant_experiment


def variants(default):
    return {"no PDL": default._replace(pdl=topk.PDL_NONE),
            "early": default._replace(pdl=topk.PDL_EARLY),
            "at exit": default._replace(pdl=topk.PDL_AT_EXIT)}


if __name__ == "__main__":
    variant_experiment("exp_topk_pdl", SHAPES, variants, rounds=2)
