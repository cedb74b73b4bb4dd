"""Launch-setting sweep for the store, graph-timed on a GPU:

    python benchmarks/tune_store.py [--formats fp8 mxfp4] [--ratios 1 2] [--calls 50]

For each size, every (tokens per program, warps, eager loads) candidate of that size
class, with programmatic dependent launch (PDL) on, and the best one again with it off.
Prints the best few per size. The bytes are checked against the reference for every
setting ('!' marks a mismatch).
"""

from __future__ import annotations

import argparse
import itertools

from indexer_kcache import bench, store

SMALL = [(1, 1, True), (2, 1, True), (4, 1, True), (2, 2, True), (4, 4, True), (8, 4, True),
         (1, 1, False)]
MID = [(4, 1, True), (8, 1, True), (8, 2, True), (16, 2, True), (16, 4, True), (4, 1, False),
       (8, 1, False), (8, 2, False)]
LARGE = [(32, 2, False), (32, 4, False), (64, 4, False), (32, 2, True), (32, 4, True),
         (64, 4, True), (64, 8, True)]
CANDIDATES = {1: SMALL, 64: SMALL, 512: SMALL, 4096: MID, 32768: LARGE, 262144: LARGE}


def timed(inputs, fmt, calls, setting, pdl):
    store.store_settings = lambda *_: setting
    store.pdl_supported = lambda device: pdl
    store._PLANS.clear()
    ok = bench.check_store_bytes(inputs, bench.FORMATS[fmt][1])
    return bench.graph_time_us(bench.store_call(inputs, bench.FORMATS[fmt][1]), calls), ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", nargs="*", default=["fp8", "mxfp4"])
    parser.add_argument("--ratios", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--tokens", type=int, nargs="*", default=list(CANDIDATES))
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    original = store.store_settings, store.pdl_supported
    copy = bench.copy_bandwidth_GBps()
    empty_graph_us, _ = bench.empty_launch_us(args.calls)
    print(f"copy {copy:.0f} GB/s, empty launch {empty_graph_us:.2f} us in a graph")
    for fmt, cr, t in itertools.product(args.formats, args.ratios, args.tokens):
        inputs = bench.make_inputs(t, fmt, cr, "cuda")
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
        cells = " ".join(f"{b}x{w}{'e' if el else ''}:{us:.2f}{'' if ok else '!'}"
                         for us, (b, w, el), ok in row[:6])
        print(f"{fmt:6} cr{cr} {t:>7}: best {best} {us:6.2f} us {100 * nbytes / us / 1e3 / copy:5.1f}%"
              f" (PDL off {no_pdl_us:.2f}{'' if ok else '!'}) | {cells}", flush=True)
    store.store_settings, store.pdl_supported = original


if __name__ == "__main__":
    main()
