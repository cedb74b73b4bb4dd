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
from .kernels import INTERPRETED, gather_indexer_k_kernel


def _plan(k_cache, use_fp4_cache, shuffle, mxfp4_n_per_tile, backend, check_bounds):
    checks.check_flag("use_fp4_cache", use_fp4_cache)
    checks.check_flag("check_bounds", check_bounds)
    checks.check_k_cache(k_cache, use_fp4_cache)
    layout_code, n_per_tile = checks.resolve_layout(use_fp4_cache, shuffle, k_cache.shape[1],
                                                    mxfp4_n_per_tile, k_cache.device)
    return layout_code, n_per_tile, checks.resolve_backend(backend, k_cache.device)


def _launch(k_cache, use_fp4_cache, layout_code, n_per_tile, *, slots=None, block_table=None,
            cu_seq_lens=None, num_rows, max_seq_len=0, mx_scales=False, dequantize=False):
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
    block_r = 64 if INTERPRETED else 32
    by_blocks = block_table is not None
    if by_blocks:
        grid = (block_table.shape[0], -(-max_seq_len // block_r))
        table_args = (block_table, block_table.stride(0), block_table.shape[1], cu_seq_lens)
        slots = cu_seq_lens  # unused pointer
    else:
        grid = (-(-num_rows // block_r),)
        table_args = (slots, 0, 0, slots)  # unused pointers
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        gather_indexer_k_kernel[grid](
            k_cache, k_cache.stride(0), k_cache.shape[0] * k_cache.shape[1],
            slots, num_rows, *table_args, values, scales, keys,
            USE_FP4=use_fp4_cache, MX_SCALES=mx_scales, LAYOUT=layout_code,
            N_PER_TILE=n_per_tile, BLOCK_SIZE=k_cache.shape[1], BY_BLOCKS=by_blocks,
            DEQUANTIZE=dequantize, BLOCK_R=block_r, num_warps=4,
        )
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
                check_bounds=True):
    layout_code, n_per_tile, backend = _plan(k_cache, use_fp4_cache, shuffle, mxfp4_n_per_tile,
                                             backend, check_bounds)
    checks.check_index_vector("slots", slots)
    checks.check_same_device("k_cache", k_cache, slots=slots)
    if backend == "reference":
        return reference.gather(k_cache, slots, use_fp4_cache, layout_code, n_per_tile)
    if check_bounds:
        reference.check_slots_in_range(slots, k_cache.shape[0] * k_cache.shape[1])
    return _launch(k_cache, use_fp4_cache, layout_code, n_per_tile, slots=slots,
                   num_rows=slots.shape[0])


def gather_by_blocks_impl(k_cache, block_table, cu_seq_lens, use_fp4_cache, shuffle=None,
                          mxfp4_n_per_tile=0, backend=None, check_bounds=True):
    layout_code, n_per_tile, backend = _plan(k_cache, use_fp4_cache, shuffle, mxfp4_n_per_tile,
                                             backend, check_bounds)
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
        return reference.gather(k_cache, slots, use_fp4_cache, layout_code, n_per_tile)
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
    return _launch(k_cache, use_fp4_cache, layout_code, n_per_tile, block_table=block_table,
                   cu_seq_lens=cu_seq_lens, num_rows=num_rows, max_seq_len=max_len)


def dequantize_impl(k_cache, slots, use_fp4_cache, mx_scales=None, shuffle=None,
                    mxfp4_n_per_tile=0, backend=None, check_bounds=True):
    layout_code, n_per_tile, backend = _plan(k_cache, use_fp4_cache, shuffle, mxfp4_n_per_tile,
                                             backend, check_bounds)
    checks.check_flag("mx_scales", mx_scales, allow_none=True)
    checks.check_index_vector("slots", slots)
    checks.check_same_device("k_cache", k_cache, slots=slots)
    if mx_scales is None:
        mx_scales = checks.default_mx_scales(k_cache.device)
    if backend == "reference":
        values, scales = reference.gather(k_cache, slots, use_fp4_cache, layout_code, n_per_tile)
        return reference.dequantize(values, scales, use_fp4_cache, mx_scales)
    if check_bounds:
        reference.check_slots_in_range(slots, k_cache.shape[0] * k_cache.shape[1])
    return _launch(k_cache, use_fp4_cache, layout_code, n_per_tile, slots=slots,
                   num_rows=slots.shape[0], mx_scales=mx_scales and not use_fp4_cache,
                   dequantize=True)


def gather_indexer_k(
    k_cache: torch.Tensor,
    slots: torch.Tensor,
    use_fp4_cache: bool,
    *,
    shuffle: bool | None = None,
    mxfp4_n_per_tile: int = 0,
    backend: str | None = None,
    check_bounds: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored bytes of ``slots`` (any order, repeats allowed), token-major.

    Returns ``(values, scales)``: uint8 ``[n, 128]`` (FP8) or ``[n, 64]`` (MXFP4) and uint8
    ``[n, 4]``, both contiguous, whatever the page layout.
    """
    kwargs = dict(shuffle=shuffle, mxfp4_n_per_tile=mxfp4_n_per_tile, backend=backend,
                  check_bounds=check_bounds)
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole sequences: token ``i`` of sequence ``b`` (slot ``block_table[b, i // block_size] *
    block_size + i % block_size``) lands in row ``cu_seq_lens[b] + i``."""
    kwargs = dict(shuffle=shuffle, mxfp4_n_per_tile=mxfp4_n_per_tile, backend=backend,
                  check_bounds=check_bounds)
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
) -> torch.Tensor:
    """The stored keys of ``slots`` as float32 ``[n, 128]`` (codes times their scales)."""
    kwargs = dict(shuffle=shuffle, mxfp4_n_per_tile=mxfp4_n_per_tile, backend=backend,
                  check_bounds=check_bounds)
    checks.check_flag("mx_scales", mx_scales, allow_none=True)
    with _named_errors(k_cache, use_fp4_cache, kwargs, slots=slots):
        return torch.ops.indexer_kcache.dequantize_indexer_k(
            k_cache, slots, use_fp4_cache, mx_scales=mx_scales, **kwargs)
