"""Experiment: the scorer with the tensor cores' dot left running while the previous
dot's relu, weights and head sum are computed, written in Gluon (Triton's lower-level
dialect), on Hopper only.

The library's kernel waits for each tile's dot before anything else happens in its warps:
Triton's Hopper pipeliner waits right after a dot whose result is used in the same
iteration. With several query rows a program (``next_n`` 4) its registers allow two
programs an SM, and the tensor cores idle while the four warps work through the head
sums. Here a program issues the dot of a (tile, row) pair, ``[64 keys x 128] x [128 x 64
heads]``, finishes the pair before while it runs, then waits for it. Pages come in by
TMA, several tiles ahead, through a ring of mbarriers.

Two kernels, in the scope the targets are measured in (row-major unpadded pages of 64
keys, e4m3 queries without scales, 64 heads, float32 weights, one context length a
sequence, ``clean_logits`` inside the scored range only):
- ``fp8_async_dot_kernel``: FP8 keys with fp32 scales, one to four rows a program.
- ``mxfp4_async_dot_kernel``: MXFP4 keys, one row a program, decoded as the library does
  (table lookup, one fold exponent a program) into shared memory, where the dot reads them.
Both are checked against the torch reference before anything is timed. Measured on an
H200, the overlap gains little (BENCHMARKS.md, "The dot left running, written in Gluon").

    python benchmarks/exp_scorer_async_dot.py            # on an H200: check, then time
    python benchmarks/exp_scorer_async_dot.py --compile  # anywhere: sm_90 builds, registers
    python benchmarks/exp_scorer_async_dot.py --parts    # on an H200: the FP8 loop's parts
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.bench.timing import copy_bandwidth_GBps, graph_time_us
from indexer_kcache.kernels import logits as _lib_logits
from indexer_kcache.reference import logits as reference_logits

# TMA loads into shared memory: ``async_copy_global_to_shared`` up to 3.7, ``async_load``
# from 3.8 (3.9 no longer builds the old name).
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# A barrier of the program's threads: ``thread_barrier`` in 3.6, ``barrier`` from 3.7.
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

HEADS = gl.constexpr(64)
DIM = gl.constexpr(128)
BLOCK = gl.constexpr(64)
PAGE_ROWS = gl.constexpr(66)  # a page of 64 keys: 64 rows of 128 value bytes, 2 of scales
KEYS_A_PAGE, HEAD_DIM, ROWS_A_PAGE = 64, 128, 66  # the same, for the host


def key_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)


def scale_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


# The FP8 kernel's loop, whole or in part (``PART``), to time what each part costs: the
# dots without the head sums and stores (each result kept by a max: one more instruction
# an element), the head sums and stores of results that take no dot (an add an element in
# its place), or neither (the pages' TMA and the barriers alone). Only ``PART_ALL``
# computes logits.
PART_ALL, PART_DOTS, PART_SUMS, PART_PAGES = (gl.constexpr(part) for part in range(4))
PART_NAMES = {0: "all", 1: "dots", 2: "head sums", 3: "pages"}


@gluon.jit
def _program_range(ctx_ptr, table_ptr, table_sb, b, split, max_cols, chunk_tiles):
    """A program's sequence length, first tile, positions ``[col_lo, col_hi)``, tile count
    (at most 0 when the range is empty) and block-table row."""
    ctx = gl.load(ctx_ptr + b)
    tile0 = split * chunk_tiles
    col_lo = tile0 * BLOCK
    col_hi = gl.minimum(col_lo + chunk_tiles * BLOCK, gl.minimum(ctx, max_cols))
    n_tiles = gl.cdiv(col_hi - col_lo, BLOCK)
    return ctx, tile0, col_lo, col_hi, n_tiles, table_ptr + b.to(gl.int64) * table_sb


@gluon.jit
def _pick(i: gl.constexpr, w0, w1, w2, w3):
    if i == 0:
        return w0
    elif i == 1:
        return w1
    elif i == 2:
        return w2
    else:
        return w3


@gluon.jit
def _weights(i: gl.constexpr, w0, w1, w2, w3, w_smem, W_SMEM: gl.constexpr,
             MMA: gl.constexpr):
    """Row ``i``'s weights, in the columns' layout: kept in registers, or read from shared
    memory each time (``W_SMEM``: 16 registers a row fewer)."""
    if W_SMEM:
        return w_smem.index(i).load(gl.SliceLayout(0, MMA))
    else:
        return _pick(i, w0, w1, w2, w3)


@gluon.jit
def _issue_tile(k_desc, s_desc, k_smem, s_smem, bars, table_row, num_blocks, tile0, p,
                n_tiles, STAGES: gl.constexpr, PAGE_STRIDE: gl.constexpr):
    """TMA of tile ``p``'s values and scales into stage ``p % STAGES`` (nothing past the
    range); a page is ``PAGE_STRIDE`` rows of the values' descriptor. A block id outside
    ``[0, num_blocks)`` reads block 0 instead (its logits are then written as ``-inf``)."""
    live = p < n_tiles
    blk = gl.load(table_row + tile0 + p, mask=live, other=0)
    blk = gl.where((blk >= 0) & (blk < num_blocks), blk, 0)
    stage = p % STAGES
    bar = bars.index(stage)
    mbarrier.expect(bar, k_desc.block_type.nbytes + s_desc.block_type.nbytes, pred=live)
    tma_load(k_desc, [blk * PAGE_STRIDE, 0], bar, k_smem.index(stage), pred=live)
    tma_load(s_desc, [blk, 0], bar, s_smem.index(stage), pred=live)


@gluon.jit
def _page_ring(k_desc, s_desc, table_row, num_blocks, tile0, n_tiles, STAGES: gl.constexpr,
               PAGE_STRIDE: gl.constexpr):
    """The ring of ``STAGES`` staged pages (values, scales, their mbarriers), with the
    first ``STAGES - 1`` tiles already asked for."""
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape,
                                       k_desc.layout)
    s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES] + s_desc.block_type.shape,
                                       s_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    for p in gl.static_range(STAGES - 1):
        _issue_tile(k_desc, s_desc, k_smem, s_smem, bars, table_row, num_blocks, tile0, p,
                    n_tiles, STAGES, PAGE_STRIDE)
    return k_smem, s_smem, bars


@gluon.jit
def _finish(acc, w, factor, table_row, num_blocks, out_row, tile0, jp, col_lo, col_hi, limit,
            MMA: gl.constexpr, DOUBLED: gl.constexpr):
    """Relu, weights and head sum of pair (tile ``jp``, one row), times ``factor`` (the
    keys' scales, or one number, with relu's 1/2); stored below the range's end, ``-inf``
    at and past the row's limit or for a block id out of range. ``jp < 0`` stores nothing
    (the loop's first pair has no predecessor). ``DOUBLED``: ``acc`` already holds
    ``x + |x|``."""
    keys: gl.constexpr = gl.SliceLayout(1, MMA)
    t = col_lo + jp * BLOCK + gl.arange(0, BLOCK, layout=keys)
    blk = gl.load(table_row + tile0 + jp, mask=jp >= 0, other=-1)
    valid = (blk >= 0) & (blk < num_blocks)
    if DOUBLED:
        terms = acc * gl.expand_dims(w, 0)
    else:
        terms = (acc + gl.abs(acc)) * gl.expand_dims(w, 0)
    score = gl.sum(terms, axis=1) * factor
    value = gl.where((t < limit) & valid, score, float("-inf"))
    gl.store(out_row + t, value, mask=(t < col_hi) & (jp >= 0))


@gluon.jit
def _half_scales(s_smem, jp, STAGES: gl.constexpr, MMA: gl.constexpr):
    """Tile ``jp``'s 64 fp32 key scales, halved (relu's 1/2), from its stage (jp >= -1)."""
    stage = (jp + STAGES) % STAGES
    return s_smem.index(stage).reshape([BLOCK]).load(gl.SliceLayout(1, MMA)) * 0.5


@gluon.jit
def fp8_async_dot_kernel(q_ptr, w_ptr, k_desc, s_desc, table_ptr, table_sb, ctx_ptr, out_ptr,
                         out_sr, num_blocks, max_cols, chunk_tiles,
                         NEXT_N: gl.constexpr, STAGES: gl.constexpr, W_SMEM: gl.constexpr,
                         PART: gl.constexpr = 0):
    gl.static_assert(STAGES >= 2)
    gl.static_assert(W_SMEM or NEXT_N <= 4)  # four rows' weights in registers at most
    b = gl.program_id(0)
    split = gl.program_id(1)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HEADS, 32])
    LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    heads: gl.constexpr = gl.SliceLayout(0, MMA)

    ctx, tile0, col_lo, col_hi, n_tiles, table_row = _program_range(
        ctx_ptr, table_ptr, table_sb, b, split, max_cols, chunk_tiles)

    k_smem, s_smem, bars = _page_ring(k_desc, s_desc, table_row, num_blocks, tile0, n_tiles,
                                      STAGES, PAGE_ROWS)

    # The queries of the program's rows, [head, dim] each (the dot's second operand,
    # read with dims contiguous), and their weights.
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [NEXT_N, HEADS, DIM], k_desc.layout)
    h = gl.arange(0, HEADS, layout=gl.SliceLayout(1, LOAD))
    d = gl.arange(0, DIM, layout=gl.SliceLayout(0, LOAD))
    wh = gl.arange(0, HEADS, layout=heads)
    row0 = b * NEXT_N
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    w_smem = gl.allocate_shared_memory(gl.float32, [NEXT_N, HEADS], flat)
    w0 = gl.load(w_ptr + row0 * HEADS + wh)
    w1 = w0
    w2 = w0
    w3 = w0
    for i in gl.static_range(NEXT_N):
        q = gl.load(q_ptr + (row0 + i).to(gl.int64) * (HEADS * DIM) + gl.expand_dims(h, 1) * DIM
                    + gl.expand_dims(d, 0))
        q_smem.index(i).store(q.to(gl.float8e4nv, bitcast=True))
        if W_SMEM:
            w_smem.index(i).store(gl.load(w_ptr + (row0 + i) * HEADS + wh))
        else:
            if i == 1:
                w1 = gl.load(w_ptr + (row0 + 1) * HEADS + wh)
            if i == 2:
                w2 = gl.load(w_ptr + (row0 + 2) * HEADS + wh)
            if i == 3:
                w3 = gl.load(w_ptr + (row0 + 3) * HEADS + wh)
    fence_async_shared()
    cta_barrier()

    zero = gl.zeros([BLOCK, HEADS], gl.float32, layout=MMA)
    # ``prev``: the finished dot of the pair before, carried in registers the tensor cores
    # no longer write (a dot still running when the loop's registers are renamed would
    # make ptxas wait after every dot). The tile's last pair is carried into the next
    # iteration as ``x + |x|``: registers a dot defined, reaching the loop's head, make
    # ptxas wait for the running dot before reading them, or copy them one by one.
    prev = zero
    DOTS: gl.constexpr = PART == PART_ALL or PART == PART_DOTS
    SUMS: gl.constexpr = PART == PART_ALL or PART == PART_SUMS
    # (The diagnostic parts: ``kept`` keeps the dots' results live without head sums;
    # without dots, the head sums take a different number in each element, which the
    # compiler cannot fold to one a key as it would a number a pair.)
    kept = zero
    spread = zero
    if not DOTS:
        spread = (gl.expand_dims(gl.arange(0, BLOCK, layout=gl.SliceLayout(1, MMA)), 1)
                  - gl.expand_dims(wh, 0)).to(gl.float32)
    for j in range(n_tiles):
        stage = j % STAGES
        mbarrier.wait(bars.index(stage), phase=(j // STAGES) & 1)
        keys = k_smem.index(stage)
        for i in gl.static_range(NEXT_N):
            if DOTS:
                cur = warpgroup_mma(keys, q_smem.index(i).permute((1, 0)), zero, use_acc=False,
                                    is_async=True)
            else:
                cur = spread + (j * NEXT_N + i).to(gl.float32)
            r = (i + NEXT_N - 1) % NEXT_N
            jp = j if i > 0 else j - 1
            # Always true here (the loop runs only when it is): a branch, which ptxas does not
            # move the head sums across. Without it, ptxas gives the dot the registers of
            # ``prev`` and computes prev's head sums before issuing the dot.
            if SUMS:
                if col_hi > col_lo:
                    _finish(prev, _weights(r, w0, w1, w2, w3, w_smem, W_SMEM, MMA),
                            _half_scales(s_smem, jp, STAGES, MMA), table_row, num_blocks,
                            out_ptr + (row0 + r).to(gl.int64) * out_sr, tile0, jp, col_lo,
                            col_hi, ctx - NEXT_N + r + 1, MMA, i == 0)
            elif DOTS:
                kept = gl.maximum(kept, prev)
            if DOTS:
                prev = warpgroup_mma_wait(num_outstanding=0, deps=(cur, ))
            else:
                prev = cur
            if i == NEXT_N - 1:
                prev = prev + gl.abs(prev)
        # Every dot of tile j - 1 is done, and every warp has read its scales once all
        # have passed the barrier: its stage takes tile j + STAGES - 1.
        fence_async_shared()
        cta_barrier()
        _issue_tile(k_desc, s_desc, k_smem, s_smem, bars, table_row, num_blocks, tile0,
                    j + STAGES - 1, n_tiles, STAGES, PAGE_ROWS)
    last: gl.constexpr = NEXT_N - 1
    if not SUMS and n_tiles > 0:  # one value a key of the program's first tile
        t = col_lo + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, MMA))
        gl.store(out_ptr + row0.to(gl.int64) * out_sr + t, gl.max(kept, axis=1), mask=t < col_hi)
    if SUMS and n_tiles > 0:
        _finish(prev, _weights(last, w0, w1, w2, w3, w_smem, W_SMEM, MMA),
                _half_scales(s_smem, n_tiles - 1, STAGES, MMA), table_row, num_blocks,
                out_ptr + (row0 + last).to(gl.int64) * out_sr, tile0, n_tiles - 1, col_lo,
                col_hi, ctx - NEXT_N + last + 1, MMA, True)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))


# ------------------------------------------------------------------------------ MXFP4 keys
# One row a program, e4m3 queries without scales. A page: 64 keys of 64 packed bytes (16
# words, four 32-dim groups of four words), then the keys' four UE8M0 group scales as one
# word each. Each thread decodes one group of two keys (four words), folding the group's
# scale into the decoded e4m3 bytes relative to the program's reference exponent (as the
# library's ``PROGRAM_FOLD``: E2M1 times 2**(FOLD_TOP - 6 + e - ref)), stores them to
# shared memory, and the dot reads them from there. A group outside the fold's window
# decodes to NaN bytes (the library then scores its program again; here it stays NaN).
FOLD_TOP = gl.constexpr(_lib_logits.FP4_FOLD_SPAN)
FOLD_HEADROOM = gl.constexpr(_lib_logits.FP4_FOLD_HEADROOM.value)
FP4_WORD_PTX = gl.constexpr(_lib_logits._FP4_WORD_PTX.value)
FP4_PAGE_ROWS = gl.constexpr(68)  # a page as rows of 16 words: 64 keys' values, 4 of scales
NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


def packed_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


# The decoded keys as int32 words [64, 32] and as the dot's e4m3 operand [64, 128]: the same
# bytes, swizzled alike (128-byte rows).
DECODED_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32,
                                                   rank=2))
E4M3_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                                rank=2))


@gluon.jit
def _as_e4m3(words_smem):
    """The decoded keys ``[64, 32]`` int32 in shared memory, as the dot's ``[64, 128]``
    e4m3 operand (the same bytes and 128-byte swizzle)."""
    if NEW_REINTERPRET:
        return words_smem.reinterpret(gl.float8e4nv, [BLOCK, DIM], E4M3_LAYOUT)
    else:
        return words_smem._reinterpret(gl.float8e4nv, [BLOCK, DIM], E4M3_LAYOUT)


@gluon.jit
def _fold_ref(s_smem, table_row, num_blocks, tile0, col_lo, col_hi, ROWS: gl.constexpr):
    """The program's reference exponent: FOLD_HEADROOM above the largest finite group
    exponent of its first tile's readable keys (127 when none), at most 254."""
    t = col_lo + gl.arange(0, BLOCK, layout=ROWS)
    words = s_smem.index(0).reshape([BLOCK]).load(ROWS)
    blk = gl.load(table_row + tile0)
    ok = (t < col_hi) & (blk >= 0) & (blk < num_blocks)
    top = gl.zeros([BLOCK], gl.int32, layout=ROWS)
    for g in gl.static_range(4):
        e = (words >> (8 * g)) & 0xFF
        top = gl.maximum(top, gl.where(ok & (e != 255), e, 0))
    top = gl.max(top, axis=0)
    return gl.where(top == 0, 127, gl.minimum(top + FOLD_HEADROOM, 254))


@gluon.jit
def _decode_tile(v_smem, s_smem, stage, ref, PACK: gl.constexpr):
    """Tile ``stage``'s keys decoded to e4m3 words ``[64, 32]`` (natural element order)."""
    GROUPS: gl.constexpr = gl.SliceLayout(2, PACK)
    packed = v_smem.index(stage).reshape([BLOCK, 4, 4]).load(PACK)
    words = s_smem.index(stage).reshape([BLOCK]).load(gl.SliceLayout(1, GROUPS))
    g = gl.arange(0, 4, layout=gl.SliceLayout(0, GROUPS))
    e = (gl.expand_dims(words, 1) >> gl.expand_dims(8 * g, 0)) & 0xFF
    k = e - ref + FOLD_TOP
    exact = (k >= 1) & (k <= FOLD_TOP)  # a byte 255 is above any ref
    t_lo = gl.where(exact, k * 0x08080800 + 0x0C080000, 0x7F7F7F7F)
    t_hi = gl.where(exact, k * 0x08080808 + 0x1C181410, 0x7F7F7F7F)
    t_lo = gl.broadcast(gl.expand_dims(t_lo, 2), packed)[0]
    t_hi = gl.broadcast(gl.expand_dims(t_hi, 2), packed)[0]
    low, high = gl.inline_asm_elementwise(FP4_WORD_PTX, "=r,=r,r,r,r", [packed, t_lo, t_hi],
                                          dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    return gl.reshape(gl.join(low, high), [BLOCK, DIM // 4])


@gluon.jit
def _fp4_consume(q_ptr, w_ptr, v_desc, s_desc, v_smem, s_smem, ready, empty, table_row,
                 num_blocks, tile0, col_lo, col_hi, n_tiles, ctx, out_row, b,
                 STAGES: gl.constexpr, PRODUCER_WARP: gl.constexpr):
    """The scoring warps of an MXFP4 program: decode, dot, head sums. Without
    ``PRODUCER_WARP`` they also ask for each next page themselves; with it, they tell a
    warp of its own (``_fp4_produce``) when a stage is free (``empty``)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HEADS, 32])
    LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    # [key, group, word]: a thread holds the four words of one group of a key, for two keys.
    PACK: gl.constexpr = gl.BlockedLayout([1, 1, 4], [8, 4, 1], [4, 1, 1], [2, 1, 0])
    ROWS: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])

    a_smem = gl.allocate_shared_memory(gl.int32, [BLOCK, DIM // 4], DECODED_LAYOUT)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [HEADS, DIM], E4M3_LAYOUT)
    h = gl.arange(0, HEADS, layout=gl.SliceLayout(1, LOAD))
    d = gl.arange(0, DIM, layout=gl.SliceLayout(0, LOAD))
    q = gl.load(q_ptr + b.to(gl.int64) * (HEADS * DIM) + gl.expand_dims(h, 1) * DIM
                + gl.expand_dims(d, 0))
    q_smem.store(q.to(gl.float8e4nv, bitcast=True))
    # The decoded keys carry 2**6 more than E2M1 times their scale relative to ref: the
    # weights take the 2**-6 back (exact), the key factor 2**(ref - 127) and relu's 1/2.
    w = gl.load(w_ptr + b * HEADS + gl.arange(0, HEADS, layout=gl.SliceLayout(0, MMA)))
    w = w * (1.0 / 64)
    fence_async_shared()
    cta_barrier()

    ref = 127
    if n_tiles > 0:
        mbarrier.wait(ready.index(0), phase=0)
        ref = _fold_ref(s_smem, table_row, num_blocks, tile0, col_lo, col_hi, ROWS)
    key_factor = (ref << 23).to(gl.float32, bitcast=True) * 0.5

    zero = gl.zeros([BLOCK, HEADS], gl.float32, layout=MMA)
    prev = zero  # carried as x + |x| (see the FP8 kernel)
    for j in range(n_tiles):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), phase=(j // STAGES) & 1)
        a_smem.store(_decode_tile(v_smem, s_smem, stage, ref, PACK))
        fence_async_shared()
        cta_barrier()
        if PRODUCER_WARP:
            mbarrier.arrive(empty.index(stage), count=1)  # the page is decoded
        cur = warpgroup_mma(_as_e4m3(a_smem), q_smem.permute((1, 0)), zero, use_acc=False,
                            is_async=True)
        if col_hi > col_lo:  # always: a branch ptxas keeps the head sums behind
            _finish(prev, w, key_factor, table_row, num_blocks, out_row, tile0, j - 1, col_lo,
                    col_hi, ctx, MMA, True)
        prev = warpgroup_mma_wait(num_outstanding=0, deps=(cur, ))
        prev = prev + gl.abs(prev)
        if not PRODUCER_WARP:
            fence_async_shared()
            cta_barrier()
            _issue_tile(v_desc, s_desc, v_smem, s_smem, ready, table_row, num_blocks, tile0,
                        j + STAGES - 1, n_tiles, STAGES, FP4_PAGE_ROWS)
    if n_tiles > 0:
        _finish(prev, w, key_factor, table_row, num_blocks, out_row, tile0, n_tiles - 1,
                col_lo, col_hi, ctx, MMA, True)


@gluon.jit
def _fp4_produce(v_desc, s_desc, v_smem, s_smem, ready, empty, table_row, num_blocks, tile0,
                 n_tiles, STAGES: gl.constexpr):
    """A warp that only asks for pages: tile ``p`` once the scoring warps have decoded the
    tile that held its stage before (``empty``)."""
    for p in range(STAGES - 1, n_tiles):
        stage = p % STAGES
        mbarrier.wait(empty.index(stage), phase=((p // STAGES) & 1) ^ 1, pred=p >= STAGES)
        _issue_tile(v_desc, s_desc, v_smem, s_smem, ready, table_row, num_blocks, tile0, p,
                    n_tiles, STAGES, FP4_PAGE_ROWS)


@gluon.jit
def mxfp4_async_dot_kernel(q_ptr, w_ptr, v_desc, s_desc, table_ptr, table_sb, ctx_ptr, out_ptr,
                           out_sr, num_blocks, max_cols, chunk_tiles, STAGES: gl.constexpr,
                           PRODUCER_WARP: gl.constexpr):
    gl.static_assert(STAGES >= 2)
    b = gl.program_id(0)
    split = gl.program_id(1)
    ctx, tile0, col_lo, col_hi, n_tiles, table_row = _program_range(
        ctx_ptr, table_ptr, table_sb, b, split, max_cols, chunk_tiles)
    v_smem, s_smem, ready = _page_ring(v_desc, s_desc, table_row, num_blocks, tile0, n_tiles,
                                       STAGES, FP4_PAGE_ROWS)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(empty.index(s), count=1)
    out_row = out_ptr + b.to(gl.int64) * out_sr
    if PRODUCER_WARP:
        gl.warp_specialize([
            (_fp4_consume, (q_ptr, w_ptr, v_desc, s_desc, v_smem, s_smem, ready, empty,
                            table_row, num_blocks, tile0, col_lo, col_hi, n_tiles, ctx, out_row,
                            b, STAGES, PRODUCER_WARP)),
            (_fp4_produce, (v_desc, s_desc, v_smem, s_smem, ready, empty, table_row, num_blocks,
                            tile0, n_tiles, STAGES)),
        ], [1], [48])
    else:
        _fp4_consume(q_ptr, w_ptr, v_desc, s_desc, v_smem, s_smem, ready, empty, table_row,
                     num_blocks, tile0, col_lo, col_hi, n_tiles, ctx, out_row, b, STAGES,
                     PRODUCER_WARP)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


# ------------------------------------------------------------------------------ host
def descriptors(cache):
    """TMA descriptors of the cache's value rows and scale rows (unpadded 64-key pages)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if (cache.dim() != 3 or tuple(cache.shape[1:]) != (KEYS_A_PAGE, HEAD_DIM + 4)
            or not cache.is_contiguous()):
        raise ValueError(f"k_cache: expected a contiguous [num_blocks, 64, 132] FP8 cache, "
                         f"got {tuple(cache.shape)}")
    blocks = cache.shape[0]
    rows = blocks * ROWS_A_PAGE
    values = cache.view(torch.float8_e4m3fn).view(rows, HEAD_DIM)
    # A page's 64 float32 scales: [num_blocks, 64] at a stride of a page, one box a page.
    page_words = ROWS_A_PAGE * HEAD_DIM // 4
    scales = cache.view(torch.float32).view(blocks, page_words)[:, KEYS_A_PAGE * HEAD_DIM // 4:]
    k_desc = TensorDescriptor(values, [rows, HEAD_DIM], [HEAD_DIM, 1], [KEYS_A_PAGE, HEAD_DIM],
                              key_layout())
    s_desc = TensorDescriptor(scales, [blocks, KEYS_A_PAGE], [page_words, 1], [1, KEYS_A_PAGE],
                              scale_layout())
    return k_desc, s_desc


def fp4_descriptors(cache):
    """TMA descriptors of an MXFP4 cache's packed values (as int32 words, 16 a key) and of
    its keys' scale words (unpadded 64-key pages)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if (cache.dim() != 3 or tuple(cache.shape[1:]) != (KEYS_A_PAGE, 68)
            or not cache.is_contiguous()):
        raise ValueError(f"k_cache: expected a contiguous [num_blocks, 64, 68] MXFP4 cache, "
                         f"got {tuple(cache.shape)}")
    blocks = cache.shape[0]
    words = cache.view(torch.int32)  # [blocks, 64, 17]
    page_words = KEYS_A_PAGE * 17
    values = words.view(blocks * 68, 16)  # a page: 64 rows of values, then 4 of scales
    scales = words.view(blocks, page_words)[:, KEYS_A_PAGE * 16:]
    v_desc = TensorDescriptor(values, [blocks * 68, 16], [16, 1], [KEYS_A_PAGE, 16],
                              packed_layout())
    s_desc = TensorDescriptor(scales, [blocks, KEYS_A_PAGE], [page_words, 1], [1, KEYS_A_PAGE],
                              scale_layout())
    return v_desc, s_desc


def launcher(call, chunk_tiles, stages=4, flag=False, part=0):
    """A launch of one setting; ``flag``: FP8, the weights in shared memory; MXFP4, a warp of
    its own asks for the pages. ``part``: FP8, the parts of the loop kept (``PART_*``)."""
    values, scales = call["q"]
    if scales is not None or values.dtype != torch.float8_e4m3fn:
        raise ValueError("q: expected e4m3 values without scales")
    batch, next_n = values.shape[:2]
    cache, table, out = call["k_cache"], call["block_table"], call["out"]
    if table.shape[1] * KEYS_A_PAGE < call["max_model_len"]:
        raise ValueError("block_table: expected a block for every position below max_model_len")
    fp4 = cache.shape[-1] == 68
    if fp4 and next_n != 1:
        raise ValueError(f"q: expected next_n 1 with MXFP4 keys, got {next_n}")
    k_desc, s_desc = fp4_descriptors(cache) if fp4 else descriptors(cache)
    context = call["max_model_len"]
    splits = -(-context // (chunk_tiles * KEYS_A_PAGE))
    grid = (batch, splits)
    q_bytes = values.contiguous()
    weights = call["weights"]
    args = (q_bytes, weights, k_desc, s_desc, table, table.stride(0), call["context_lens"], out,
            out.stride(0), cache.shape[0], context, chunk_tiles)

    def run():
        if fp4:
            mxfp4_async_dot_kernel[grid](*args, STAGES=stages, PRODUCER_WARP=flag, num_warps=4,
                                         **producer_options(flag))
        else:
            fp8_async_dot_kernel[grid](*args, NEXT_N=next_n, STAGES=stages, W_SMEM=flag,
                                       PART=part, num_warps=4)

    return run


def producer_options(producer):
    """Launch options of the MXFP4 kernel: with a producer warp the program is eight warps
    (the worker's warp group is filled out to four), so a cap of 80 registers, without
    spills, keeps three programs an SM (uncapped, ptxas takes 255: one)."""
    return dict(maxnreg=80) if producer else {}


def compile_only(next_n, stages, flag=False, fmt="fp8", part=0):
    """Build for sm_90 without a GPU; registers, spills, shared memory, SASS size."""
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    common = dict(q_ptr="*fp8e4nv", w_ptr="*fp32", table_ptr="*i32", table_sb="i32",
                  ctx_ptr="*i32", out_ptr="*fp32", out_sr="i32", num_blocks="i32",
                  max_cols="i32", chunk_tiles="i32", STAGES="constexpr")
    if fmt == "fp8":
        fn = fp8_async_dot_kernel
        sig = dict(common, NEXT_N="constexpr", W_SMEM="constexpr",
                   k_desc=f"tensordesc<fp8e4nv[{KEYS_A_PAGE}, {HEAD_DIM}],{key_layout()!r}>",
                   s_desc=f"tensordesc<fp32[1, {KEYS_A_PAGE}],{scale_layout()!r}>")
        values = dict(NEXT_N=next_n, STAGES=stages, W_SMEM=flag, PART=part)
    else:
        fn = mxfp4_async_dot_kernel
        sig = dict(common, v_desc=f"tensordesc<i32[{KEYS_A_PAGE}, 16],{packed_layout()!r}>",
                   s_desc=f"tensordesc<i32[1, {KEYS_A_PAGE}],{scale_layout()!r}>")
        values = dict(STAGES=stages, PRODUCER_WARP=flag)
    names = fn.arg_names
    sig = {n: sig.get(n, "constexpr") for n in names}
    constexprs = {(names.index(n),): v for n, v in values.items()}
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs)
    options = dict(num_warps=4, **(producer_options(flag) if fmt == "mxfp4" else {}))
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                           text=True).stdout
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
    dots = len(re.findall(r"QGMMA", sass))
    return dict(triton=triton.__version__, format=fmt, next_n=next_n, stages=stages, flag=flag,
                part=part,
                registers=int(regs.group(1)), stack=int(regs.group(2)),
                shared=kernel.metadata.shared,
                sass=len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, re.M)),
                qgmma=dots, dot_waits=len(waits), sass_text=sass)


def check(calls, settings):
    """Each setting's logits on ``calls[0]`` with ragged context lengths and a few block ids
    out of range, against the torch reference: within the contract's bound where finite,
    ``-inf`` exactly where it has ``-inf``. Returns {setting: "ok" or what failed}."""
    call = dict(calls[0])
    batch = call["block_table"].shape[0]
    g = torch.Generator(device=call["out"].device).manual_seed(1)
    context = call["max_model_len"]
    lens = torch.randint(1, context + 1, (batch,), generator=g, device=g.device,
                         dtype=torch.int32)
    lens[0] = context
    table = call["block_table"].clone()
    table[0, 1] = -1
    table[-1, 0] = call["k_cache"].shape[0] + 7
    call.update(context_lens=lens, block_table=table, out=torch.empty_like(call["out"]))
    args = (call["q"], call["k_cache"], call["weights"], lens, table, context)
    want = bench_logits.paged_mqa_logits(*args, backend="reference")
    fp4 = call["k_cache"].shape[-1] == 68
    keys, _ = reference_logits.sequence_keys(call["k_cache"], table, context, fp4, False, 0, 0)
    bound = bench_logits.contract_bound(call["q"], keys, call["weights"])
    finite = torch.isfinite(want)
    verdicts = {}
    fmt = "mxfp4" if fp4 else "fp8"
    for chunk, stages, flag in settings:
        name = setting_name(chunk, stages, flag, fmt)
        try:
            call["out"].fill_(float("-inf"))  # columns past a row's context stay -inf
            launcher(call, chunk, stages, flag)()
            torch.cuda.synchronize()
            got = call["out"]
            same_inf = torch.equal(torch.isneginf(got), torch.isneginf(want))
            err = (got - want).abs()[finite]
            verdicts[name] = "ok" if bench_logits.within(got, want, bound) else (
                f"wrong: -inf {'same' if same_inf else 'differs'}, worst "
                f"{(err / bound[finite].clamp_min(1e-30)).max().item():.3g} of the bound")
        except Exception as e:  # noqa: BLE001
            verdicts[name] = f"error {type(e).__name__}: {str(e)[:300]}"
    return verdicts


def setting_name(chunk, stages, flag, fmt):
    tag = (" w-smem" if fmt == "fp8" else " producer") if flag else ""
    return f"chunk {chunk} s{stages}{tag}"


def time_parts(rounds, batch=64, context=32768, chunk=82, stages=4):
    """The FP8 kernel's loop whole and in parts (``PART_*``) at ``next_n`` 4, 1 and 2,
    beside the library, by CUDA-graph replay (median us of each round)."""
    device = torch.device("cuda")
    print(f"FP8 keys, e4m3 queries, {batch} x {context}, chunk {chunk} s{stages}: "
          "median us of each round", flush=True)
    for next_n in (4, 1, 2):
        calls, _ = bench_logits.make_calls("fp8", "e4m3", batch, context, next_n, device)
        runs = {"library": [bench_logits.scorer_call(c) for c in calls]}
        for part, name in PART_NAMES.items():
            runs[name] = [launcher(c, chunk, stages, False, part) for c in calls]
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, fns in runs.items():
                times[name].append(graph_time_us(fns, 40))
        print(f"  next_n {next_n}: " + ", ".join(
            f"{name} {' '.join(f'{t:.1f}' for t in ts)}" for name, ts in times.items()),
            flush=True)
        del calls, runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="build for sm_90 only")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check-only", action="store_true",
                        help="only the checks against the reference (a short run first)")
    parser.add_argument("--parts", action="store_true",
                        help="FP8 at 64 x 32768: the loop's parts timed apart (PART_*)")
    args = parser.parse_args()
    if args.parts:
        time_parts(args.rounds)
        return
    if args.compile:
        for next_n in (1, 2, 4):
            for stages in (3, 4, 6):
                for w_smem in (False, True):
                    info = compile_only(next_n, stages, w_smem)
                    info.pop("sass_text")
                    print(json.dumps(info))
        for stages in (3, 4, 6, 8):
            for producer in (False, True):
                info = compile_only(1, stages, producer, fmt="mxfp4")
                info.pop("sass_text")
                print(json.dumps(info))
        return

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    lines = ["checks against the torch reference (4 x 4096, ragged, two bad block ids):"]
    for fmt, next_n in (("fp8", 1), ("fp8", 2), ("fp8", 4), ("mxfp4", 1)):
        calls, _ = bench_logits.make_calls(fmt, "e4m3", 4, 4096, next_n, device)
        settings = [(chunk, stages, flag) for chunk in (4, 16, 64) for stages in (3, 4)
                    for flag in (False, True)]
        verdicts = check(calls, settings)
        bad = {k: v for k, v in verdicts.items() if v != "ok"}
        lines.append(f"  {fmt} next_n {next_n}: {len(verdicts) - len(bad)} of {len(verdicts)}"
                     " ok" + ("; " + "; ".join(f"{k}: {v}" for k, v in list(bad.items())[:3])
                              if bad else ""))
        del calls
    print("\n".join(lines), flush=True)
    if args.check_only:
        return

    copy = copy_bandwidth_GBps()
    shapes = [("fp8", 64, 8192, 4), ("fp8", 64, 32768, 4), ("fp8", 64, 32768, 1),
              ("fp8", 64, 32768, 2), ("fp8", 8, 32768, 4), ("mxfp4", 64, 8192, 1),
              ("mxfp4", 64, 32768, 1), ("mxfp4", 128, 65536, 1), ("mxfp4", 1, 131072, 1),
              ("mxfp4", 8, 32768, 1), ("fp8", 1, 131072, 1), ("fp8", 8, 32768, 1),
              ("fp8", 128, 65536, 1)]
    records = []
    for fmt, batch, context, next_n in shapes:
        calls, nbytes = bench_logits.make_calls(fmt, "e4m3", batch, context, next_n, device)
        ours = [bench_logits.scorer_call(c) for c in calls]
        ours[0]()
        want = calls[0]["out"].clone()
        tiles = -(-context // KEYS_A_PAGE)
        # Two, three (one wave at three programs an SM) and six programs an SM.
        chunks = sorted({max(1, tiles * batch // (sms * k)) for k in (2, 3, 6)})
        # Four rows: 3 or 4 stages (three programs an SM by shared memory either way).
        settings = [(c, st, ws) for c in chunks
                    for st in ((3, 4) if next_n > 2 else (4, 6) if fmt == "fp8" else (3, 6))
                    for ws in ((False, True) if next_n > 1 or fmt == "mxfp4" else (False, ))]
        results = {}
        for chunk, stages, flag in settings:
            name = setting_name(chunk, stages, flag, fmt)
            try:
                calls[0]["out"].fill_(float("nan"))
                launcher(calls[0], chunk, stages, flag)()
                torch.cuda.synchronize()
                got = calls[0]["out"]
                finite = torch.isfinite(want)
                err = (got - want).abs()[finite]
                # FP8: the same products in the same order as the library's dot, only the
                # head sum's order differs. MXFP4: the library's dot takes the dims in
                # another order, and the tensor cores' sums keep about 14 bits (the check
                # against the reference, before, is the one with the contract's bound).
                loose = 1e-4 if fmt == "fp8" else 2e-3
                tolerance = loose * (want[finite].abs() + want[finite].abs().mean())
                same_inf = torch.equal(torch.isneginf(got), torch.isneginf(want))
                results[name] = [] if same_inf and bool((err <= tolerance).all()) else (
                    f"differs from the library (-inf {'same' if same_inf else 'differs'}, "
                    f"worst {(err / tolerance).max().item():.3g} of the tolerance)")
            except Exception as e:  # noqa: BLE001
                results[name] = f"error {type(e).__name__}: {str(e)[:300]}"
        results["ours"] = []
        for _ in range(args.rounds):
            for name, times in results.items():
                if isinstance(times, str):
                    continue
                if name == "ours":
                    fns = ours
                else:
                    chunk, rest = name.replace("chunk ", "").split(" s", 1)
                    fns = [launcher(c, int(chunk), int(rest.split()[0]), len(rest.split()) > 1)
                           for c in calls]
                times.append(graph_time_us(fns, 40))
        timed = {k: min(v) for k, v in results.items() if isinstance(v, list) and v}
        best = sorted(timed.items(), key=lambda kv: kv[1])[:4]
        pct = lambda us, n=nbytes: n / (us * 1e-6) / 1e9 / copy * 100  # noqa: E731
        lines.append(f"{fmt} {batch} x {context} next_n {next_n}: ours {timed['ours']:.1f} us "
                     f"({pct(timed['ours']):.0f} %); best: "
                     + ", ".join(f"{k} {v:.1f} ({pct(v):.0f} %)" for k, v in best))
        errors = {k: v for k, v in results.items() if isinstance(v, str)}
        if errors:
            lines.append("   not timed: " + "; ".join(f"{k}: {v}" for k, v in
                                                      list(errors.items())[:3]))
        records.append(dict(format=fmt, batch=batch, context=context, next_n=next_n,
                            bytes=nbytes, results=results))
        print(lines[-1], flush=True)
        del calls
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "exp_scorer_async_dot.json"), "w") as f:
        json.dump(dict(copy_GBps=copy, gpu=torch.cuda.get_device_name(), records=records), f,
                  indent=1)
    print(f"copy {copy:.0f} GB/s")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
