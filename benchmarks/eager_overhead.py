"""Where the host time of one eager call goes (GPU machine): an empty Triton launch, the
public store at small sizes on the fast path and on the plain path, and the store's parts.

Wall time per call drifts by several microseconds over tens of milliseconds on a shared
host, so the variants run in interleaved rounds (every variant once per round, a loop of
``--calls`` calls each) and each is reported as the median of its rounds, next to the
empty launch of the same rounds.

    python benchmarks/eager_overhead.py [--rounds 15] [--calls 1000] [--profile] [--readers]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch

from indexer_kcache import bench, dequantize_indexer_k, fast_path, gather_indexer_k, store

STORE = store.indexer_k_norm_rope_store


def variants(readers: bool) -> dict:
    """name -> (function, runs on the plain path)."""
    rows = {"empty triton launch": (bench.empty_launch_fn(), False)}
    for fmt, cr, tokens in (("fp8", 1, 1), ("mxfp4", 2, 512)):
        inputs = bench.make_inputs(tokens, fmt, cr, "cuda")
        name = f"{fmt} cr{cr} {tokens} tok"
        rows[f"public, {name}"] = (bench.store_call(inputs, False), False)
        rows[f"public no PDL, {name}"] = (bench.store_call(inputs, False, enable_pdl=False), False)
        rows[f"plain path, {name}"] = (bench.store_call(inputs, False), True)
    inputs = bench.make_inputs(1, "fp8", 1, "cuda")
    args = [inputs[k] for k in bench.STORE_ARGS]
    op = STORE.op
    call = op.bind(*args, mx_scales=False)
    plan = store.check_store(call)
    store.run_store(plan, call)  # compiles: later launches take the compiled kernel
    rows.update({
        "through the op (dispatcher)": (
            lambda: torch.ops.indexer_kcache.indexer_k_norm_rope_store(*args, mx_scales=False),
            False),
        "implementation (plan lookup, run)": (lambda: op.implementation(call), False),
        "run_store (launch)": (lambda: store.run_store(plan, call), False),
        "check_store (full checks)": (lambda: store.check_store(call), False),
    })
    if readers:
        inputs = bench.make_inputs(64, "fp8", 1, "cuda")
        bench.store_call(inputs, False)()
        cache, slots = inputs["k_cache"], inputs["kv_slot_mapping"]
        gather = lambda: gather_indexer_k(cache, slots, False, check_bounds=False)
        dequantize = lambda: dequantize_indexer_k(cache, slots, False, mx_scales=False,
                                                  check_bounds=False)
        rows["gather, 64 rows"] = (gather, False)
        rows["dequantize, 64 rows"] = (dequantize, False)
        rows["plain path, gather, 64 rows"] = (gather, True)
        rows["plain path, dequantize, 64 rows"] = (dequantize, True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="cProfile the 1-token call")
    parser.add_argument("--readers", action="store_true", help="the readers too (64 rows)")
    options = parser.parse_args()
    rows = variants(options.readers)

    def loop(fn, plain, calls):
        with fast_path.disabled() if plain else contextlib.nullcontext():
            fn()  # after a switch, the first call is checked again
            return bench.loop_us(fn, calls, torch.cuda.synchronize)

    for fn, plain in rows.values():  # compile and warm up
        loop(fn, plain, 100)
    times = {name: [] for name in rows}
    for _ in range(options.rounds):
        for name, (fn, plain) in rows.items():
            times[name].append(loop(fn, plain, options.calls))
    empty = times["empty triton launch"]
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"{options.rounds} rounds x {options.calls} calls  fast path available: "
          f"{fast_path.AVAILABLE}")
    print(f"{'':36} {'median us':>9} {'min':>7} {'max':>7} {'/ empty':>8}")
    for name, values in times.items():
        ratio = statistics.median(v / e for v, e in zip(values, empty, strict=True))
        print(f"{name:36} {statistics.median(values):9.2f} {min(values):7.2f} "
              f"{max(values):7.2f} {ratio:7.2f}x")
    if options.profile:
        import cProfile
        import pstats

        for name in ("public, fp8 cr1 1 tok", "gather, 64 rows"):
            if name not in rows:
                continue
            print(name)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(2000):
                rows[name][0]()
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(16)


if __name__ == "__main__":
    main()
