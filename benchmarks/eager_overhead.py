"""Where the host time of one eager call goes (GPU machine): empty Triton launch, the
public function at 1 token, and its parts."""

from __future__ import annotations

import time

import torch

from indexer_kcache import bench, store


def per_call_us(fn, n=2000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    inputs = bench.make_inputs(1, "fp8", 1, "cuda")
    call = bench.store_call(inputs, False)
    args = [inputs[k] for k in ("k_pre", "positions", "cos_sin_cache", "rms_norm_weight",
                                "rms_norm_eps", "k_cache", "kv_slot_mapping", "compress_ratio",
                                "use_fp4_cache")]
    full = (*args, 0, False, None, None, False, None)
    plan = store.plan_store(*full)
    rows = [
        ("empty triton launch", bench.empty_launch_us(200)[1]),
        ("public store, 1 token", per_call_us(call)),
        ("op dispatch + store_impl", per_call_us(
            lambda: torch.ops.indexer_kcache.indexer_k_norm_rope_store(*args, mx_scales=False))),
        ("store_impl", per_call_us(lambda: store.store_impl(*full))),
        ("plan key", per_call_us(lambda: store._plan_key(*full))),
        ("plan_store (full checks)", per_call_us(lambda: store.plan_store(*full))),
        ("launch_store", per_call_us(lambda: store.launch_store(plan, *args[:7]))),
    ]
    for name, us in rows:
        print(f"{name:28} {us:7.2f} us")
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        call()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
