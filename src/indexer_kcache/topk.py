"""``top_k_indices``: the indexer's selection of the k highest-scoring positions per row.

Row ``r`` of the result holds the columns ``c < lengths[r]`` of the row's ``k`` largest
logits, by value descending, equal values by column; NaN ranks below every number; rows
with fewer than ``k`` eligible columns end with ``-1``. See ``reference.topk`` for the
rule in code and ``kernels.topk`` for the method.

The Triton path never synchronises with the host: grid and buffer sizes come from the
shapes only, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from . import checks
from .checks import (
    PDL_AT_EXIT,
    PDL_EARLY,
    PDL_NONE,
    OpCall,
    fail_unsupported,
    fail_value,
    pdl_supported,
)
from .kernels import INTERPRETED
from .kernels.topk import (
    COUNTER_ROW,
    MARGIN_EXTRA,
    MARGIN_SIGMAS,
    WARP_APPEND_ELEMENTS,
    topk_count_kernel,
    topk_filter_kernel,
    topk_place_kernel,
    topk_rank_kernel,
    topk_sample_kernel,
    topk_select_kernel,
)
from .launcher import MAX_GRID_Y, Kernel, declare_op, tunable
from .reference import topk as reference_topk
from .reference.logits import lengths_from_context
from .util import next_power_of_2

__all__ = ["TopKPlan", "TopKSettings", "check_topk", "launch_topk", "lengths_from_context",
           "rank_programs", "run_topk", "top_k_indices", "top_k_indices_into", "topk_settings"]

SAMPLE_KERNEL = Kernel(topk_sample_kernel)
FILTER_KERNEL = Kernel(topk_filter_kernel)
SELECT_KERNEL = Kernel(topk_select_kernel)
COUNT_KERNEL = Kernel(topk_count_kernel)
PLACE_KERNEL = Kernel(topk_place_kernel)
RANK_KERNEL = Kernel(topk_rank_kernel)

LOGITS_DTYPES = (torch.float32, torch.bfloat16)
LENGTHS_DTYPES = (torch.int32,)
OUT_DTYPES = (torch.int32,)
# The column is the low 32-bit word of a pair, its complement ranking lower columns first;
# columns stay below 2**31 with room for a step of the kernels' loops.
MAX_COLS = 2**31 - 2**16
# The select kernel ranks at most this many pairs in one program (min(k, cols) or more).
MAX_SORTED = 16384

# Settings (see topk_settings).
DIRECT_MAX_COLS = 4096  # up to this width the select kernel reads rows whole
FILTER_STEP = 1024  # columns per step of the filter kernel (8 a thread)
FILTER_STEPS = 2  # steps per program of the filter kernel, from FILTER_STEPS_FROM elements
FILTER_STEPS_FROM = 1 << 22
FILTER_WARPS = 4
SAMPLE_HITS = 128  # expected sampled elements among the top k: the threshold's precision
# The sample where the count and place kernels run: a looser threshold, whose larger
# block they take at little cost (measured in BENCHMARKS.md).
PLACED_SAMPLE_HITS = 64
MIN_SAMPLE, MAX_SAMPLE = 1024, 8192  # sampled columns per long row
SAMPLE_CHUNK = 32  # consecutive columns per piece of the sample (128 bytes of fp32)
THRESHOLD_BITS = 16  # top key bits the sample's threshold is given to
STREAM_BLOCK = 4096  # columns per step of the radix selection streamed from a row
RADIX_BITS = 8
RANK_CHUNK = 128  # pairs ranked per program (BENCHMARKS.md, "The rank kernel's chunk")
MAX_SAMPLE_WARPS = 8  # the sample kernel's warps: one per 512 sampled columns, 4 to this
RANK_WIDTH = 4  # bucket members compared per step
# A short launch of at most PLACE_MAX_ROWS rows has its candidates counted into their
# buckets and placed by the count and place kernels, PLACE_PART a program (several
# programs a row), instead of by the select kernel (one program a row); the place kernel
# at PLACE_WARPS warps a 4096-bucket block, more for larger blocks; measured in
# BENCHMARKS.md.
PLACE_PART = 512
PLACE_MAX_ROWS = 64
PLACE_WARPS = 4
# The select kernel's shared counters (4 bytes a bucket) are static shared memory beside
# what Triton allocates (as many bytes again at these blocks): within the 48 KiB a launch
# may take without opting in to more.
SHARED_SLOTS_MAX_BLOCK = 4096
# The next kernel launched early while the filter's programs leave SMs free (an early
# launched kernel's programs hold SM room while they wait), else as the programs exit;
# measured in BENCHMARKS.md.
PDL_MAX_PROGRAMS = 128


class TopKSettings(NamedTuple):
    """How the Triton kernels run a shape (``topk_settings``)."""

    splits: int  # programs per row of the filter kernel; 0: the select kernel reads rows
    step: int  # columns per step of the filter kernel (splits * step * split_steps >= cols)
    filter_warps: int
    sample_block: int  # sampled columns per row
    block: int  # pairs ranked per row (the candidate capacity): a power of two >= min(k, cols)
    select_warps: int
    radix_bits: int  # bits decided per pass of the radix selection (and of the sample)
    stream_block: int = STREAM_BLOCK
    chunk: int = RANK_CHUNK  # pairs ranked per program of the rank kernel
    width: int = RANK_WIDTH  # bucket members compared per step
    split_steps: int = 1  # steps of the filter kernel per program (the next one prefetched)
    sample_digit_bits: int = 1  # bits of the sample's threshold decided per pass
    threshold_bits: int = THRESHOLD_BITS  # top key bits the sample's threshold is given to
    max_registers: int = 0  # the select kernel's register cap per thread; 0 = the compiler's
    sample_warps: int = 0  # the sample kernel's warps; 0: see MAX_SAMPLE_WARPS
    # Programmatic dependent launch (NVIDIA sm_90+): each kernel is launched while the
    # previous one runs and waits for it on the GPU, hiding the launches' latency.
    # PDL_NONE, PDL_EARLY or PDL_AT_EXIT (kernels.dependent_launch).
    pdl: int = 0
    # Candidates a program of the count and place kernels, which then count the candidates
    # into their buckets and place them (block // place_part programs a row each) instead
    # of the select kernel (one program a row); 0: the select kernel (with splits only).
    place_part: int = 0
    place_warps: int = PLACE_WARPS  # the place kernel's (the count kernel takes PLACE_WARPS)
    # The select kernel counts its pairs into their buckets by atomic adds on shared memory
    # (inline PTX: NVIDIA, blocks of at most SHARED_SLOTS_MAX_BLOCK pairs, a whole number a
    # thread) instead of on its row of ``counts`` in device memory. On where it orders a
    # row's candidates (measured 8 to 15 % faster there; BENCHMARKS.md), off for rows
    # read whole (not timed); a block past SHARED_SLOTS_MAX_BLOCK counts in device memory.
    shared_slots: bool = False
    # The sample kernel finds its threshold (the same one) by two passes of 8-bit digit
    # counts in shared memory (inline PTX: NVIDIA, one-bit passes, at most 16 bits) instead
    # of a block-wide sum a bit. About 1 us slower on logits of both signs, up to 1.4 us
    # faster on logits of one sign (BENCHMARKS.md): off.
    shared_sample: bool = False


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
    apart: tuple  # checks.output_extents: out and the inputs it must not overlap
    launches: dict = field(default_factory=dict)  # TopKSettings -> the kernels' launches


def _select_warps(block: int, short: bool = False) -> int:
    """8 pairs a thread, as 4 to 16 warps; 16 pairs a thread in a short launch of many rows
    (its select programs are a single round on the SMs, whose time is their block-wide
    steps: fewer warps make each shorter)."""
    return min(max(block // (512 if short else 256), 4), 16)


@tunable
def topk_settings(rows: int, cols: int, k: int, interpreted: bool = INTERPRETED,
                  direct_max_cols: int | None = None,
                  count_and_place: bool | None = None) -> TopKSettings:
    """Deterministic settings for a shape (``direct_max_cols`` and ``count_and_place``
    override the rules below, for experiments).

    Rows up to ``direct_max_cols`` (default ``DIRECT_MAX_COLS``, 1024 under the
    interpreter) wide are read once by the select kernel and ranked whole. Longer rows
    are sampled (enough columns to expect ``SAMPLE_HITS`` of the top k,
    ``PLACED_SAMPLE_HITS`` where the count and place kernels run), then filtered
    ``FILTER_STEP`` columns a step, one atomic add a step (each warp's own on NVIDIA, else
    the program's): one step a program for fewer than ``FILTER_STEPS_FROM`` elements
    (many small programs), ``FILTER_STEPS`` from there (each step's load in flight while
    the step before waits for its atomics); the select (or count and place) and rank
    kernels order the candidates (about 1.4 times ``min(k, cols)`` for rows without long runs of equal
    values; more for a small sample of a long row) in a block with room for 1.25 times
    the count the sample's rank predicts, and at least twice ``min(k, cols)``. Long rows
    on a GPU use programmatic dependent launch where the GPU has it: each kernel released
    early while the filter has at most ``PDL_MAX_PROGRAMS`` programs, else as the previous
    one's programs exit (rows read whole, and the interpreter, launch plainly). A short
    launch (fewer than ``FILTER_STEPS_FROM`` elements) is the chain of its kernels' steps,
    not their throughput: with at most ``PLACE_MAX_ROWS`` rows its candidates are counted
    and placed ``PLACE_PART`` a program by the count and place kernels, several programs a
    row, instead of by the select kernel's one (with more rows the split is slower: the
    L2 serves the count kernel's atomics no faster, and every place program takes the
    row's whole prefix sum; see BENCHMARKS.md, "The top-k"); with more, the select kernel
    runs at fewer warps, counting its candidates into their buckets in shared memory
    (``shared_slots``). The rank kernel takes ``RANK_CHUNK`` pairs a program.
    """
    want_block = max(next_power_of_2(min(k, cols)), 32)
    if direct_max_cols is None:
        direct_max_cols = 1024 if interpreted else DIRECT_MAX_COLS
    if cols <= direct_max_cols:
        block = max(next_power_of_2(cols), 32)
        return TopKSettings(0, 0, 0, 0, block, _select_warps(block), RADIX_BITS)
    short = rows * cols < FILTER_STEPS_FROM
    steps = max(1 if short else FILTER_STEPS, -(-cols // (MAX_GRID_Y * FILTER_STEP)))
    splits = -(-cols // (steps * FILTER_STEP))
    # (The interpreter counts and places, the path with the more to check, two programs a
    # row, with the sample of the select kernel's path.)
    placed = (short and rows <= PLACE_MAX_ROWS) or interpreted
    if count_and_place is not None:
        placed = count_and_place
    hits = PLACED_SAMPLE_HITS if placed and not interpreted else SAMPLE_HITS
    sample = min(max(next_power_of_2(hits * cols // k), MIN_SAMPLE), MAX_SAMPLE)
    block = min(max(2 * want_block, next_power_of_2(-(-5 * expected_candidates(
        cols, k, sample) // 4))), MAX_SORTED)
    if interpreted:  # the interpreter's cost is per program: few, large ones
        steps = -(-cols // (4 * FILTER_STEP))
        return TopKSettings(-(-cols // (steps * FILTER_STEP)), FILTER_STEP, 4, sample, block, 4,
                            RADIX_BITS, split_steps=steps, place_part=block // 2 if placed else 0)
    return TopKSettings(splits, FILTER_STEP, FILTER_WARPS, sample, block,
                        _select_warps(block, short), RADIX_BITS,
                        split_steps=steps,
                        pdl=PDL_EARLY if rows * splits <= PDL_MAX_PROGRAMS else PDL_AT_EXIT,
                        place_part=min(PLACE_PART, block) if placed else 0,
                        place_warps=min(max(block // 1024, PLACE_WARPS), 16),
                        shared_slots=not placed)


def expected_candidates(cols: int, k: int, sample: int) -> int:
    """The filter's candidates in a full row of ``cols`` columns, as the sample kernel's
    rank predicts them: the row's share of the sample's ``r``-th largest (see
    ``topk_sample_kernel``)."""
    sampled = min(sample, cols)
    expected = -(-min(k, cols) * sampled // cols)
    rank = expected + int(math.sqrt(expected) * MARGIN_SIGMAS.value) + MARGIN_EXTRA.value
    return -(-rank * cols // sampled)


def check_k(k: object) -> None:
    checks.check_int("k", k, at_least=1, at_most=checks.MAX_COLUMNS)


def check_topk(call: OpCall) -> TopKPlan:
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
    _check_lengths(lengths, logits)
    checks.check_dtype("out", out, OUT_DTYPES)
    if out.dim() != 2 or out.shape[0] != rows or out.shape[1] < 1:
        fail_value("out", f"shape [rows, k] with rows = {rows} and k >= 1",
                   f"shape {tuple(out.shape)}")
    k = out.shape[1]
    if k > 1 and out.stride(1) != 1:
        fail_value("out.stride(1)", "1", out.stride(1))
    checks.check_rows_apart("out", out, "k")
    checks.check_same_device("logits", logits, out=out)
    backend = _check_backend(call.backend, logits, k)
    return TopKPlan(backend, logits.device, rows, cols, k, logits.dtype == torch.bfloat16,
                    lengths is not None, logits.stride(0), out.stride(0),
                    checks.output_extents(call, "out", ("logits", "lengths")))


def _check_lengths(lengths: torch.Tensor | None, logits: torch.Tensor) -> None:
    if lengths is not None:
        rows = logits.shape[0]
        checks.check_dtype("lengths", lengths, LENGTHS_DTYPES)
        if lengths.dim() != 1 or lengths.shape[0] != rows:
            fail_value("lengths", f"shape [rows] = [{rows}]", f"shape {tuple(lengths.shape)}")
        if rows > 1 and lengths.stride(0) != 1:
            fail_value("lengths.stride(0)", "1", lengths.stride(0))
        checks.check_same_device("logits", logits, lengths=lengths)


def _check_backend(backend: str | None, logits: torch.Tensor, k: int) -> str:
    """The backend that runs the call, and ``k`` within what it takes."""
    if backend is not None and not isinstance(backend, str):  # as the op's option check
        checks.fail_type("backend", "a str or None", checks.type_name(backend))
    backend = checks.resolve_backend(backend, logits.device)
    if backend == "triton" and min(k, logits.shape[1]) > MAX_SORTED:
        fail_unsupported("k", f"min(k, cols) <= {MAX_SORTED} with the Triton backend "
                         "(backend='reference' takes any k)", k)
    return backend


class TopKLaunches(NamedTuple):
    """The kernels' launches for a plan and setting (``None``: not launched) and grids."""

    sample: object
    filter: object
    filter_grid: tuple | None
    select: object  # without place
    count: object
    place: object
    place_grid: tuple | None  # the count and place kernels'
    rank: object
    rank_grid: tuple


def _launches(plan: TopKPlan, s: TopKSettings) -> TopKLaunches:
    """The kernels' launches for a setting."""
    rows, cols, k = plan.rows, plan.cols, plan.k
    pdl = s.pdl if pdl_supported(plan.device) else PDL_NONE
    nvidia = checks.nvidia_capability(plan.device) is not None
    options = checks.nvidia_options(nvidia, pdl != PDL_NONE, 0) or None
    common = dict(row_stride=plan.row_stride, cols=cols, IS_BF16=plan.is_bf16,
                  HAS_LENGTHS=plan.has_lengths, USE_PDL=pdl)
    sample = filter_ = filter_grid = count = place = None
    counted = bool(s.splits and s.place_part)
    if counted and not (min(k, cols) <= s.block and s.block % s.place_part == 0):
        fail_value("TopKSettings", f"a block ({s.block}) of at least min(k, cols) "
                   f"({min(k, cols)}) and a multiple of place_part ({s.place_part})", s)
    # Leading digits of ~column equal to all ones for every column: no tie pass needed.
    low_skip = min((32 - (cols - 1).bit_length()) // s.radix_bits, 32 // s.radix_bits - 1)
    if s.splits:
        sample_warps = s.sample_warps or min(max(s.sample_block // 512, 4), MAX_SAMPLE_WARPS)
        sample = SAMPLE_KERNEL.launch(
            plan.device, num_warps=sample_warps, options=options, **common, k=k,
            sample_stride=sample_stride(cols, s.sample_block), CHUNK=SAMPLE_CHUNK,
            SAMPLE_BLOCK=s.sample_block,
            BITS=s.threshold_bits, DIGIT_BITS=s.sample_digit_bits,
            ZERO_BUCKETS=s.block if counted else 0,
            SHARED_SAMPLE=(nvidia and s.shared_sample and s.sample_digit_bits == 1
                           and s.threshold_bits <= 16
                           and s.sample_block % (32 * sample_warps) == 0))
        filter_ = FILTER_KERNEL.launch(plan.device, num_warps=s.filter_warps, options=options,
                                       **common,
                                       split_cols=s.step * s.split_steps, capacity=s.block,
                                       BLOCK=s.step,
                                       WARP_APPEND=(nvidia and s.step
                                                    >= WARP_APPEND_ELEMENTS * 32 * s.filter_warps),
                                       TRACK_MAX=counted)
        filter_grid = (rows, s.splits)
    if counted:
        count = COUNT_KERNEL.launch(plan.device, num_warps=PLACE_WARPS, options=options,
                                    **common, k=k, low_skip=low_skip, capacity=s.block,
                                    BLOCK=s.block, PART=s.place_part, RADIX_BITS=s.radix_bits)
        place = PLACE_KERNEL.launch(plan.device, num_warps=s.place_warps, options=options,
                                    cols=cols, HAS_LENGTHS=plan.has_lengths, USE_PDL=pdl, k=k,
                                    capacity=s.block, out_row_stride=plan.out_row_stride,
                                    BLOCK=s.block, PART=s.place_part)
    shared = not counted and nvidia and shared_slots_fit(s.block, s.select_warps)
    select = None if counted else SELECT_KERNEL.launch(
        plan.device, num_warps=s.select_warps,
        options=checks.nvidia_options(nvidia, pdl != PDL_NONE, s.max_registers) or None,
        **common, k=k,
        low_skip=low_skip,
        capacity=s.block, out_row_stride=plan.out_row_stride, FROM_CANDIDATES=s.splits > 0,
        BLOCK=s.block, STREAM_BLOCK=s.stream_block, RADIX_BITS=s.radix_bits,
        SHARED_SLOTS=shared and s.shared_slots)
    rank = RANK_KERNEL.launch(
        plan.device, num_warps=4, options=options, out_row_stride=plan.out_row_stride,
        BLOCK=s.block, CHUNK=rank_chunk(s), WIDTH=s.width, USE_PDL=pdl)
    return TopKLaunches(sample, filter_, filter_grid, select, count, place,
                        (rows, s.block // s.place_part) if counted else None,
                        rank, (rows, rank_programs(s, k, cols)))


def sample_stride(cols: int, sample_block: int) -> int:
    """The columns between the starts of the sample's chunks: ``sample_block //
    SAMPLE_CHUNK`` chunks of ``SAMPLE_CHUNK`` consecutive columns spread over ``cols``
    (a whole number of chunks apart)."""
    stride = -(-cols // (sample_block // SAMPLE_CHUNK))
    return max(-(-stride // SAMPLE_CHUNK) * SAMPLE_CHUNK, SAMPLE_CHUNK)


def shared_slots_fit(block: int, warps: int) -> bool:
    """Whether the select kernel can count ``block`` pairs in shared memory at ``warps``:
    a whole number of pairs a thread (one PTX statement each) and counters within
    ``SHARED_SLOTS_MAX_BLOCK``."""
    return block % (32 * warps) == 0 and block <= SHARED_SLOTS_MAX_BLOCK


def rank_chunk(s: TopKSettings) -> int:
    """The placed pairs a rank program takes at a time (no more than a row holds)."""
    return min(s.chunk, s.block)


def rank_programs(s: TopKSettings, k: int, cols: int) -> int:
    """The rank kernel's programs a row: enough chunks for the first ranks and the rest
    of the bucket that holds the last of them, unless a more crowded bucket leaves its
    programs a second chunk (see ``topk_rank_kernel``)."""
    chunk = rank_chunk(s)
    return min(s.block // chunk, -(-min(k, cols) // chunk) + 1)


def launch_topk(plan: TopKPlan, call: OpCall, buffers: dict | None = None) -> None:
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
    device = plan.device
    lengths = call.lengths if call.lengths is not None else out  # not read without lengths
    scratch = torch.empty((rows, s.block), dtype=torch.int64, device=device)
    counts = torch.empty((rows, 2 * s.block), dtype=torch.int32, device=device)
    meta = torch.empty((rows, 4), dtype=torch.int64, device=device)
    if s.splits:
        threshold = torch.empty((rows,), dtype=torch.int32, device=device)
        cand_count = torch.empty((rows, COUNTER_ROW), dtype=torch.int32, device=device)
        cand = torch.empty((rows, s.block), dtype=torch.int64, device=device)
        launches.sample((rows,), logits_ptr=logits, lengths_ptr=lengths,
                        threshold_ptr=threshold, cand_count_ptr=cand_count, counts_ptr=counts)
        launches.filter(launches.filter_grid, logits_ptr=logits, lengths_ptr=lengths,
                        threshold_ptr=threshold, cand_ptr=cand, cand_count_ptr=cand_count)
        if buffers is not None:
            buffers.update(threshold=threshold, cand_count=cand_count[:, 0], cand=cand)
    else:
        cand, cand_count = scratch, out  # not read: FROM_CANDIDATES is False
    if launches.place is not None:
        cand_slot = torch.empty((rows, s.block), dtype=torch.int32, device=device)
        launches.count(launches.place_grid, logits_ptr=logits, lengths_ptr=lengths,
                       threshold_ptr=threshold, cand_ptr=cand, cand_count_ptr=cand_count,
                       cand_slot_ptr=cand_slot, counts_ptr=counts, meta_ptr=meta)
        launches.place(launches.place_grid, lengths_ptr=lengths, cand_ptr=cand,
                       cand_count_ptr=cand_count, cand_slot_ptr=cand_slot, scratch_ptr=scratch,
                       counts_ptr=counts, meta_ptr=meta, out_ptr=out)
    else:
        launches.select((rows,), logits_ptr=logits, lengths_ptr=lengths, cand_ptr=cand,
                        cand_count_ptr=cand_count, scratch_ptr=scratch, counts_ptr=counts,
                        meta_ptr=meta, out_ptr=out)
    launches.rank(launches.rank_grid, scratch_ptr=scratch, counts_ptr=counts, meta_ptr=meta,
                  out_ptr=out)
    if buffers is not None:
        buffers.update(counts=counts, meta=meta, rank_grid=launches.rank_grid)


def run_topk(plan: TopKPlan, call: OpCall) -> None:
    checks.check_apart(plan.apart, call)
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
        if k > logits.shape[1]:
            # A result wider than the logits: the other arguments first, so that a bad one
            # is named, not a failed allocation of rows x k. (No wider than the logits, it
            # is left to the op's checks: these would cost every eager call again.)
            _check_lengths(lengths, logits)
            _check_backend(backend, logits, k)
        out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
    elif isinstance(out, torch.Tensor) and tuple(out.shape) != (logits.shape[0], k):
        fail_value("out", f"shape [rows, k] = [{logits.shape[0]}, {k}]", f"shape {tuple(out.shape)}")
    top_k_indices_into(logits, lengths, out, backend=backend)
    return out
