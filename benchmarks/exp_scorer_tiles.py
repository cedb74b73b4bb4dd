"""Experiment: the scorer with MXFP4 keys in tiles of 128 keys (4 or 8 warps, 3 or 6 stages,
with and without a register cap) against the default 64-key tile, each variant checked
against the contract's bound first.

    python benchmarks/exp_scorer_tiles.py
"""

from __future__ import annotations

import torch

from indexer_kcache import layout
from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.bench import timing
from indexer_kcache.logits import Q_BF16, Q_E4M3, logits_settings

SHAPES = [("mxfp4", "e4m3", 64, 32768), ("mxfp4", "e4m3", 128, 65536),
          ("mxfp4", "e4m3", 8, 32768), ("mxfp4", "bf16", 64, 32768)]


def main() -> None:
    copy = timing.copy_bandwidth_GBps()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy {copy:.0f} GB/s")
    for fmt, q_form, batch, context in SHAPES:
        fp4, mx = layout.FORMATS[fmt]
        rotations, nbytes = bench_logits.make_calls(fmt, q_form, batch, context, 1,
                                                    torch.device("cuda"))
        default = logits_settings(batch, 1, bench_logits.HEADS, context, fp4,
                                  Q_BF16 if q_form == "bf16" else Q_E4M3, sm_count, False, True)
        variants = {"default": default}
        for stages in (3, 6):
            for registers in (0, 128):
                variants[f"n128 w8 s{stages} r{registers}"] = default._replace(
                    block_n=128, num_warps=8, num_stages=stages, max_registers=registers)
        variants["n128 w4 s3 r0"] = default._replace(block_n=128, num_warps=4, num_stages=3,
                                                     max_registers=0)
        lines = []
        for name, settings in variants.items():
            with logits_settings.override(settings):
                exact = bench_logits.within_bound(rotations[0], fp4, mx)
                us = timing.graph_time_us([bench_logits.scorer_call(c) for c in rotations], 30)
            share = 100 * nbytes / us / 1e3 / copy
            lines.append(f"{name} {us:.1f} ({share:.0f} %){'' if exact else ' OUTSIDE THE BOUND'}")
        print(f"{fmt} {q_form} {batch}x{context} {default}:\n   " + "\n   ".join(lines),
              flush=True)
        del rotations


if __name__ == "__main__":
    main()
