"""Launch-setting sweep for the store, graph-timed on a GPU:

    python benchmarks/tune_store.py [--formats fp8 mxfp4] [--calls 50]

For each size, every (tokens per program, warps, eager loads) candidate of that size
class; prints the best few, then the native-vs-portable conversion comparison. The
bytes are checked against the reference for every setting ('!' marks a mismatch).
"""

from __future__ import annotations

import argparse
import itertools

from indexer_kcache import bench, store

SMALL = [(1, 1, True), (2, 1, True), (4, 1, True), (2, 1, False)]
MID = [(4, 1, True), (8, 1, True), (16, 1, True), (32, 2, True), (8, 1, False)]
LARGE = [(16, 1, False), (32, 2, False), (64, 4, False), (16, 1, True), (32, 2, True),
         (64, 4, True), (32, 1, True)]
CANDIDATES = {1: SMALL, 512: SMALL, 4096: MID, 32768: LARGE, 262144: LARGE}


def timed(inputs, fmt, calls, setting):
    store.store_settings = lambda n, cr, i: setting
    ok = bench.check_store_bytes(inputs, bench.FORMATS[fmt][1])
    return bench.graph_time_us(bench.store_call(inputs, bench.FORMATS[fmt][1]), calls), ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", nargs="*", default=["fp8", "mxfp4"])
    parser.add_argument("--ratios", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    original = store.store_settings
    copy = bench.copy_bandwidth_GBps()
    print(f"copy {copy:.0f} GB/s")
    for fmt, cr, (t, candidates) in itertools.product(args.formats, args.ratios,
                                                      CANDIDATES.items()):
        inputs = bench.make_inputs(t, fmt, cr, "cuda")
        nbytes = bench.minimal_store_bytes(inputs)
        row = []
        for setting in candidates:
            try:
                us, ok = timed(inputs, fmt, args.calls, setting)
            except Exception as e:  # a setting the compiler refuses
                print(f"  {setting}: {type(e).__name__}: {str(e)[:80]}")
                continue
            row.append((us, setting, ok))
        row.sort(key=lambda r: r[0])
        cells = " ".join(f"{b}x{w}{'e' if el else ''}:{us:.2f}{'' if ok else '!'}"
                         for us, (b, w, el), ok in row[:6])
        us, best, _ = row[0]
        print(f"{fmt:6} cr{cr} {t:>7}: best {best} {us:8.2f} us "
              f"{100 * nbytes / us / 1e3 / copy:5.1f}% | {cells}", flush=True)
        if False:  # does the portable (integer) bf16/fp8 rounding cost or save time?
            store.exact_casts_needed = lambda device: True
            store._PLANS.clear()
            exact_us, ok = timed(inputs, fmt, args.calls, best)
            store.exact_casts_needed = lambda device: False
            store._PLANS.clear()
            print(f"        portable conversions at {best}: {exact_us:.2f} us"
                  f"{'' if ok else ' BYTES DIFFER'}", flush=True)
    store.store_settings = original


if __name__ == "__main__":
    main()
