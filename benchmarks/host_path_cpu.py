"""The Python host time of eager calls, on any machine: the GPU launch replaced by nothing.

On a GPU host an eager call costs its Python path plus Triton's launch of the compiled
kernel (``eager_overhead.py`` measures both against an empty launch). This script times
the Python path alone on the CPU: the ops run under the Triton interpreter once (checks,
plan, settings), then their launches are marked as compiled, with a compiled kernel whose
``run`` does nothing, so every later call runs exactly the host code a GPU call runs up to
Triton's launcher.

    TRITON_INTERPRET=1 python benchmarks/host_path_cpu.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import timeit

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1 (the ops' first calls run the kernels on the CPU)")

import torch  # noqa: E402

import indexer_kcache as ik  # noqa: E402
from indexer_kcache import bench, fast_path, readers, store  # noqa: E402


class _NoLaunch:
    """A compiled kernel whose launcher does nothing."""

    function = packed_metadata = None

    @staticmethod
    def run(*args) -> None:
        pass


class _AnyKey(dict):
    """A compiled-kernel cache that has every key."""

    def get(self, key, default=None):
        return _NoLaunch


def _as_compiled(launch) -> None:
    state = launch.state
    state.compiles, state.device_index, state.compiled = True, 0, _AnyKey()


def _mark_compiled(*ops) -> None:
    for op in ops:
        for candidates in op.plans.plans.values():
            for _, plan in candidates:
                if isinstance(plan, store.StorePlan):
                    for launch in plan.launches.values():
                        _as_compiled(launch)
                elif isinstance(plan, readers.ReaderPlan):
                    _as_compiled(plan.launch)


@contextlib.contextmanager
def _no_launches():
    """Device 0 current, stream 0: what the direct launch asks torch's CUDA functions."""
    before = fast_path.current_device, fast_path.current_stream
    fast_path.current_device, fast_path.current_stream = (lambda: 0), (lambda device: 0)
    try:
        yield
    finally:
        fast_path.current_device, fast_path.current_stream = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if not fast_path.enabled():
        sys.exit("the fast path is off here (INDEXER_KCACHE_FAST_PATH=0 or unknown versions)")
    calls = {}
    for fmt, cr, tokens in (("fp8", 1, 1), ("mxfp4", 2, 512)):
        inputs = bench.make_inputs(tokens, fmt, cr, "cpu")
        calls[f"store, {fmt} cr{cr} {tokens} tok"] = bench.store_call(inputs, False)
    inputs = bench.make_inputs(64, "fp8", 1, "cpu")
    cache, slots = inputs["k_cache"], inputs["kv_slot_mapping"]
    calls["gather, 64 rows"] = lambda: ik.gather_indexer_k(cache, slots, False,
                                                           check_bounds=False)
    calls["dequantize, 64 rows"] = lambda: ik.dequantize_indexer_k(
        cache, slots, False, mx_scales=False, check_bounds=False)
    calls["two output allocations (gather's)"] = lambda: (
        torch.empty(64, 128, dtype=torch.uint8, device=cache.device),
        torch.empty(64, 4, dtype=torch.uint8, device=cache.device))
    for fn in calls.values():
        fn()  # checks, plans, the interpreter's run
    _mark_compiled(store.indexer_k_norm_rope_store.op, ik.gather_indexer_k.op,
                   ik.dequantize_indexer_k.op)
    print(f"Python host time per eager call, launch excluded ({torch.__version__}, "
          f"best of 5 x {args.calls} calls)")
    with _no_launches():
        for name, fn in calls.items():
            fn()
            us = min(timeit.repeat(fn, number=args.calls, repeat=5)) / args.calls * 1e6
            print(f"  {name:36} {us:6.2f} us")


if __name__ == "__main__":
    main()
