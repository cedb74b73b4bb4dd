"""Readers: gather stored rows back into token-major form, optionally dequantized.

One program copies ``BLOCK_R`` rows. The slot of each row comes either from a slot
vector or, for whole sequences (``BY_BLOCKS``), from a block table and ``cu_seq_lens``.
Rows whose slot is out of range read nothing and come out as zeros.
"""

import triton
import triton.language as tl

from .. import layout
from ..layout import scale_offset_tl, value_offset_tl
from .numerics import e2m1_to_float, e4m3_to_float, ue8m0_to_float


# num_rows is not specialized (Triton would assume a multiple of 16 from one call's count):
# the launcher reuses a compiled kernel for any number of rows.
@triton.jit(do_not_specialize=["num_rows"])
def gather_indexer_k_kernel(
    cache_ptr, page_stride, num_slots,
    slot_ptr, num_rows,
    block_table_ptr, block_table_row_stride, block_table_cols, cu_seq_lens_ptr,
    values_ptr, scales_ptr, dequant_ptr,
    USE_FP4: tl.constexpr,
    MX_SCALES: tl.constexpr,
    LAYOUT: tl.constexpr,
    N_PER_TILE: tl.constexpr,
    D_PER_TILE: tl.constexpr,
    SCALE_LANES: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BY_BLOCKS: tl.constexpr,
    DEQUANTIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    if BY_BLOCKS:
        # program (sequence b, c): tokens c * BLOCK_R ... of sequence b, and every
        # num_programs(1)-th chunk after (the grid's second dimension is capped, so a
        # sequence longer than the cap times BLOCK_R takes several chunks a program).
        seq = tl.program_id(0).to(tl.int64)
        start = tl.load(cu_seq_lens_ptr + seq).to(tl.int64)
        length = tl.load(cu_seq_lens_ptr + seq + 1).to(tl.int64) - start
        for chunk in range(tl.program_id(1).to(tl.int64), tl.cdiv(length, BLOCK_R),
                           tl.num_programs(1).to(tl.int64)):
            i = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
            live = i < length
            column = i // BLOCK_SIZE
            block = tl.load(block_table_ptr + seq * block_table_row_stride + column,
                            mask=live & (column < block_table_cols), other=-1).to(tl.int64)
            # The block id is range-checked before it is scaled (a huge one would wrap).
            in_cache = (block >= 0) & (block < num_slots // BLOCK_SIZE)
            slot = tl.where(in_cache, block * BLOCK_SIZE + i % BLOCK_SIZE, -1)
            _copy_rows(cache_ptr, page_stride, num_slots, start + i, slot, live, values_ptr,
                       scales_ptr, dequant_ptr, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE,
                       D_PER_TILE, SCALE_LANES, BLOCK_SIZE, DEQUANTIZE, BLOCK_R)
    else:
        row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        live = row < num_rows
        slot = tl.load(slot_ptr + row, mask=live, other=-1).to(tl.int64)
        _copy_rows(cache_ptr, page_stride, num_slots, row, slot, live, values_ptr, scales_ptr,
                   dequant_ptr, USE_FP4, MX_SCALES, LAYOUT, N_PER_TILE, D_PER_TILE,
                   SCALE_LANES, BLOCK_SIZE, DEQUANTIZE, BLOCK_R)


@triton.jit
def _copy_rows(cache_ptr, page_stride, num_slots, row, slot, live, values_ptr, scales_ptr,
               dequant_ptr, USE_FP4: tl.constexpr, MX_SCALES: tl.constexpr,
               LAYOUT: tl.constexpr, N_PER_TILE: tl.constexpr, D_PER_TILE: tl.constexpr,
               SCALE_LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr, DEQUANTIZE: tl.constexpr,
               BLOCK_R: tl.constexpr):
    """Output rows ``row`` [BLOCK_R] (those ``live``) from cache slots ``slot``: the stored
    bytes, or the keys dequantized; zeros for a slot outside the cache."""
    VALUE_BYTES: tl.constexpr = layout.MXFP4_VALUE_BYTES if USE_FP4 else layout.FP8_VALUE_BYTES
    SCALE_BYTES: tl.constexpr = layout.SCALE_BYTES
    HEAD_DIM: tl.constexpr = layout.HEAD_DIM
    readable = live & (slot >= 0) & (slot < num_slots)
    page_ptr = cache_ptr + (slot // BLOCK_SIZE) * page_stride
    p = slot % BLOCK_SIZE

    d = tl.arange(0, VALUE_BYTES)
    i4 = tl.arange(0, SCALE_BYTES)
    value_at = value_offset_tl(p[:, None], d[None, :], BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE,
                               D_PER_TILE, SCALE_LANES)
    scale_at = scale_offset_tl(p[:, None], i4[None, :], BLOCK_SIZE, VALUE_BYTES, LAYOUT,
                               N_PER_TILE, D_PER_TILE, SCALE_LANES)
    values = tl.load(page_ptr[:, None] + value_at, mask=readable[:, None], other=0)
    scales = tl.load(page_ptr[:, None] + scale_at, mask=readable[:, None], other=0)
    if DEQUANTIZE:
        out = dequant_ptr + row[:, None] * HEAD_DIM
        if USE_FP4:
            lo = e2m1_to_float((values & 0xF).to(tl.int32))
            hi = e2m1_to_float((values >> 4).to(tl.int32))
            GROUPS: tl.constexpr = HEAD_DIM // layout.MXFP4_GROUP
            decoded = tl.reshape(tl.join(lo, hi), [BLOCK_R, GROUPS, layout.MXFP4_GROUP])
            keys = tl.reshape(decoded * ue8m0_to_float(scales)[:, :, None], [BLOCK_R, HEAD_DIM])
        else:
            if MX_SCALES:  # four equal UE8M0 bytes: read the first
                first = scale_offset_tl(p, 0, BLOCK_SIZE, VALUE_BYTES, LAYOUT, N_PER_TILE,
                                        D_PER_TILE, SCALE_LANES)
                scale = ue8m0_to_float(tl.load(page_ptr + first, mask=readable, other=0))
            else:  # little-endian fp32
                word = tl.sum(scales.to(tl.uint32) << (8 * i4[None, :]).to(tl.uint32), axis=1)
                scale = word.to(tl.float32, bitcast=True)
            keys = e4m3_to_float(values) * scale[:, None]
        tl.store(out + tl.arange(0, HEAD_DIM)[None, :], keys, mask=live[:, None])
    else:
        tl.store(values_ptr + row[:, None] * VALUE_BYTES + d[None, :], values, mask=live[:, None])
        tl.store(scales_ptr + row[:, None] * SCALE_BYTES + i4[None, :], scales, mask=live[:, None])
