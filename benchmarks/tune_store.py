"""Launch-setting sweep for the store, graph-timed on a GPU:

    python benchmarks/tune_store.py [--formats fp8 mxfp4] [--ratios 1 2] [--calls 50]
                                    [--key-dtype float32]

For each size, every (tokens per program, warps, eager loads, register cap, compaction,
ranges per program) candidate of that size class, with programmatic dependent launch (PDL)
on, and the best one again with it off. Prints the best few per size. The bytes are checked
against the reference for every setting ('!' marks a mismatch).
"""

from __future__ import annotations

import argparse
import itertools

import torch

from indexer_kcache import bench, store

SMALL = [(1, 1, True, 0), (2, 1, True, 0), (4, 1, True, 0), (2, 2, True, 0), (4, 4, True, 0),
         (8, 4, True, 0), (1, 1, False, 0)]
MID = [(4, 1, True, 0), (8, 1, True, 0), (8, 2, True, 0), (16, 2, True, 0), (16, 4, True, 0),
       (4, 1, False, 0), (8, 1, False, 0), (8, 2, False, 0)]
LARGE = [(32, 2, True, 0), (32, 4, True, 0), (64, 4, True, 0), (32, 2, False, 0),
         (32, 4, False, 0), (64, 4, False, 0), (32, 4, False, 96), (32, 4, False, 88),
         (32, 4, False, 80), (32, 4, False, 72), (16, 2, False, 80), (32, 2, False, 128),
         (16, 2, False, 0), (16, 2, False, 96), (16, 2, False, 72), (16, 4, False, 0),
         (8, 1, False, 0), (8, 1, False, 80), (8, 2, False, 0), (16, 1, False, 0),
         (16, 2, True, 0), (16, 4, True, 0), (8, 2, True, 0), (64, 8, True, 0),
         (32, 2, True, 128)]
# The compacted path (ratio 2): (tokens per batch, warps, register cap, ranges per program).
COMPACT = [(16, 2, 0, 1), (16, 2, 0, 2), (16, 2, 0, 4), (16, 2, 168, 2), (16, 2, 128, 4),
           (8, 1, 0, 2), (8, 1, 0, 4), (32, 4, 0, 2)]
LARGE = [(*s, False, 1) for s in LARGE] + [(t, w, False, r, True, n) for t, w, r, n in COMPACT]
CANDIDATES = {1: SMALL, 64: SMALL, 512: SMALL, 4096: MID, 32768: LARGE, 262144: LARGE}
CANDIDATES = {t: [s if len(s) == 6 else (*s, False, 1) for s in c] for t, c in CANDIDATES.items()}


def label(setting) -> str:
    """(32, 4, True, 0, ...) -> 32x4e; (32, 4, False, 80, ...) -> 32x4r80 (register cap);
    (16, 2, False, 0, True, 2) -> 16x2c2 (compacted, 2 ranges a program)."""
    block_t, warps, eager, max_registers, compact, ranges = setting
    return (f"{block_t}x{warps}{'e' if eager else ''}" + f"r{max_registers}" * bool(max_registers)
            + f"c{ranges}" * compact)


def timed(inputs, fmt, calls, setting, pdl):
    mx = bench.FORMATS[fmt][1]
    with store.store_settings.override(store.StoreSettings(*setting)):
        ok = bench.check_store_bytes(inputs, mx)
        return bench.graph_time_us(bench.store_call(inputs, mx, enable_pdl=pdl), calls), ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", nargs="*", default=["fp8", "mxfp4"])
    parser.add_argument("--ratios", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--tokens", type=int, nargs="*", default=list(CANDIDATES))
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--key-dtype", choices=["bfloat16", "float32", "float16"],
                        default="bfloat16", help="the dtype of k_pre")
    args = parser.parse_args()
    copy = bench.copy_bandwidth_GBps()
    empty_graph_us, _ = bench.empty_launch_us(args.calls)
    print(f"copy {copy:.0f} GB/s, empty launch {empty_graph_us:.2f} us in a graph")
    for fmt, cr, t in itertools.product(args.formats, args.ratios, args.tokens):
        inputs = bench.make_inputs(t, fmt, cr, "cuda", k_pre_dtype=getattr(torch, args.key_dtype))
        nbytes = bench.minimal_store_bytes(inputs)
        row = []
        for setting in CANDIDATES[t]:
            try:
                us, ok = timed(inputs, fmt, args.calls, setting, True)
            except Exception as e:  # a setting the compiler refuses
                print(f"  {setting}: {type(e).__name__}: {str(e)[:80]}")
                continue
            row.append((us, setting, ok))
        row.sort(key=lambda r: r[0])
        us, best, _ = row[0]
        no_pdl_us, ok = timed(inputs, fmt, args.calls, best, False)
        cells = " ".join(f"{label(setting)}:{us:.2f}{'' if ok else '!'}"
                         for us, setting, ok in row[:6])
        pct = 100 * nbytes / us / 1e3 / copy
        print(f"{fmt:6} {args.key_dtype} cr{cr} {t:>7}: best {label(best)} {us:6.2f} us {pct:5.1f}%"
              f" (PDL off {no_pdl_us:.2f}{'' if ok else '!'}) | {cells}", flush=True)


if __name__ == "__main__":
    main()
