"""Readers of the paged indexer K cache: the exact inverse of every layout the store writes.

* ``gather_indexer_k``: the bytes stored for a list of slots, token-major.
* ``gather_indexer_k_by_blocks``: whole sequences through a block table (prefill).
* ``dequantize_indexer_k``: the stored keys as float32.

Out-of-range slots raise ``IndexError`` (a host-side check, one synchronisation). With
``check_bounds=False`` nothing synchronises, and such rows come back as zeros; nothing
is ever read outside the cache.
"""

from __future__ import annotations

import contextlib

import torch

from . import checks, layout, reference
from .direct_launch import launch_compiled, plain_eager
from .kernels import INTERPRETED, gather_indexer_k_kernel
from .plan_cache import PlanCache

BLOCK_R = 64 if INTERPRETED else 32  # rows per program


def _plan(k_cache, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend, check_bounds,
          mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE, mxfp4_scale_lanes=None):
    """(layout code, (n_per_tile, d_per_tile, scale_lanes), backend)."""
    checks.check_flag("use_fp4_cache", use_fp4_cache)
    checks.check_flag("check_bounds", check_bounds)
    checks.check_k_cache(k_cache, use_fp4_cache)
    layout_code, *tile = checks.resolve_layout(use_fp4_cache, shuffle, k_cache.shape[1],
                                               mxfp4_n_per_tile, k_cache.device, mxfp4_d_per_tile,
                                               mxfp4_scale_lanes)
    return layout_code, tuple(tile), checks.resolve_backend(backend, k_cache.device)


class SlotReaderPlan:
    """A checked call of ``gather_indexer_k`` or ``dequantize_indexer_k``: what does not
    change while the cache's metadata and the options don't."""

    __slots__ = ("layout", "tile", "backend", "mx_scales", "device", "launches")

    def __init__(self, layout_code, tile, backend, mx_scales, device) -> None:
        self.layout, self.tile, self.backend = layout_code, tile, backend  # tile: (n, d, lanes)
        self.mx_scales, self.device = mx_scales, device
        self.launches = {}  # specialization key -> compiled kernel (see _launch)


# A plan fixes everything but the number of slots (tensors: k_cache, slots).
_SLOT_READER_PLANS = PlanCache(token_dims=((), (0,)))


def _slot_reader_plan(k_cache, slots, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend,
                      check_bounds, mx_scales, dequantize, mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE,
                      mxfp4_scale_lanes=None) -> SlotReaderPlan:
    """Check every argument once per new metadata; raises before reading anything."""
    options = (use_fp4_cache, shuffle, mxfp4_n_per_tile, backend, check_bounds, mx_scales,
               dequantize, mxfp4_d_per_tile, mxfp4_scale_lanes, type(use_fp4_cache), type(shuffle),
               type(mxfp4_n_per_tile), type(check_bounds), type(mx_scales), type(mxfp4_d_per_tile),
               type(mxfp4_scale_lanes))
    tensors = (k_cache, slots)
    plan = _SLOT_READER_PLANS.get(options, tensors)
    if plan is not None:
        return plan
    layout_code, tile, backend = _plan(k_cache, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend,
                                       check_bounds, mxfp4_d_per_tile, mxfp4_scale_lanes)
    checks.check_flag("mx_scales", mx_scales, allow_none=True)
    checks.check_index_vector("slots", slots)
    checks.check_same_device("k_cache", k_cache, slots=slots)
    if mx_scales is None:
        mx_scales = checks.default_mx_scales(k_cache.device)
    plan = SlotReaderPlan(layout_code, tile, backend,
                          dequantize and mx_scales and not use_fp4_cache, k_cache.get_device())
    if slots.stride() == (1,):  # a one-element vector's other strides would let longer ones in
        _SLOT_READER_PLANS.add(options, tensors, plan)
    return plan


def _launch(k_cache, use_fp4_cache, layout_code, tile, *, slots=None, block_table=None,
            cu_seq_lens=None, num_rows, max_seq_len=0, mx_scales=False, dequantize=False,
            plan: SlotReaderPlan | None = None):
    device = k_cache.device
    if dequantize:
        keys = torch.empty((num_rows, layout.HEAD_DIM), dtype=torch.float32, device=device)
        values = scales = keys  # not written: the kernel's gather branch is compiled out
    else:
        values = torch.empty((num_rows, layout.value_bytes(use_fp4_cache)), dtype=torch.uint8,
                             device=device)
        scales = torch.empty((num_rows, layout.SCALE_BYTES), dtype=torch.uint8, device=device)
        keys = values  # not written: the kernel's dequantize branch is compiled out
    if num_rows == 0:
        return keys if dequantize else (values, scales)
    by_blocks = block_table is not None
    constexprs = (use_fp4_cache, mx_scales, layout_code, *tile, k_cache.shape[1], by_blocks,
                  dequantize, BLOCK_R)
    tensors = (k_cache, cu_seq_lens if by_blocks else slots, values, scales, keys)
    compiled = key = None
    if plan is not None and not INTERPRETED:
        # Slot readers: after their first launch, the compiled kernel, called directly with
        # the addresses. The plan's key fixes k_cache's sizes; Triton specializes pointers
        # on 16-byte alignment and types num_rows as i32 or i64 by its value.
        pointers = tuple(t.data_ptr() for t in tensors)
        key = (dequantize, num_rows > 0x7FFFFFFF, *[p % 16 == 0 for p in pointers])
        compiled = plan.launches.get(key)
    cache_arg, slots_arg, values_arg, scales_arg, keys_arg = (
        tensors if compiled is None else pointers)
    if by_blocks:  # slots_arg (cu_seq_lens) is an unused pointer there
        grid = (block_table.shape[0], -(-max_seq_len // BLOCK_R))
        table_args = (block_table, block_table.stride(0), block_table.shape[1], cu_seq_lens)
    else:  # the table's pointers are unused
        grid = (-(-num_rows // BLOCK_R),)
        table_args = (slots_arg, 0, 0, slots_arg)
    args = (cache_arg, k_cache.stride(0), k_cache.shape[0] * k_cache.shape[1], slots_arg,
            num_rows, *table_args, values_arg, scales_arg, keys_arg, *constexprs)
    if compiled is not None:
        launch_compiled(compiled, plan.device, grid[0], args)
    else:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            compiled = gather_indexer_k_kernel[grid](*args, num_warps=4)
        if key is not None:
            plan.launches[key] = compiled
    return keys if dequantize else (values, scales)


class _named_errors:
    """The ops' schemas reject wrong argument types with a bare RuntimeError before anything
    runs; on such an error, run the checks that name the argument, then re-raise."""

    def __init__(self, k_cache, use_fp4_cache, kwargs, **index_tensors):
        self.args = (k_cache, use_fp4_cache, kwargs, index_tensors)

    def __enter__(self):
        return None

    def __exit__(self, kind, error, tb):
        if kind is not None and issubclass(kind, RuntimeError):
            k_cache, use_fp4_cache, kwargs, index_tensors = self.args
            _plan(k_cache, use_fp4_cache, **kwargs)
            for name, t in index_tensors.items():
                checks.check_dtype(name, t, checks.INDEX_DTYPES)
        return False


def gather_impl(k_cache, slots, use_fp4_cache, shuffle=None, mxfp4_n_per_tile=0, backend=None,
                check_bounds=True, mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE, mxfp4_scale_lanes=None):
    plan = _slot_reader_plan(k_cache, slots, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend,
                             check_bounds, None, False, mxfp4_d_per_tile, mxfp4_scale_lanes)
    if plan.backend == "reference":
        return reference.gather(k_cache, slots, use_fp4_cache, plan.layout, *plan.tile)
    if check_bounds:
        reference.check_slots_in_range(slots, k_cache.shape[0] * k_cache.shape[1])
    return _launch(k_cache, use_fp4_cache, plan.layout, plan.tile, slots=slots,
                   num_rows=slots.shape[0], plan=plan)


def gather_by_blocks_impl(k_cache, block_table, cu_seq_lens, use_fp4_cache, shuffle=None,
                          mxfp4_n_per_tile=0, backend=None, check_bounds=True,
                          mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE, mxfp4_scale_lanes=None):
    layout_code, tile, backend = _plan(k_cache, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend,
                                       check_bounds, mxfp4_d_per_tile, mxfp4_scale_lanes)
    checks.check_dtype("block_table", block_table, checks.INDEX_DTYPES)
    if block_table.dim() != 2 or block_table.stride(1) != 1:
        checks.fail_value("block_table", "a 2-d [num_seqs, max_blocks] tensor with stride(1) == 1",
                          f"shape {tuple(block_table.shape)}, stride {block_table.stride()}")
    checks.check_index_vector("cu_seq_lens", cu_seq_lens)
    if cu_seq_lens.shape[0] != block_table.shape[0] + 1:
        checks.fail_value("cu_seq_lens.numel()",
                          f"block_table.shape[0] + 1 = {block_table.shape[0] + 1}",
                          cu_seq_lens.shape[0])
    checks.check_same_device("k_cache", k_cache, block_table=block_table, cu_seq_lens=cu_seq_lens)
    block_size = k_cache.shape[1]
    if backend == "reference":
        slots = reference.slots_of_sequences(block_table, cu_seq_lens, block_size)
        return reference.gather(k_cache, slots, use_fp4_cache, layout_code, *tile)
    cu = cu_seq_lens.long().cpu()  # the output's size: one synchronisation
    lengths = cu[1:] - cu[:-1]
    if lengths.numel() and int(lengths.min()) < 0:
        checks.fail_value("cu_seq_lens", "non-decreasing offsets", cu.tolist())
    num_rows = int(cu[-1]) if cu.numel() else 0
    max_len = int(lengths.max()) if lengths.numel() else 0
    if check_bounds and num_rows:
        reference.check_slots_in_range(
            reference.slots_of_sequences(block_table, cu_seq_lens, block_size),
            k_cache.shape[0] * block_size, "slots of the sequences")
    return _launch(k_cache, use_fp4_cache, layout_code, tile, block_table=block_table,
                   cu_seq_lens=cu_seq_lens, num_rows=num_rows, max_seq_len=max_len)


def dequantize_impl(k_cache, slots, use_fp4_cache, mx_scales=None, shuffle=None,
                    mxfp4_n_per_tile=0, backend=None, check_bounds=True,
                    mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE, mxfp4_scale_lanes=None):
    plan = _slot_reader_plan(k_cache, slots, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend,
                             check_bounds, mx_scales, True, mxfp4_d_per_tile, mxfp4_scale_lanes)
    if plan.backend == "reference":
        values, scales = reference.gather(k_cache, slots, use_fp4_cache, plan.layout, *plan.tile)
        return reference.dequantize(values, scales, use_fp4_cache, plan.mx_scales)
    if check_bounds:
        reference.check_slots_in_range(slots, k_cache.shape[0] * k_cache.shape[1])
    return _launch(k_cache, use_fp4_cache, plan.layout, plan.tile, slots=slots,
                   num_rows=slots.shape[0], mx_scales=plan.mx_scales, dequantize=True, plan=plan)


def gather_indexer_k(
    k_cache: torch.Tensor,
    slots: torch.Tensor,
    use_fp4_cache: bool,
    *,
    shuffle: bool | None = None,
    mxfp4_n_per_tile: int = 0,
    backend: str | None = None,
    check_bounds: bool = True,
    mxfp4_d_per_tile: int = layout.MXFP4_D_PER_TILE,
    mxfp4_scale_lanes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored bytes of ``slots`` (any order, repeats allowed), token-major.

    Returns ``(values, scales)``: uint8 ``[n, 128]`` (FP8) or ``[n, 64]`` (MXFP4) and uint8
    ``[n, 4]``, both contiguous, whatever the page layout. ``shuffle``, ``mxfp4_n_per_tile``,
    ``mxfp4_d_per_tile`` and ``mxfp4_scale_lanes`` name the layout as the store's do.
    """
    if plain_eager(k_cache, slots):  # the op's implementation, without the dispatcher
        return gather_impl(k_cache, slots, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend,
                           check_bounds, mxfp4_d_per_tile, mxfp4_scale_lanes)
    kwargs = dict(shuffle=shuffle, mxfp4_n_per_tile=mxfp4_n_per_tile, backend=backend,
                  check_bounds=check_bounds, mxfp4_d_per_tile=mxfp4_d_per_tile,
                  mxfp4_scale_lanes=mxfp4_scale_lanes)
    with _named_errors(k_cache, use_fp4_cache, kwargs, slots=slots):
        return torch.ops.indexer_kcache.gather_indexer_k(k_cache, slots, use_fp4_cache, **kwargs)


def gather_indexer_k_by_blocks(
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    use_fp4_cache: bool,
    *,
    shuffle: bool | None = None,
    mxfp4_n_per_tile: int = 0,
    backend: str | None = None,
    check_bounds: bool = True,
    mxfp4_d_per_tile: int = layout.MXFP4_D_PER_TILE,
    mxfp4_scale_lanes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole sequences: token ``i`` of sequence ``b`` (slot ``block_table[b, i // block_size] *
    block_size + i % block_size``) lands in row ``cu_seq_lens[b] + i``."""
    kwargs = dict(shuffle=shuffle, mxfp4_n_per_tile=mxfp4_n_per_tile, backend=backend,
                  check_bounds=check_bounds, mxfp4_d_per_tile=mxfp4_d_per_tile,
                  mxfp4_scale_lanes=mxfp4_scale_lanes)
    with _named_errors(k_cache, use_fp4_cache, kwargs, block_table=block_table,
                       cu_seq_lens=cu_seq_lens):
        return torch.ops.indexer_kcache.gather_indexer_k_by_blocks(
            k_cache, block_table, cu_seq_lens, use_fp4_cache, **kwargs)


def dequantize_indexer_k(
    k_cache: torch.Tensor,
    slots: torch.Tensor,
    use_fp4_cache: bool,
    *,
    mx_scales: bool | None = None,
    shuffle: bool | None = None,
    mxfp4_n_per_tile: int = 0,
    backend: str | None = None,
    check_bounds: bool = True,
    mxfp4_d_per_tile: int = layout.MXFP4_D_PER_TILE,
    mxfp4_scale_lanes: int | None = None,
) -> torch.Tensor:
    """The stored keys of ``slots`` as float32 ``[n, 128]`` (codes times their scales)."""
    if plain_eager(k_cache, slots):  # the op's implementation, without the dispatcher
        return dequantize_impl(k_cache, slots, use_fp4_cache, mx_scales, shuffle,
                               mxfp4_n_per_tile, backend, check_bounds, mxfp4_d_per_tile,
                               mxfp4_scale_lanes)
    kwargs = dict(shuffle=shuffle, mxfp4_n_per_tile=mxfp4_n_per_tile, backend=backend,
                  check_bounds=check_bounds, mxfp4_d_per_tile=mxfp4_d_per_tile,
                  mxfp4_scale_lanes=mxfp4_scale_lanes)
    checks.check_flag("mx_scales", mx_scales, allow_none=True)
    with _named_errors(k_cache, use_fp4_cache, kwargs, slots=slots):
        return torch.ops.indexer_kcache.dequantize_indexer_k(
            k_cache, slots, use_fp4_cache, mx_scales=mx_scales, **kwargs)
