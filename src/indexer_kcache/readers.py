"""Readers of the paged indexer K cache: the exact inverse of every layout the store writes.

* ``gather_indexer_k``: the bytes stored for a list of slots, token-major.
* ``gather_indexer_k_by_blocks``: whole sequences through a block table (prefill).
* ``dequantize_indexer_k``: the stored keys as float32.

Out-of-range slots raise ``IndexError`` (a host-side check, one synchronisation). With
``check_bounds=False`` nothing synchronises, and such rows come back as zeros; nothing
is ever read outside the cache. The layout options (``shuffle``, ``mxfp4_n_per_tile``,
``mxfp4_d_per_tile``, ``mxfp4_scale_lanes``) mean what they mean for the store.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from . import checks, fast_path, launcher, layout, reference
from .checks import OpCall
from .kernels import INTERPRETED, gather_indexer_k_kernel
from .launcher import Kernel, Launch, declare_op

BLOCK_R = 64 if INTERPRETED else 32  # rows per program
MAX_ROW_COUNTS_KEPT = 1024  # row counts whose output shapes a gather plan keeps
GATHER_KERNEL = Kernel(gather_indexer_k_kernel)


def _unused(device: torch.device) -> torch.Tensor:
    """A pointer for the kernel's arguments a mode never reads (kept, so its address holds).
    While a dispatch mode is on (a trace's fake tensors) the tensor is the mode's, made for
    that plan alone: a kept one would stand in for real memory in later plans."""
    if fast_path.dispatch_modes():
        return torch.empty(16, dtype=torch.uint8, device=device)
    return _unused_kept(device)


@functools.cache
def _unused_kept(device: torch.device) -> torch.Tensor:
    return torch.empty(16, dtype=torch.uint8, device=device)


@dataclass(frozen=True, slots=True, eq=False)
class ReaderPlan:
    """A checked reader call: what holds while its options and tensors' metadata don't
    change (everything but the number of rows or sequences)."""

    backend: str
    device: torch.device
    use_fp4_cache: bool
    layout: int
    tile: tuple[int, int, int]  # the MXFP4 preshuffle order: (n_per_tile, d_per_tile, lanes)
    mx_scales: bool  # dequantize FP8 with four UE8M0 scale bytes
    check_bounds: bool
    block_size: int
    num_slots: int
    value_bytes: int  # of a stored row
    launch: Launch  # the gather kernel in the reader's mode
    # The gather's output shapes by row count (``_output_shapes``), filled as calls come.
    output_shapes: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _reader_plan(call: OpCall, *index_names: str, dequantize: bool = False, mx_scales: bool | None = None,
                 block_table: torch.Tensor | None = None) -> ReaderPlan:
    """The checks every reader shares (the cache, the layout options, the index tensors'
    dtypes and devices, the backend), and the plan."""
    checks.check_flag("use_fp4_cache", call.use_fp4_cache)
    checks.check_flag("check_bounds", call.check_bounds)
    k_cache = call.k_cache
    checks.check_k_cache(k_cache, call.use_fp4_cache)
    num_blocks, block_size, _ = k_cache.shape
    layout_code, *tile = checks.resolve_layout(
        call.use_fp4_cache, call.shuffle, block_size, call.mxfp4_n_per_tile, k_cache.device,
        call.mxfp4_d_per_tile, call.mxfp4_scale_lanes)
    for name in index_names:
        checks.check_dtype(name, getattr(call, name), checks.INDEX_DTYPES)
    checks.check_same_device("k_cache", k_cache, **{n: getattr(call, n) for n in index_names})
    if mx_scales is None:
        mx_scales = checks.default_mx_scales(k_cache.device)
    mx_scales = mx_scales and not call.use_fp4_cache
    by_blocks = block_table is not None
    # The arguments this mode never reads are fixed, so that a launch passes fewer.
    unused = {}
    if not by_blocks:
        unused.update(block_table_ptr=_unused(k_cache.device), cu_seq_lens_ptr=_unused(k_cache.device))
    if dequantize:
        unused.update(values_ptr=_unused(k_cache.device), scales_ptr=_unused(k_cache.device))
    else:
        unused.update(dequant_ptr=_unused(k_cache.device))
    launch = GATHER_KERNEL.launch(
        k_cache.device, num_warps=4, **unused,
        page_stride=k_cache.stride(0), num_slots=num_blocks * block_size,
        block_table_row_stride=block_table.stride(0) if by_blocks else 0,
        block_table_cols=block_table.shape[1] if by_blocks else 0,
        USE_FP4=call.use_fp4_cache, MX_SCALES=mx_scales, LAYOUT=layout_code,
        N_PER_TILE=tile[0], D_PER_TILE=tile[1], SCALE_LANES=tile[2], BLOCK_SIZE=block_size,
        BY_BLOCKS=by_blocks,
        DEQUANTIZE=dequantize, BLOCK_R=BLOCK_R)
    return ReaderPlan(
        backend=checks.resolve_backend(call.backend, k_cache.device),
        device=k_cache.device,
        use_fp4_cache=call.use_fp4_cache,
        layout=layout_code,
        tile=tuple(tile),
        mx_scales=mx_scales,
        check_bounds=call.check_bounds,
        block_size=block_size,
        num_slots=num_blocks * block_size,
        value_bytes=layout.value_bytes(call.use_fp4_cache),
        launch=launch,
    )


def check_gather(call: OpCall) -> ReaderPlan:
    checks.check_index_vector("slots", call.slots)
    return _reader_plan(call, "slots")


def check_dequantize(call: OpCall) -> ReaderPlan:
    checks.check_flag("mx_scales", call.mx_scales, allow_none=True)
    checks.check_index_vector("slots", call.slots)
    return _reader_plan(call, "slots", dequantize=True, mx_scales=call.mx_scales)


def check_sequence_counts(call: OpCall) -> None:
    """cu_seq_lens has one entry more than block_table has rows (both sizes are left free
    by a kept plan, so this runs on every call)."""
    if call.cu_seq_lens.shape[0] != call.block_table.shape[0] + 1:
        checks.fail_value("cu_seq_lens.numel()",
                          f"block_table.shape[0] + 1 = {call.block_table.shape[0] + 1}",
                          call.cu_seq_lens.shape[0])


def check_gather_by_blocks(call: OpCall) -> ReaderPlan:
    block_table = call.block_table
    checks.check_dtype("block_table", block_table, checks.INDEX_DTYPES)
    if block_table.dim() != 2 or block_table.stride(1) != 1:
        checks.fail_value("block_table", "a 2-d [num_seqs, max_blocks] tensor with stride(1) == 1",
                          f"shape {tuple(block_table.shape)}, stride {block_table.stride()}")
    checks.check_index_vector("cu_seq_lens", call.cu_seq_lens)
    check_sequence_counts(call)
    return _reader_plan(call, "block_table", "cu_seq_lens", block_table=block_table)


def _new_rows(device: torch.device, num_rows: int, value_bytes: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous ``values`` [num_rows, value_bytes] and ``scales`` [num_rows, 4] (two
    allocations: an op's outputs must not share storage)."""
    # torch.empty with the sizes as arguments: the cheapest allocation call (eager calls
    # are host-bound; see BENCHMARKS.md, "Eager calls").
    return (torch.empty(num_rows, value_bytes, dtype=torch.uint8, device=device),
            torch.empty(num_rows, layout.SCALE_BYTES, dtype=torch.uint8, device=device))


def _output_shapes(plan: ReaderPlan, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors shaped as the gather's outputs, ``values`` and ``scales``, whose
    ``empty_like`` is a fresh contiguous pair: one byte expanded (no memory; an
    overlapping tensor's ``empty_like`` is contiguous), or empty tensors for no rows.
    ``empty_like`` of a kept tensor is the cheapest allocation call from Python
    (BENCHMARKS.md, "Eager calls")."""
    if num_rows:
        byte = _unused_kept(plan.device)[:1].view(1, 1)
        shapes = (byte.expand(num_rows, plan.value_bytes),
                  byte.expand(num_rows, layout.SCALE_BYTES))
    else:
        shapes = _new_rows(plan.device, 0, plan.value_bytes)
    if len(plan.output_shapes) < MAX_ROW_COUNTS_KEPT:
        plan.output_shapes[num_rows] = shapes
    return shapes


def _new_outputs(plan: ReaderPlan, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather's fresh ``values`` and ``scales`` for ``num_rows`` rows."""
    shapes = plan.output_shapes.get(num_rows) or _output_shapes(plan, num_rows)
    return torch.empty_like(shapes[0]), torch.empty_like(shapes[1])


def run_gather(plan: ReaderPlan, call: OpCall) -> tuple[torch.Tensor, torch.Tensor]:
    k_cache, slots = call.k_cache, call.slots
    if plan.backend == "reference":
        return reference.gather(k_cache, slots, plan.use_fp4_cache, plan.layout, *plan.tile,
                                check_bounds=plan.check_bounds)
    if plan.check_bounds:
        checks.check_slots_in_range(slots, plan.num_slots)
    num_rows = slots.shape[0]  # not len(): a tensor's __len__ is Python (BENCHMARKS.md, "Eager calls")
    values, scales = _new_outputs(plan, num_rows)
    if num_rows:
        plan.launch((-(-num_rows // BLOCK_R), 1, 1), cache_ptr=k_cache, slot_ptr=slots,
                    num_rows=num_rows, values_ptr=values, scales_ptr=scales)
    return values, scales


def run_dequantize(plan: ReaderPlan, call: OpCall) -> torch.Tensor:
    k_cache, slots = call.k_cache, call.slots
    if plan.backend == "reference":
        values, scales = reference.gather(k_cache, slots, plan.use_fp4_cache, plan.layout,
                                          *plan.tile, check_bounds=plan.check_bounds)
        return reference.dequantize(values, scales, plan.use_fp4_cache, plan.mx_scales)
    if plan.check_bounds:
        checks.check_slots_in_range(slots, plan.num_slots)
    num_rows = slots.shape[0]  # not len(): a tensor's __len__ is Python (BENCHMARKS.md, "Eager calls")
    keys = torch.empty(num_rows, layout.HEAD_DIM, dtype=torch.float32, device=plan.device)
    if num_rows:
        plan.launch((-(-num_rows // BLOCK_R), 1, 1), cache_ptr=k_cache, slot_ptr=slots,
                    num_rows=num_rows, dequant_ptr=keys)
    return keys


def sequence_rows(cu_seq_lens: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(rows of the output, each sequence's length on the host) of ``cu_seq_lens``, checked:
    offsets from 0, non-decreasing (else a ``ValueError``: rows would fall outside the
    output). One synchronisation: the output's size depends on it."""
    cu = cu_seq_lens.long().cpu()
    lengths = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or (lengths.numel() and int(lengths.min()) < 0):
        shown = cu[:8].tolist()
        checks.fail_value("cu_seq_lens", "non-decreasing offsets starting at 0",
                          f"{shown}{' ...' if cu.numel() > 8 else ''}")
    return int(cu[-1]), lengths


def run_gather_by_blocks(plan: ReaderPlan, call: OpCall) -> tuple[torch.Tensor, torch.Tensor]:
    check_sequence_counts(call)
    k_cache, block_table, cu_seq_lens = call.k_cache, call.block_table, call.cu_seq_lens
    num_rows, lengths = sequence_rows(cu_seq_lens)
    if plan.check_bounds:
        # Before any row is allocated: the lengths may ask for more rows than the table holds.
        checks.check_sequence_blocks(block_table, lengths, plan.block_size,
                                     plan.num_slots // plan.block_size)
    if plan.backend == "reference":
        slots = reference.slots_of_sequences(block_table, cu_seq_lens, plan.block_size,
                                             check_bounds=plan.check_bounds)
        return reference.gather(k_cache, slots, plan.use_fp4_cache, plan.layout, *plan.tile,
                                check_bounds=plan.check_bounds)
    values, scales = _new_outputs(plan, num_rows)
    if num_rows:
        max_len = int(lengths.max())
        plan.launch(
            # Capped: a program takes every MAX_GRID_Y-th chunk of a longer sequence.
            (block_table.shape[0], min(-(-max_len // BLOCK_R), launcher.MAX_GRID_Y), 1),
            cache_ptr=k_cache,
            slot_ptr=cu_seq_lens, num_rows=num_rows,  # unused with BY_BLOCKS
            block_table_ptr=block_table, cu_seq_lens_ptr=cu_seq_lens,
            values_ptr=values, scales_ptr=scales)
    return values, scales


def _fake_rows(plan: ReaderPlan, call: OpCall) -> tuple[torch.Tensor, torch.Tensor]:
    return _new_rows(call.k_cache.device, call.slots.shape[0], plan.value_bytes)


def _fake_sequence_rows(plan: ReaderPlan, call: OpCall) -> tuple[torch.Tensor, torch.Tensor]:
    # The row count is cu_seq_lens[-1]: data, not metadata. FakeTensors (torch.compile)
    # give it a dynamic size; meta tensors have none to give.
    try:
        rows = torch.library.get_ctx().new_dynamic_size()
    except RuntimeError as e:
        raise NotImplementedError(
            "gather_indexer_k_by_blocks: meta tensors: the number of rows is cu_seq_lens[-1], "
            "data a meta tensor does not hold (FakeTensors, as torch.compile traces, take a "
            "dynamic size)") from e
    return _new_rows(call.k_cache.device, rows, plan.value_bytes)


def _fake_keys(plan: ReaderPlan, call: OpCall) -> torch.Tensor:
    return call.k_cache.new_empty((call.slots.shape[0], layout.HEAD_DIM), dtype=torch.float32)


@declare_op(check=check_gather, run=run_gather, fake=_fake_rows, token_dims={"slots": (0,)})
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
    ``[n, 4]``, both contiguous, whatever the page layout.
    """


@declare_op(check=check_gather_by_blocks, run=run_gather_by_blocks, fake=_fake_sequence_rows,
            token_dims={"block_table": (0,), "cu_seq_lens": (0,)})
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
    block_size + i % block_size``) lands in row ``cu_seq_lens[b] + i``. The rows' count is
    read from ``cu_seq_lens`` on the host (one synchronisation)."""


@declare_op(check=check_dequantize, run=run_dequantize, fake=_fake_keys,
            token_dims={"slots": (0,)})
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
