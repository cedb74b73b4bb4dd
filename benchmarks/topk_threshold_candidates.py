"""The top-k's candidates per row under the sample kernel's threshold rule, emulated on the
CPU: for rows of normal logits with and without an offset, how many elements reach the
threshold (the candidate buffer holds ``block`` of them; past that, a row falls back to
the radix selection), with the threshold rounded to its key's top 16 bits (the rule before)
or to 16 bits past the sampled keys' common prefix (``topk_sample_kernel``'s rule now).

    python benchmarks/topk_threshold_candidates.py

The settings (sample, block) are ``topk_settings``' for each shape on a GPU; five rows each.
"""

from __future__ import annotations

import math

import torch

from indexer_kcache import topk
from indexer_kcache.reference.topk import kernel_keys, sample_threshold

K = 2048
SHAPES = [(64, 65536), (512, 8192), (1, 131072)]
OFFSETS = {"N(0,1)": 0.0, "5 + N(0,1)": 5.0, "50 + N(0,1)": 50.0, "-50 + N(0,1)": -50.0,
           "1000 + N(0,1)": 1000.0}


def top_bits_threshold(keys: torch.Tensor, rank: int, bits: int = 16) -> int:
    """The rule before: the ``rank``-th largest key rounded down to its top ``bits`` bits."""
    return int(keys.sort(descending=True).values[rank - 1]) >> (32 - bits) << (32 - bits)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    print(f"{'rows x cols':>12} {'logits':>14} {'block':>6}  candidates a row: top 16 bits | "
          "16 bits past the common prefix")
    for rows, cols in SHAPES:
        s = topk.topk_settings(rows, cols, K, interpreted=False)
        sampled = torch.arange(cols) % topk.sample_stride(cols, s.sample_block) < topk.SAMPLE_CHUNK
        m = int(sampled.sum())
        expected = -(-K * m // cols)
        rank = expected + int(math.sqrt(expected) * topk.MARGIN_SIGMAS.value) + \
            topk.MARGIN_EXTRA.value
        for name, offset in OFFSETS.items():
            before, now = [], []
            for _ in range(5):
                keys = kernel_keys(offset + torch.randn(cols, generator=g))
                before.append(int((keys >= top_bits_threshold(keys[sampled], rank)).sum()))
                now.append(int((keys >= sample_threshold(keys[sampled], rank)).sum()))
            print(f"{rows:5} x {cols:<6} {name:>14} {s.block:6}  {before} | {now}")


if __name__ == "__main__":
    main()
