"""Launch-setting sweep for the store: (tokens per program, warps) x sizes, graph-timed.

    python benchmarks/tune_store.py [--tokens ...] [--formats ...]

Prints GPU us per call for every setting, then the best per size. Used to choose
``store.store_settings``; the bytes are checked against the reference for each setting.
"""

from __future__ import annotations

import argparse
import itertools

from indexer_kcache import bench, store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 64, 512, 4096, 32768, 262144])
    parser.add_argument("--formats", nargs="*", default=["fp8", "mxfp4"])
    parser.add_argument("--block-t", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--warps", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    original = store.store_settings
    copy = bench.copy_bandwidth_GBps()
    print(f"copy {copy:.0f} GB/s")
    best = {}
    for fmt, cr, t in itertools.product(args.formats, (1, 2), args.tokens):
        inputs = bench.make_inputs(t, fmt, cr, "cuda")
        nbytes = bench.minimal_store_bytes(inputs)
        row = []
        for bt, nw in itertools.product(args.block_t, args.warps):
            store.store_settings = lambda n, i, bt=bt, nw=nw: (bt, nw)
            try:
                ok = bench.check_store_bytes(inputs, bench.FORMATS[fmt][1])
                us = bench.graph_time_us(bench.store_call(inputs, bench.FORMATS[fmt][1]), args.calls)
            except Exception as e:  # a setting the compiler refuses
                print(f"  bt={bt} nw={nw}: {type(e).__name__}: {str(e)[:80]}")
                continue
            row.append((us, bt, nw, ok))
        row.sort()
        cells = " ".join(f"{bt}x{nw}:{us:.2f}{'' if ok else '!'}" for us, bt, nw, ok in row[:8])
        us, bt, nw, _ = row[0]
        best[(fmt, cr, t)] = (bt, nw, us)
        print(f"{fmt:6} cr{cr} {t:>7}: best {bt}x{nw} {us:8.2f} us "
              f"{100 * nbytes / us / 1e3 / copy:5.1f}% | {cells}", flush=True)
    store.store_settings = original


if __name__ == "__main__":
    main()
