"""``top_k_indices``: the indexer's selection of the k highest-scoring positions per row.

Row ``r`` of the result holds the columns ``c < lengths[r]`` of the row's ``k`` largest
logits, by value descending, equal values by column; NaN ranks below every number; rows
with fewer than ``k`` eligible columns end with ``-1``. See ``reference.topk`` for the
rule in code and ``kernels.topk`` for the method.

The Triton path never synchronises with the host: grid and buffer sizes come from the
shapes only, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from . import checks
from .checks import fail_type, fail_unsupported, fail_value
from .kernels import INTERPRETED
from .kernels.topk import topk_filter_kernel, topk_sample_kernel, topk_select_kernel
from .launcher import Kernel, declare_op, tunable
from .reference import topk as reference_topk
from .reference.logits import lengths_from_context

__all__ = ["TopKPlan", "TopKSettings", "check_topk", "launch_topk", "lengths_from_context",
           "run_topk", "top_k_indices", "top_k_indices_into", "topk_settings"]

SAMPLE_KERNEL = Kernel(topk_sample_kernel)
FILTER_KERNEL = Kernel(topk_filter_kernel)
SELECT_KERNEL = Kernel(topk_select_kernel)

LOGITS_DTYPES = (torch.float32, torch.bfloat16)
LENGTHS_DTYPES = (torch.int32,)
OUT_DTYPES = (torch.int32,)
# The column is the low 32-bit word of a pair, its complement ranking lower columns first.
MAX_COLS = 2**31 - 1
# The select kernel sorts min(k, cols) pairs in one program.
MAX_SORTED = 16384

# Settings (see topk_settings).
DIRECT_MAX_COLS = 8192  # up to this width a row is read whole by one program (16 keys a thread)
FILTER_STEP = 1024  # columns per program of the filter kernel (8 a thread: 8 CTAs an SM)
FILTER_WARPS = 4
SAMPLE_HITS = 128  # expected sampled elements among the top k: the threshold's precision
MIN_SAMPLE, MAX_SAMPLE = 1024, 8192  # sampled columns per long row
SAMPLE_CHUNK = 32  # consecutive columns per piece of the sample (128 bytes of fp32)
THRESHOLD_BITS = 16  # top key bits the sample's threshold is given to
CANDIDATE_STEP = 4096  # candidates per step of the select kernel when streamed
MAX_REGISTER_CANDIDATES = 8192  # at most this many candidates are searched in registers
RADIX_BITS = 8
INT64_MIN = -(2**63)  # padding of the candidates sorted by torch.sort (lowest)


class TopKSettings(NamedTuple):
    """How the Triton kernels run a shape (``topk_settings``)."""

    splits: int  # programs per row of the filter kernel; 0: the select kernel reads rows
    step: int  # columns per step of the filter kernel
    filter_warps: int
    sample_block: int  # sampled columns per row
    capacity: int  # candidate pairs per row
    select_block: int  # elements per step of the select kernel
    select_warps: int
    radix_bits: int  # bits decided per pass of the radix selection (and of the sample)
    sort_block: int  # pairs sorted per row: a power of two >= min(k, cols)
    compact: bool = True  # later radix passes read the group's copy once it fits sort_block
    # Search a source held in registers (a row of at most select_block columns, or
    # candidates that fit select_block) by counting instead of radix passes.
    count_search: bool = False
    # Long rows: sort the candidates with torch.sort (the select kernel copies the first
    # columns) instead of selecting and sorting them in the select kernel.
    torch_sort: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class TopKPlan:
    """A checked call: everything but the tensors' contents and addresses."""

    backend: str
    device: torch.device
    rows: int
    cols: int
    k: int
    is_bf16: bool
    has_lengths: bool
    row_stride: int
    out_row_stride: int
    launches: dict = field(default_factory=dict)  # TopKSettings -> the kernels' launches


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@tunable
def topk_settings(rows: int, cols: int, k: int, interpreted: bool = INTERPRETED) -> TopKSettings:
    """Deterministic settings for a shape.

    Rows up to ``DIRECT_MAX_COLS`` wide are read once by one program each, kept in
    registers and searched by counting. Longer rows are sampled (enough columns to expect
    ``SAMPLE_HITS`` of the top k), then filtered by one program per ``FILTER_STEP``
    columns (small programs, many resident per SM); the select kernel then searches the
    candidates (about 1.4 times ``min(k, cols)`` for rows without long runs of equal
    values) in registers.
    """
    sort_block = max(_next_power_of_2(min(k, cols)), 32)
    select_warps = 4 if sort_block <= 1024 else 8 if sort_block <= 4096 else 16
    direct_max = 4096 if interpreted else DIRECT_MAX_COLS
    if cols <= direct_max:
        # The row stays in registers: a warp per 512 columns, up to 16 (8192 columns: 16
        # keys a thread).
        block = max(_next_power_of_2(cols), 32)
        return TopKSettings(0, 0, 0, 0, 0, block, min(max(select_warps, block // 512), 16),
                            RADIX_BITS, sort_block, count_search=True)
    capacity = max(2 * sort_block, CANDIDATE_STEP)
    sample = min(max(_next_power_of_2(SAMPLE_HITS * cols // k), MIN_SAMPLE), MAX_SAMPLE)
    in_registers = capacity <= MAX_REGISTER_CANDIDATES
    select_block = capacity if in_registers else CANDIDATE_STEP
    warps = min(max(select_warps, select_block // 512), 16) if in_registers else select_warps
    if interpreted:  # the interpreter's cost is per program: few, large ones
        return TopKSettings(min(cols // 1024, 4), 1024, 4, sample, capacity, select_block,
                            warps, RADIX_BITS, sort_block, count_search=in_registers)
    splits = -(-cols // FILTER_STEP)  # one step a program: no serial steps behind atomics
    return TopKSettings(splits, FILTER_STEP, FILTER_WARPS, sample, capacity, select_block,
                        warps, RADIX_BITS, sort_block, count_search=in_registers)


def _check_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        fail_type(name, "an int", type(value).__name__)


def check_k(k: object) -> None:
    _check_int("k", k)
    if k <= 0:
        fail_value("k", ">= 1", k)


def check_topk(call) -> TopKPlan:
    """Check every argument of ``top_k_indices_into``; return how to run the call."""
    logits, lengths, out = call.logits, call.lengths, call.out
    checks.check_dtype("logits", logits, LOGITS_DTYPES)
    if logits.dim() != 2:
        fail_value("logits", "a 2-d tensor [rows, cols]", f"shape {tuple(logits.shape)}")
    rows, cols = logits.shape
    if cols > 1 and logits.stride(1) != 1:
        fail_value("logits.stride(1)", "1", logits.stride(1))
    if cols > MAX_COLS:
        fail_value("logits.shape[1]", f"<= {MAX_COLS} columns", cols)
    if lengths is not None:
        checks.check_dtype("lengths", lengths, LENGTHS_DTYPES)
        if lengths.dim() != 1 or lengths.shape[0] != rows:
            fail_value("lengths", f"shape [rows] = [{rows}]", f"shape {tuple(lengths.shape)}")
        if rows > 1 and lengths.stride(0) != 1:
            fail_value("lengths.stride(0)", "1", lengths.stride(0))
        checks.check_same_device("logits", logits, lengths=lengths)
    checks.check_dtype("out", out, OUT_DTYPES)
    if out.dim() != 2 or out.shape[0] != rows or out.shape[1] < 1:
        fail_value("out", f"shape [rows, k] with rows = {rows} and k >= 1",
                   f"shape {tuple(out.shape)}")
    k = out.shape[1]
    if k > 1 and out.stride(1) != 1:
        fail_value("out.stride(1)", "1", out.stride(1))
    if rows > 1 and out.stride(0) < k:
        fail_value("out.stride(0)", f">= k = {k} (rows must not overlap)", out.stride(0))
    checks.check_same_device("logits", logits, out=out)
    backend = checks.resolve_backend(call.backend, logits.device)
    if backend == "triton" and min(k, cols) > MAX_SORTED:
        fail_unsupported("k", f"min(k, cols) <= {MAX_SORTED} with the Triton backend "
                         "(backend='reference' takes any k)", k)
    return TopKPlan(backend, logits.device, rows, cols, k, logits.dtype == torch.bfloat16,
                    lengths is not None, logits.stride(0), out.stride(0))


def _launches(plan: TopKPlan, s: TopKSettings) -> tuple:
    """The kernels' launches for a setting: (sample, filter, filter grid, select)."""
    rows, cols, k = plan.rows, plan.cols, plan.k
    common = dict(row_stride=plan.row_stride, cols=cols, IS_BF16=plan.is_bf16,
                  HAS_LENGTHS=plan.has_lengths)
    sample = filter_ = filter_grid = None
    if s.splits:
        chunks = s.sample_block // SAMPLE_CHUNK
        sample_stride = -(-cols // chunks)
        sample_stride = max(-(-sample_stride // SAMPLE_CHUNK) * SAMPLE_CHUNK, SAMPLE_CHUNK)
        sample = SAMPLE_KERNEL.launch(
            plan.device, num_warps=min(max(s.sample_block // 512, 4), 16), **common, k=k,
            sample_stride=sample_stride, CHUNK=SAMPLE_CHUNK, SAMPLE_BLOCK=s.sample_block,
            RADIX_BITS=s.radix_bits, PASSES=-(-THRESHOLD_BITS // s.radix_bits))
        split_cols = -(-cols // s.splits)
        split_cols = -(-split_cols // s.step) * s.step
        filter_ = FILTER_KERNEL.launch(plan.device, num_warps=s.filter_warps, **common,
                                       split_cols=split_cols, capacity=s.capacity, BLOCK=s.step,
                                       SIGNED_PAIRS=s.torch_sort)
        filter_grid = (rows, -(-cols // split_cols))
    # Leading digits of ~column equal to all ones for every column: no tie pass needed.
    low_skip = min((32 - (cols - 1).bit_length()) // s.radix_bits, 32 // s.radix_bits - 1)
    select = SELECT_KERNEL.launch(
        plan.device, num_warps=s.select_warps, **common, k=k, low_skip=low_skip,
        low_bits=(cols - 1).bit_length(), capacity=s.capacity,
        out_row_stride=plan.out_row_stride, FROM_CANDIDATES=s.splits > 0,
        SINGLE_BLOCK=s.splits == 0 and cols <= s.select_block, BLOCK=s.select_block,
        SORT_BLOCK=s.sort_block, RADIX_BITS=s.radix_bits, COMPACT=s.compact,
        COUNT_SEARCH=s.count_search, SORTED_CANDIDATES=s.splits > 0 and s.torch_sort)
    return sample, filter_, filter_grid, select


def launch_topk(plan: TopKPlan, call, buffers: dict | None = None) -> None:
    """Run the Triton kernels of a checked call into ``call.out``. Work buffers come from
    ``torch.empty``: no host synchronisation. ``buffers`` (tests), a dict, receives them by
    name."""
    rows, cols = plan.rows, plan.cols
    if rows == 0:
        return
    out, logits = call.out, call.logits
    if cols == 0:
        out.fill_(-1)
        return
    s = topk_settings(rows, cols, plan.k)
    launches = plan.launches.get(s) or plan.launches.setdefault(s, _launches(plan, s))
    sample, filter_, filter_grid, select = launches
    device = plan.device
    lengths = call.lengths if call.lengths is not None else out  # not read without lengths
    scratch = torch.empty((rows, s.sort_block), dtype=torch.int64, device=device)
    if s.splits:
        threshold = torch.empty((rows,), dtype=torch.int32, device=device)
        cand_count = torch.empty((rows,), dtype=torch.int32, device=device)
        if s.torch_sort:  # padding that sorts last
            cand = torch.full((rows, s.capacity), INT64_MIN, dtype=torch.int64, device=device)
        else:
            cand = torch.empty((rows, s.capacity), dtype=torch.int64, device=device)
        sample((rows,), logits_ptr=logits, lengths_ptr=lengths, threshold_ptr=threshold,
               cand_count_ptr=cand_count)
        filter_(filter_grid, logits_ptr=logits, lengths_ptr=lengths, threshold_ptr=threshold,
                cand_ptr=cand, cand_count_ptr=cand_count)
        if s.torch_sort:
            cand = torch.sort(cand, dim=1, descending=True).values
        if buffers is not None:
            buffers.update(threshold=threshold, cand_count=cand_count, cand=cand)
    else:
        cand, cand_count = scratch, out  # not read: FROM_CANDIDATES is False
    select((rows,), logits_ptr=logits, lengths_ptr=lengths, cand_ptr=cand,
           cand_count_ptr=cand_count, scratch_ptr=scratch, out_ptr=out)


def run_topk(plan: TopKPlan, call) -> None:
    if plan.backend == "reference":
        call.out.copy_(reference_topk.top_k_indices(call.logits, plan.k, call.lengths))
    else:
        launch_topk(plan, call)


@declare_op(check=check_topk, run=run_topk, mutates=("out",))
def top_k_indices_into(
    logits: torch.Tensor,
    lengths: torch.Tensor | None,
    out: torch.Tensor,
    *,
    backend: str | None = None,
) -> None:
    """``top_k_indices`` written into ``out`` (int32 ``[rows, k]``; ``k`` is its width): the
    ``torch.library`` op behind the public function."""


def top_k_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None, *,
                  out: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """int32 ``[rows, k]``: per row, the columns of the ``k`` largest eligible logits.

    ``logits``: float32 or bf16 ``[rows, cols]``, ``stride(1) == 1``, any row stride.
    ``lengths``: int32 ``[rows]``; columns ``>= lengths[r]`` are never selected (default:
    all columns). Ordered by value descending, equal values by lower column first; NaN
    ranks below every number (``-inf`` included) and ``-0.0`` equals ``+0.0``; rows with
    fewer than ``k`` eligible columns end with ``-1``. ``out``: an int32 ``[rows, k]``
    tensor to write (rows of unit stride). ``backend``: ``"triton"``, ``"reference"`` or
    None (Triton on GPUs and under ``TRITON_INTERPRET=1``). No host synchronisation: a
    call can be captured in a CUDA graph.
    """
    check_k(k)
    checks.check_dtype("logits", logits, LOGITS_DTYPES)
    if logits.dim() != 2:
        fail_value("logits", "a 2-d tensor [rows, cols]", f"shape {tuple(logits.shape)}")
    if out is None:
        out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
    elif isinstance(out, torch.Tensor) and tuple(out.shape) != (logits.shape[0], k):
        fail_value("out", f"shape [rows, k] = [{logits.shape[0]}, {k}]", f"shape {tuple(out.shape)}")
    top_k_indices_into(logits, lengths, out, backend=backend)
    return out
