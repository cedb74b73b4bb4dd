"""Experiment: how fast can a store move its bytes at all? A kernel that does only the
store's memory traffic (slots and positions of every token; the key row and the cos/sin
row of each written token; its cache row), with no norm, RoPE or quantisation, timed on
the bench's 256K-token batches at compress ratio 1 and 2 beside the store itself.

At ratio 2 the written tokens' key rows and cos/sin rows are every other row of their
tensors: half of each DRAM page read is wasted by the access pattern itself. This puts a
number on the part of the ratio-2 gap that no encoding work can close.

    python benchmarks/exp_store_floor.py
    ncu --clock-control none --section SpeedOfLight --section Occupancy \
        --section WarpStateStats python benchmarks/exp_store_floor.py --profile

(``--profile``: each kernel once, after a warm-up call, for a profiler.)
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from indexer_kcache import bench, layout


@triton.jit
def _move_only_kernel(k_ptr, k_row_stride, pos_ptr, cs_ptr, cs_row_stride, cache_ptr,
                      page_stride, slot_ptr, num_tokens, VALUE_BYTES: tl.constexpr,
                      RATIO: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    lane = tl.arange(0, BLOCK).to(tl.int64)
    if RATIO == 1:
        t = tl.program_id(0).to(tl.int64) * BLOCK + lane
        slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1)
        pos = tl.load(pos_ptr + t, mask=t < num_tokens, other=0)
        write = slot >= 0
    else:  # the store's pairs: a lane takes the odd token of its pair if it writes
        t_even = tl.program_id(0).to(tl.int64) * (2 * BLOCK) + 2 * lane
        slot_e = tl.load(slot_ptr + t_even, mask=t_even < num_tokens, other=-1)
        pos_e = tl.load(pos_ptr + t_even, mask=t_even < num_tokens, other=0)
        slot_o = tl.load(slot_ptr + t_even + 1, mask=t_even + 1 < num_tokens, other=-1)
        pos_o = tl.load(pos_ptr + t_even + 1, mask=t_even + 1 < num_tokens, other=0)
        write_o = (slot_o >= 0) & ((pos_o + 1) % 2 == 0)
        write_e = (slot_e >= 0) & ((pos_e + 1) % 2 == 0)
        t = tl.where(write_o, t_even + 1, t_even)
        slot = tl.where(write_o, slot_o, slot_e)
        pos = tl.where(write_o, pos_o, pos_e)
        write = write_o | write_e
    group_pos = pos - pos % RATIO
    d = tl.arange(0, 128)
    bits = tl.load(k_ptr.to(tl.pointer_type(tl.int16)) + t[:, None] * k_row_stride + d[None, :],
                   mask=write[:, None], other=0)
    cs = tl.load(cs_ptr + group_pos[:, None] * cs_row_stride + tl.arange(0, 64)[None, :],
                 mask=write[:, None], other=0.0)
    if VALUE_BYTES == 64:
        a, b = tl.split(tl.reshape(bits, [BLOCK, 64, 2]))
        bits = a ^ b
    values = (bits & 0xFF).to(tl.uint8)
    scale_bits = tl.sum(cs, axis=1).to(tl.int32, bitcast=True)
    i4 = tl.arange(0, 4)
    scale_bytes = ((scale_bits[:, None] >> (8 * i4[None, :])) & 0xFF).to(tl.uint8)
    page = cache_ptr + (slot // BLOCK_SIZE) * page_stride
    p = slot % BLOCK_SIZE
    v = tl.arange(0, VALUE_BYTES)
    tl.store(page[:, None] + p[:, None] * VALUE_BYTES + v[None, :], values, mask=write[:, None])
    tl.store(page[:, None] + BLOCK_SIZE * VALUE_BYTES + p[:, None] * 4 + i4[None, :],
             scale_bytes, mask=write[:, None])


def move_only(inputs: dict, block: int, warps: int):
    k_pre, cos_sin, cache = inputs["k_pre"], inputs["cos_sin_cache"], inputs["k_cache"]
    slots, positions = inputs["kv_slot_mapping"], inputs["positions"]
    ratio = inputs["compress_ratio"]
    n = slots.numel()
    grid = (triton.cdiv(n, block * ratio if ratio == 2 else block),)
    value_bytes = layout.value_bytes(inputs["use_fp4_cache"])

    def call():
        _move_only_kernel[grid](k_pre, k_pre.stride(0), positions, cos_sin, cos_sin.stride(0),
                                cache, cache.stride(0), slots, n, VALUE_BYTES=value_bytes,
                                RATIO=ratio, BLOCK_SIZE=cache.shape[1], BLOCK=block,
                                num_warps=warps)
    return call


def profile() -> None:
    """The store at ratio 2 (FP8, MXFP4) and ratio 1 (FP8), and the move-only kernel at
    ratio 2, each called twice (warm-up, then the call to profile), on 256K tokens."""
    calls = []
    for fmt, ratio in (("fp8", 2), ("mxfp4", 2), ("fp8", 1)):
        inputs = bench.make_inputs(262144, fmt, ratio, "cuda")
        calls.append(bench.store_call(inputs, False))
        if (fmt, ratio) == ("fp8", 2):
            calls.append(move_only(inputs, 8, 2))
    for _ in range(2):
        for call in calls:
            call()
        torch.cuda.synchronize()


def main() -> None:
    if "--profile" in sys.argv[1:]:
        profile()
        return
    copy = bench.copy_bandwidth_GBps()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}"
          f"  copy {copy:.0f} GB/s")
    tokens = 262144
    rows = []
    for fmt in ("fp8", "mxfp4"):
        for ratio in (1, 2):
            inputs = bench.make_inputs(tokens, fmt, ratio, "cuda")
            nbytes = bench.minimal_store_bytes(inputs)
            store_us = bench.graph_time_us(bench.store_call(inputs, False), 50)
            best = None
            for block in (8, 16, 32, 64):
                for warps in (1, 2, 4, 8):
                    us = bench.graph_time_us(move_only(inputs, block, warps), 50)
                    print(f"  {fmt:6} cr{ratio} move-only {block:3}x{warps}  {us:7.2f} us "
                          f"{100 * nbytes / us / 1e3 / copy:5.1f} %", flush=True)
                    if best is None or us < best[0]:
                        best = (us, block, warps)
            rows.append((fmt, ratio, store_us, *best, nbytes))
    print("\n256K tokens, % of copy bandwidth on the store's minimal bytes")
    print("format  cr   store us     %   move-only us     %  (best block x warps)")
    for fmt, ratio, store_us, us, block, warps, nbytes in rows:
        store_pct, move_pct = (100 * nbytes / t / 1e3 / copy for t in (store_us, us))
        print(f"{fmt:6}  {ratio:2}  {store_us:9.2f} {store_pct:5.1f}  {us:12.2f} "
              f"{move_pct:5.1f}  ({block}x{warps})")


if __name__ == "__main__":
    main()
