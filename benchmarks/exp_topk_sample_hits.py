"""Experiment: a smaller sample for the top-k's threshold. The sample kernel reads enough
columns of a long row to expect ``SAMPLE_HITS`` (128) of its top k among them, and its
time grows with the sample (BENCHMARKS.md, "The top-k"); the threshold it sets is then
less tight, and the filter passes more candidates to the select and rank kernels, whose
time is not in proportion to their candidates. The default against 64 and 32 expected
hits (half and a quarter of the sample; rows of 8192 columns, which sample the least
the settings allow, 1024 columns or 256 expected hits, half and a quarter of that), with the candidate
block sized for the looser threshold as the settings size it and with the default's;
CUDA-graph replay, the
variants alternated three times, medians; every result checked against the reference.

    python benchmarks/exp_topk_sample_hits.py
"""

from __future__ import annotations

from indexer_kcache import topk
from indexer_kcache.bench.topk import variant_experiment
from indexer_kcache.util import next_power_of_2

SHAPES = [(1, 131072), (64, 65536), (128, 65536), (512, 8192), (64, 8192)]


def variants_for(cols: int, k: int = 2048):
    def variants(default):
        found = {"default": default}
        if not default.splits:
            return found
        want_block = max(next_power_of_2(min(k, cols)), 32)
        for hits in (64, 32):
            # Below MIN_SAMPLE too: rows of 8192 columns sample 1024 (256 expected hits).
            sample = min(max(next_power_of_2(hits * cols // k), topk.SAMPLE_CHUNK * 8),
                         topk.MAX_SAMPLE)
            if default.sample_block == topk.MIN_SAMPLE:
                sample = default.sample_block * hits // 128
            if sample == default.sample_block:
                continue
            block = min(max(2 * want_block, next_power_of_2(
                -(-5 * topk.expected_candidates(cols, k, sample) // 4))), topk.MAX_SORTED)
            found[f"hits {hits}"] = default._replace(sample_block=sample, block=block)
            if block != default.block:
                found[f"hits {hits} block {default.block}"] = default._replace(sample_block=sample)
        return found
    return variants


if __name__ == "__main__":
    for rows, cols in SHAPES:
        variant_experiment("exp_topk_sample_hits", [(rows, cols)], variants_for(cols), rounds=3)
