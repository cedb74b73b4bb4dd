"""MXFP4 at ratio 2 and 256K tokens: the launcher's setting beside L2 hints of the indices
a program ahead and other register caps; float32 keys (both formats, both ratios) beside
bf16 ones; float32 keys into MXFP4 at ratio 2 by pairs instead of compacted ranges; 32
pairs a program (two threads a key) instead of 16 (four), under register caps that keep
more keys in flight an SM. In alternated rounds.

    python benchmarks/exp_store_mxfp4_ratio2.py [--calls 50] [--rounds 2]
        [--parts settings keys float-pairs | program]

Every setting's bytes are checked against the reference on a batch with poisoned keys
(float32 keys: also against the same call with the keys rounded to bf16), then timed by
CUDA-graph replay (``store_ratio2_gpu.Run``). ``$OUT`` (if set) receives
``store_mxfp4_ratio2.{json,txt}``.
"""

from __future__ import annotations

import argparse
import sys

import torch

from indexer_kcache.store import StoreSettings
from store_ratio2_gpu import DEFAULT_SETTINGS, experiment

TOKENS = 262144
PARTS = ("settings", "keys", "float-pairs", "program")
# The settings compared, spelled out (the launcher's own choice moves with its revision).
PAIRS = StoreSettings(16, 2, False, 96)  # ratio-2 pairs above 64K tokens, no hints
COMPACTED = StoreSettings(8, 1, False, 0, True, 2)  # float32 keys into MXFP4 before 4076dda


def main() -> None:
    parts = argparse.ArgumentParser(add_help=False)
    parts.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS[:3]))
    known, sys.argv[1:] = parts.parse_known_args()  # the rest: the shared options
    args, run = experiment(__doc__)
    for rnd in range(args.rounds):
        if "settings" in known.parts:
            run.measure("mxfp4", 2, TOKENS, PAIRS, f"no-hint{rnd}")
            for ahead in (660, 1320, 2640):
                run.measure("mxfp4", 2, TOKENS, PAIRS._replace(hint_ahead=ahead),
                            f"hint{rnd}")
            for cap in (80, 88, 104, 112, 128, 0):
                run.measure("mxfp4", 2, TOKENS, PAIRS._replace(max_registers=cap),
                            f"cap{rnd}")
        if "keys" in known.parts:  # the launcher's own settings
            for fmt in ("fp8", "mxfp4"):
                for ratio in (1, 2):
                    for dtype in (torch.bfloat16, torch.float32):
                        setting = DEFAULT_SETTINGS(TOKENS, ratio, fmt == "mxfp4", False,
                                                   key_bytes=dtype.itemsize)
                        run.measure(fmt, ratio, TOKENS, setting, f"keys{rnd}",
                                    k_pre_dtype=dtype)
        if "float-pairs" in known.parts:
            f32 = torch.float32
            run.measure("mxfp4", 1, TOKENS, DEFAULT_SETTINGS(TOKENS, 1, True, False, key_bytes=4),
                        f"f32r1-{rnd}", k_pre_dtype=f32)
            run.measure("mxfp4", 2, TOKENS, COMPACTED, f"f32-{rnd}", k_pre_dtype=f32)
            for ahead in (0, 660):
                for cap in (96, 128):
                    setting = PAIRS._replace(hint_ahead=ahead, max_registers=cap)
                    run.measure("mxfp4", 2, TOKENS, setting, f"f32-{rnd}", k_pre_dtype=f32)
            for ahead in (0, 660):  # bf16 keys, beside ratio 1, for the ratio-2 speed-up
                run.measure("mxfp4", 2, TOKENS, PAIRS._replace(hint_ahead=ahead),
                            f"bf16-{rnd}")
            run.measure("mxfp4", 1, TOKENS, DEFAULT_SETTINGS(TOKENS, 1, True, False),
                        f"bf16r1-{rnd}")
        if "program" in known.parts:
            # 16 pairs on 2 warps (96 registers, ten programs an SM: 160 keys) against 32
            # (two threads a key, fewer instructions a key: seven programs an SM at 144
            # registers, 224 keys; eight at 128, with spills), hints at the same distance
            # in tokens. (An earlier form of the kernel took 32 pairs 12 % slower, at 167
            # registers: "L2 hints of the key and cos/sin rows" in BENCHMARKS.md.)
            for fmt, wide in (("mxfp4", [(144, True), (128, True), (160, True), (0, True),
                                         (144, False)]),
                              ("fp8", [(144, False), (128, False)])):
                run.measure(fmt, 2, TOKENS, PAIRS._replace(hint_ahead=660), f"p16-{rnd}")
                for cap, scales in wide:
                    setting = StoreSettings(32, 2, False, cap, hint_ahead=330,
                                            group_scales=scales)
                    run.measure(fmt, 2, TOKENS, setting, f"p32-{rnd}")
    run.save("store_mxfp4_ratio2")


if __name__ == "__main__":
    main()
