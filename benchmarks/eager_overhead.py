"""Where the host time of one eager call goes (GPU machine): an empty Triton launch, the
public store at small sizes, and its parts.

Wall time per call drifts by several microseconds over tens of milliseconds on a shared
host, so the variants run in interleaved rounds (every variant once per round, a loop of
``--calls`` calls each) and each is reported as the median of its rounds, next to the
empty launch of the same rounds.

    python benchmarks/eager_overhead.py [--rounds 15] [--calls 1000] [--profile] [--readers]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from indexer_kcache import bench, direct_launch, store


def variants(readers: bool) -> dict:
    empty = bench.empty_launch_fn()
    rows = {"empty triton launch": empty}
    for fmt, cr, tokens in (("fp8", 1, 1), ("mxfp4", 2, 512)):
        inputs = bench.make_inputs(tokens, fmt, cr, "cuda")
        name = f"{fmt} cr{cr} {tokens} tok"
        rows[f"public, {name}"] = bench.store_call(inputs, False)
        rows[f"public no PDL, {name}"] = bench.store_call(inputs, False, enable_pdl=False)
    inputs = bench.make_inputs(1, "fp8", 1, "cuda")
    args = [inputs[k] for k in bench.STORE_ARGS]
    full = (*args, 0, False, None, None, False, None)
    plan = store.plan_store(*full)
    store.launch_store(plan, 1, *args[:7])  # compiles: later launches take the compiled kernel
    ((compiled, _),) = plan.launches.values()
    pointers = [inputs[k].data_ptr() for k in bench.STORE_ARGS[:7] if k != "rms_norm_eps"]
    kernel_args = store._kernel_args(plan, *pointers[:4], 1e-6, *pointers[4:], 1,
                                     plan.constexprs(1, True, False, 1))
    rows.update({
        "op dispatch + store_impl": lambda: torch.ops.indexer_kcache.indexer_k_norm_rope_store(
            *args, mx_scales=False),
        "store_impl": lambda: store.store_impl(*full),
        "launch_store": lambda: store.launch_store(plan, 1, *args[:7]),
        "Triton's launcher alone": lambda: direct_launch.launch_compiled(compiled, plan.device, 1,
                                                                     kernel_args),
        "plan_store (full checks)": lambda: store.plan_store(*full),
    })
    if readers:
        from indexer_kcache import dequantize_indexer_k, gather_indexer_k

        inputs = bench.make_inputs(64, "fp8", 1, "cuda")
        bench.store_call(inputs, False)()
        cache, slots = inputs["k_cache"], inputs["kv_slot_mapping"]
        rows["gather, 64 rows"] = lambda: gather_indexer_k(cache, slots, False,
                                                           check_bounds=False)
        rows["dequantize, 64 rows"] = lambda: dequantize_indexer_k(
            cache, slots, False, mx_scales=False, check_bounds=False)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="cProfile the 1-token call")
    parser.add_argument("--readers", action="store_true", help="the readers too (64 rows)")
    options = parser.parse_args()
    rows = variants(options.readers)
    for fn in rows.values():  # compile and warm up
        bench.loop_us(fn, 100, torch.cuda.synchronize)
    times = {name: [] for name in rows}
    for _ in range(options.rounds):
        for name, fn in rows.items():
            times[name].append(bench.loop_us(fn, options.calls, torch.cuda.synchronize))
    empty = times["empty triton launch"]
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"{options.rounds} rounds x {options.calls} calls")
    print(f"{'':34} {'median us':>9} {'min':>7} {'max':>7} {'/ empty':>8}")
    for name, values in times.items():
        ratio = statistics.median(v / e for v, e in zip(values, empty, strict=True))
        print(f"{name:34} {statistics.median(values):9.2f} {min(values):7.2f} "
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
                rows[name]()
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(16)


if __name__ == "__main__":
    main()
