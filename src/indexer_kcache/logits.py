"""``paged_mqa_logits``: score query rows against the paged key cache, in place.

For query row ``r = b * next_n + i`` (query ``i`` of sequence ``b``) and position ``t``::

    logits[r, t] = sum_h weights[r, h] * relu(q[b, i, h, :] . K[b, t, :])

with ``q`` and ``K`` dequantized (scales applied). This module checks the arguments
(``check_logits`` -> a frozen ``LogitsPlan``), picks launch settings by shape
(``logits_settings``) and launches the kernel of ``kernels.logits`` (or runs the torch
reference of ``reference.logits``). Nothing on the Triton path synchronises the host: the
grid comes from shapes only, so a call can be captured in a CUDA graph and replayed with
new ``q``, ``weights``, ``context_lens`` and ``block_table`` values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from . import checks, layout
from .checks import PDL_AT_EXIT, PDL_EARLY, PDL_NONE, OpCall, fail_type, fail_value
from .kernels import INTERPRETED
from .kernels.logits import (
    MAX_ROWS,
    Q_BF16,
    Q_E4M3,
    Q_E4M3_MX,
    Q_MXFP4,
    VARIANT_STACKED,
    fold_entry_bytes,
    fold_queries_kernel,
    paged_mqa_logits_kernel,
    row_slots,
)
from .kernels.numerics import TRITON_VERSION
from .launcher import MAX_GRID_Y, Kernel, Launch, declare_op, tunable
from .reference import logits as reference_logits
from .util import next_power_of_2

__all__ = [
    "LogitsPlan",
    "LogitsSettings",
    "Q_FORM_NAMES",
    "check_logits",
    "logits_settings",
    "paged_mqa_logits",
    "paged_mqa_logits_into",
    "run_logits",
    "settings_for",
    "split_query",
]

LOGITS_KERNEL = Kernel(paged_mqa_logits_kernel)
FOLD_KERNEL = Kernel(fold_queries_kernel)

MAX_HEADS = 128
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)
Q_FORM_NAMES = {Q_BF16: "bf16", Q_E4M3: "e4m3", Q_E4M3_MX: "e4m3-mx", Q_MXFP4: "mxfp4"}
# Bytes of the query operands a program keeps for its rows (shared memory on a GPU).
MAX_Q_BYTES_PER_PROGRAM = 64 * 1024


class LogitsSettings(NamedTuple):
    """How the kernel runs a shape (``logits_settings``)."""

    block_n: int  # keys per tile
    rows: int  # query rows of one sequence per program (1..4)
    splits: int  # programs per (sequence, row group), each a contiguous range of positions
    num_warps: int
    num_stages: int  # software-pipelining depth of the tile loop
    # kernels.logits.VARIANT_ROWS (a dot per row, MXFP4 keys per group) or VARIANT_STACKED
    # (the rows' queries in one dot, MXFP4 group scales folded into the keys); native only.
    variant: int = VARIANT_STACKED
    # A cap on registers per thread (0: none), for the compiler: the rare exact paths of
    # the stacked form (keys or queries per group) need more than its tile loop, and more
    # programs fit on an SM when they spill instead.
    max_registers: int = 0
    # Programmatic dependent launch on NVIDIA sm_90+ (a kernels.dependent_launch mode).
    pdl: int = 0
    # relu(x) w as (x + |x|) w / 2 in the stacked form's unscaled dots: fewer instructions
    # on the pipe the MXFP4 decoding keeps busy.
    relu_by_abs: bool = False
    # Launched dependently, where a tile is a page (block_size == block_n): the pages of each
    # program's first hint_tiles tiles (rounded up to a power of two) asked for into L2
    # before the wait for the previous kernel; 0: none.
    hint_tiles: int = 0
    # Scaled queries (stacked form): folded to e4m3 once per row group by a kernel of their
    # own before the scorer, instead of once in every program of the group.
    prefold: bool = False
    # MXFP4 keys against e4m3 operands (stacked form): their group scales folded relative
    # to one exponent a program, read from its first tile, instead of each key's largest:
    # fewer instructions a tile, one more round trip before the first.
    program_fold: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class LogitsPlan:
    """A checked call: everything but the tensors' contents and addresses."""

    backend: str  # "triton" or "reference"
    use_fp4_cache: bool
    mx_scales: bool  # FP8 keys' scales as UE8M0 bytes (False for MXFP4 caches)
    layout: int  # layout.ROW_MAJOR / FP8_TILED / MXFP4_PRESHUFFLE
    n_per_tile: int  # the MXFP4 preshuffle order (0 for other layouts)
    d_per_tile: int
    scale_lanes: int
    q_form: int  # kernels.logits.Q_BF16 / Q_E4M3 / Q_E4M3_MX / Q_MXFP4
    batch: int
    next_n: int
    heads: int
    head_pad: int  # heads rounded up to a power of two >= 16 (the dot's N)
    num_blocks: int
    block_size: int
    max_blocks: int
    max_model_len: int
    num_cols: int  # min(max_model_len, max_blocks * block_size): positions that can be read
    ctx_2d: bool  # context_lens is [B, next_n]
    weights_bf16: bool
    clean_logits: bool
    native: bool  # FP8/bf16 tensor-core dots (NVIDIA sm_89+), else float32 dots
    device: torch.device
    sm_count: int
    # Strides the kernel takes (fixed by the tensors' metadata).
    strides: dict
    apart: tuple  # checks.output_extents: out and the inputs it must not overlap
    launches: dict = field(default_factory=dict)  # (settings, scale words) -> Launch


# ------------------------------------------------------------------------------ checks
def _check_last_dim_unit_stride(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        fail_value(f"{name}.stride(-1)", "1", t.stride(-1))


def split_query(q: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``q`` as (values, scales or None): a bf16 tensor, or a pair (e4m3 or packed MXFP4
    values, int32 scales or None)."""
    if isinstance(q, torch.Tensor):
        if q.dtype in (torch.float8_e4m3fn, torch.uint8):
            fail_type("q", "a bf16 tensor, or e4m3 / MXFP4 values as a pair (values, scales "
                      "or None)", f"a bare {q.dtype} tensor")
        checks.check_dtype("q", q, (torch.bfloat16,))
        return q, None
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        fail_type("q", "a bf16 tensor or a pair (values, scales or None)", checks.type_name(q))
    values, scales = q
    checks.check_dtype("q[0]", values, (torch.float8_e4m3fn, torch.uint8))
    if scales is not None:
        checks.check_dtype("q[1]", scales, (torch.int32,))
    return values, scales


def _query_form(values: object, scales: object) -> tuple[int, str]:
    """(q form, the name of the values in messages), checking dtypes and shapes."""
    bare = isinstance(values, torch.Tensor) and values.dtype == torch.bfloat16 and scales is None
    name = "q" if bare else "q[0]"
    checks.check_dtype(name, values, (torch.bfloat16, torch.float8_e4m3fn, torch.uint8))
    fp4 = values.dtype == torch.uint8
    if scales is None:
        if fp4:
            fail_value("q[1]", "int32 scales [B, next_n, H] (MXFP4 values need them)", None)
        form = Q_BF16 if values.dtype == torch.bfloat16 else Q_E4M3
    else:
        checks.check_dtype("q[1]", scales, (torch.int32,))
        if values.dtype == torch.bfloat16:
            fail_type("q[0]", "dtype torch.float8_e4m3fn or torch.uint8 (scaled queries)",
                      values.dtype)
        form = Q_MXFP4 if fp4 else Q_E4M3_MX
    width = layout.MXFP4_VALUE_BYTES if form == Q_MXFP4 else layout.HEAD_DIM
    if values.dim() != 4 or values.shape[3] != width:
        fail_value(name, f"shape [B, next_n, H, {width}]", f"shape {tuple(values.shape)}")
    _check_last_dim_unit_stride(name, values)
    batch, next_n, heads, _ = values.shape
    if next_n < 1:
        fail_value(f"{name}.shape[1] (next_n)", ">= 1", next_n)
    if not 1 <= heads <= MAX_HEADS:
        fail_value(f"{name}.shape[2] (heads)", f"1 .. {MAX_HEADS}", heads)
    if scales is not None:
        if tuple(scales.shape) != (batch, next_n, heads):
            fail_value("q[1]", f"shape [B, next_n, H] = {[batch, next_n, heads]}",
                       f"shape {tuple(scales.shape)}")
        _check_last_dim_unit_stride("q[1]", scales)
    return form, name


def cache_3d(k_cache: torch.Tensor) -> torch.Tensor:
    """The cache as ``[num_blocks, block_size, row_bytes]``: the 4-d view ``[num_blocks,
    block_size, 1, row_bytes]`` that DeepGEMM-style callers pass loses its unit axis (a
    view, no copy)."""
    return k_cache.select(2, 0) if k_cache.dim() == 4 else k_cache


def _cache_format(k_cache: object) -> bool:
    """use_fp4_cache, from the row width (132 FP8, 68 MXFP4)."""
    checks.check_dtype("k_cache", k_cache, (torch.uint8,))
    if k_cache.dim() == 4 and k_cache.shape[2] != 1:
        fail_value("k_cache.shape[2]", "1 (the 4-d view [num_blocks, block_size, 1, row_bytes])",
                   k_cache.shape[2])
    if k_cache.dim() not in (3, 4):
        fail_value("k_cache", "a 3-d [num_blocks, block_size, row_bytes] or 4-d [num_blocks, "
                   "block_size, 1, row_bytes] tensor", f"shape {tuple(k_cache.shape)}")
    row = k_cache.shape[-1]  # compared, not hashed: a symbolic size when traced
    if row != layout.cache_row_bytes(False) and row != layout.cache_row_bytes(True):
        fail_value("k_cache.shape[-1]", f"{layout.cache_row_bytes(False)} (FP8) or "
                   f"{layout.cache_row_bytes(True)} (MXFP4) bytes per row", row)
    return row == layout.cache_row_bytes(True)


def native_dots(device: torch.device) -> bool:
    """FP8 and bf16 tensor-core dots with in-register MXFP4 decoding (inline PTX): NVIDIA
    GPUs of compute capability 8.9 and newer. Elsewhere (the interpreter, ROCm, older
    NVIDIA GPUs) the kernel decodes to float32 and uses float32 dots."""
    return checks.native_fp8(device)


def check_logits(call: OpCall) -> LogitsPlan:
    """Check every argument of ``paged_mqa_logits_into``; return how to run the call.

    Raises ``TypeError`` (types, dtypes), ``ValueError`` (shapes, strides, devices,
    values) or ``NotImplementedError`` (a layout that does not exist), naming the argument,
    what was expected and what was got. Nothing is read or written before.
    """
    checks.check_flag("mx_scales", call.mx_scales, allow_none=True)
    checks.check_flag("clean_logits", call.clean_logits)
    values, scales = call.q_values, call.q_scales
    q_form, q_name = _query_form(values, scales)
    batch, next_n, heads, _ = values.shape
    use_fp4_cache = _cache_format(call.k_cache)
    cache = cache_3d(call.k_cache)
    checks.check_k_cache(cache, use_fp4_cache)
    num_blocks, block_size, _ = cache.shape

    weights, context_lens, block_table, out = (call.weights, call.context_lens, call.block_table,
                                                call.out)
    checks.check_dtype("weights", weights, WEIGHT_DTYPES)
    if tuple(weights.shape) != (batch * next_n, heads):
        fail_value("weights", f"shape [B * next_n, H] = {[batch * next_n, heads]}",
                   f"shape {tuple(weights.shape)}")
    _check_last_dim_unit_stride("weights", weights)
    checks.check_dtype("context_lens", context_lens, checks.INDEX_DTYPES)
    if tuple(context_lens.shape) not in ((batch,), (batch, next_n)):
        fail_value("context_lens", f"shape [B] = {[batch]} or [B, next_n] = {[batch, next_n]}",
                   f"shape {tuple(context_lens.shape)}")
    checks.check_dtype("block_table", block_table, checks.INDEX_DTYPES)
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        fail_value("block_table", f"shape [B, max_blocks] with B = {batch}",
                   f"shape {tuple(block_table.shape)}")
    _check_last_dim_unit_stride("block_table", block_table)
    checks.check_dtype("out", out, (torch.float32,))
    if out.dim() != 2 or out.shape[0] != batch * next_n:
        fail_value("out", f"shape [B * next_n, max_model_len] with B * next_n = {batch * next_n}",
                   f"shape {tuple(out.shape)}")
    if out.shape[1] > checks.MAX_COLUMNS:
        fail_value("out", f"at most {checks.MAX_COLUMNS} columns (max_model_len)",
                   f"shape {tuple(out.shape)}")
    _check_last_dim_unit_stride("out", out)
    checks.check_rows_apart("out", out, "max_model_len")
    max_model_len = out.shape[1]
    tensors = dict(q=values, weights=weights, context_lens=context_lens, block_table=block_table,
                   out=out)
    if scales is not None:
        tensors["q[1]"] = scales
    checks.check_same_device("k_cache", cache, **tensors)

    device = cache.device
    layout_code, n_per_tile, d_per_tile, scale_lanes = checks.resolve_layout(
        use_fp4_cache, call.shuffle, block_size, call.mxfp4_n_per_tile, device,
        call.mxfp4_d_per_tile, call.mxfp4_scale_lanes)
    backend = checks.resolve_backend(call.backend, device)
    mx_scales = checks.default_mx_scales(device) if call.mx_scales is None else call.mx_scales
    max_blocks = block_table.shape[1]
    ctx_2d = context_lens.dim() == 2
    return LogitsPlan(
        backend=backend, use_fp4_cache=use_fp4_cache, mx_scales=mx_scales and not use_fp4_cache,
        layout=layout_code, n_per_tile=n_per_tile, d_per_tile=d_per_tile,
        scale_lanes=scale_lanes, q_form=q_form, batch=batch, next_n=next_n,
        heads=heads, head_pad=_head_pad(heads), num_blocks=num_blocks, block_size=block_size,
        max_blocks=max_blocks, max_model_len=max_model_len,
        num_cols=min(max_model_len, max_blocks * block_size), ctx_2d=ctx_2d,
        weights_bf16=weights.dtype == torch.bfloat16, clean_logits=call.clean_logits,
        native=backend == "triton" and native_dots(device), device=device,
        sm_count=checks.sm_count(device),
        strides=dict(
            q_sb=values.stride(0), q_si=values.stride(1), q_sh=values.stride(2),
            qs_sb=scales.stride(0) if scales is not None else 0,
            qs_si=scales.stride(1) if scales is not None else 0,
            w_sr=weights.stride(0), w_sh=weights.stride(1), page_stride=cache.stride(0),
            ctx_sb=context_lens.stride(0), ctx_si=context_lens.stride(1) if ctx_2d else 0,
            table_sb=block_table.stride(0), out_sr=out.stride(0)),
        apart=checks.output_extents(call, "out", (("q_values", q_name), ("q_scales", "q[1]"),
                                                  "k_cache", "weights",
                                                  "context_lens", "block_table")),
    )


# ---------------------------------------------------------------------------- settings
def _head_pad(heads: int) -> int:
    return max(16, 1 << (heads - 1).bit_length())


@tunable
def logits_settings(batch: int, next_n: int, heads: int, num_cols: int, use_fp4_cache: bool,
                    q_form: int, sm_count: int, interpreted: bool = INTERPRETED,
                    native: bool = True) -> LogitsSettings:
    """Launch settings for a shape; deterministic in its arguments.

    A program scores up to four query rows of one sequence (every key tile is read once for
    all of them; natively their queries sit side by side in one dot of at most
    ``MAX_DOT_COLUMNS`` columns) over a contiguous range of positions. Splitting each
    sequence's positions over programs keeps every SM busy when there are few sequences:
    about ``PROGRAMS_PER_SM`` programs per SM, each of ``MIN_TILES`` to ``MAX_TILES``
    tiles (short programs even out the end of the launch; a few more tiles a program for
    several rows, whose queries cost more to load), or, for FP8 keys and one row a
    program, up to ``MAX_TILES_ONE_WAVE`` tiles when that keeps the programs within
    ``PROGRAMS_PER_SM`` per SM.
    Native tile loops pipeline ``DEEP_STAGES`` tiles. Without native dots (float32 tiles
    in registers) a program takes one row and smaller tiles. Scaled queries against MXFP4
    keys are folded in each program, whose programs then take twice the tiles; MXFP4
    queries against MXFP4 keys, one row a program, are folded once per row by a kernel of
    their own (``prefold``), and their programs take twice the tiles only when the launch
    would otherwise need more than one round of them. MXFP4 keys against e4m3 operands,
    one or two rows a program of at least ``PROGRAM_FOLD_MIN_TILES`` tiles, are folded
    relative to one exponent a program (``program_fold``). FP8 keys against e4m3 queries,
    one row a program, in more than one round of programs, are capped at
    ``FP8_MANY_PROGRAMS_REGISTERS`` (six programs an SM); MXFP4 keys against e4m3 queries
    in many programs at ``LARGE_MXFP4_REGISTERS`` (five), but with Triton 3.9
    (``TRITON_SPILLS_AT_LARGE_CAP``). The measurements behind the numbers:
    BENCHMARKS.md, "The scorer".
    """
    head_pad = _head_pad(heads)
    q_bytes = layout.HEAD_DIM * head_pad * (2 if q_form == Q_BF16 else 1)
    rows = max(1, min(next_n, MAX_ROWS, MAX_Q_BYTES_PER_PROGRAM // q_bytes,
                      MAX_DOT_COLUMNS // head_pad))
    if use_fp4_cache and q_form >= Q_E4M3_MX and not interpreted:
        # Four rows of scaled queries against MXFP4 keys need more registers than there are.
        rows = min(rows, 2)
    if interpreted:  # the interpreter's cost is per program and per operation: few, large
        return LogitsSettings(64, rows, 1, 4, 1)
    block_n, num_warps, num_stages, max_registers = 64, 4, 3, 0
    if not native:
        rows, block_n, num_stages = 1, 32, 2
    elif rows == 1 and (use_fp4_cache or q_form >= Q_E4M3_MX):
        max_registers = FALLBACK_REGISTERS_BF16 if q_form == Q_BF16 else FALLBACK_REGISTERS
    row_groups = batch * -(-next_n // rows)
    tiles = max(-(-num_cols // block_n), 1)
    wanted = PROGRAMS_PER_SM * sm_count
    least = MIN_TILES if rows == 1 else MIN_TILES_ROWS
    per_program = min(max(-(-tiles * row_groups // wanted), least), MAX_TILES)
    many = tiles * row_groups >= 16 * wanted
    if native:
        # Native tile loops keep more tiles in flight, every key format and query form.
        num_stages = DEEP_STAGES
    if native and not use_fp4_cache and rows == 1 and row_groups <= wanted:
        # Fewer, longer FP8 programs (at most ``wanted`` in all) beat several rounds of
        # short ones (measured; see BENCHMARKS.md).
        one_round = -(-tiles // (wanted // row_groups))
        if MAX_TILES < one_round <= MAX_TILES_ONE_WAVE:
            per_program = one_round
    # MXFP4 queries against MXFP4 keys, one row a program, are folded by a kernel of their
    # own, once per row (measured: BENCHMARKS.md, "The scorer").
    prefold = native and use_fp4_cache and q_form == Q_MXFP4 and rows == 1
    if native and use_fp4_cache and q_form >= Q_E4M3_MX and not (
            prefold and row_groups * -(-tiles // per_program) <= wanted):
        # Folding the queries costs a program more: fewer, longer ones, unless they come
        # folded and one round of programs holds the shorter ones.
        per_program *= 2
    elif max_registers and q_form == Q_E4M3 and many and not TRITON_SPILLS_AT_LARGE_CAP:
        max_registers = LARGE_MXFP4_REGISTERS  # more programs in flight when there are many
    splits = max(-(-tiles // per_program), 1)
    # Its first tile's exponents cost a program a round trip; long ones gain more.
    # (Four rows a program: their head sums outweigh what it saves, measured.)
    program_fold = (native and use_fp4_cache and q_form != Q_BF16 and rows <= 2
                    and per_program >= PROGRAM_FOLD_MIN_TILES)
    programs = row_groups * splits
    if native and not use_fp4_cache and rows == 1 and q_form == Q_E4M3 and programs > wanted:
        # Several rounds of FP8 programs: six an SM under the cap instead of five (measured).
        max_registers = FP8_MANY_PROGRAMS_REGISTERS
    # Dependent launch pays off while the programs fit on the SMs at once (the next call's
    # programs then wait in room this launch leaves free); releasing the next call at once
    # is best for the smallest launches. Measured: BENCHMARKS.md, "The scorer".
    pdl = PDL_EARLY if programs <= sm_count else PDL_AT_EXIT if programs <= wanted else PDL_NONE
    # A launch released at once waits mostly on its first pages: those are hinted into L2
    # while the previous kernel runs (e4m3 queries, the form measured; the hints cost time
    # in launches released as programs exit).
    hint_tiles = HINT_TILES if pdl == PDL_EARLY and q_form == Q_E4M3 else 0
    return LogitsSettings(block_n, rows, splits, num_warps, num_stages, VARIANT_STACKED,
                          max_registers, pdl=pdl, relu_by_abs=use_fp4_cache,
                          hint_tiles=hint_tiles, prefold=prefold, program_fold=program_fold)


PROGRAMS_PER_SM = 4
LARGE_MXFP4_REGISTERS = 96
# Triton 3.9's MXFP4 tile loop spills 256 bytes a thread under LARGE_MXFP4_REGISTERS
# (3.6: 104, 3.7: 112, 3.8: 96, offline sm_90 counts): its many-program launches keep
# FALLBACK_REGISTERS, 7 to 14 % faster there on an H200 (BENCHMARKS.md, "Triton versions").
TRITON_SPILLS_AT_LARGE_CAP = TRITON_VERSION >= (3, 9)
FP8_MANY_PROGRAMS_REGISTERS = 80
MIN_TILES = 1
MIN_TILES_ROWS = 4
MAX_TILES = 16
MAX_TILES_ONE_WAVE = 64  # FP8, one row a program: longer ones if then PROGRAMS_PER_SM an SM
DEEP_STAGES = 6  # the native tile loop's pipelining depth
MAX_DOT_COLUMNS = 256  # the N of one Hopper tensor-core instruction
FALLBACK_REGISTERS = 128  # the tile loop of one row fits (no spills) with e4m3 queries
FALLBACK_REGISTERS_BF16 = 168  # and with bf16 queries (their keys decoded to bf16)
HINT_TILES = 2  # tiles hinted into L2 a program, in launches released at once
PROGRAM_FOLD_MIN_TILES = 8


# ------------------------------------------------------------------------------ launch
def _raw_bits(t: torch.Tensor) -> torch.Tensor:
    """bf16 -> int16 and e4m3 -> uint8 views (no copy): the kernel reinterprets the bits."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    return t


def split_columns(plan: LogitsPlan, settings: LogitsSettings) -> tuple[int, int, int]:
    """(splits, chunk, tail_chunk): each of ``splits`` programs per row group scores
    ``chunk`` positions (a multiple of the tile) and cleans ``tail_chunk`` of the columns
    past ``num_cols``."""
    block_n = settings.block_n
    tiles = -(-plan.num_cols // block_n)
    # Past CUDA's limit on the grid's second dimension, longer programs instead of more.
    per_split = max(-(-tiles // min(settings.splits, MAX_GRID_Y)), 1)
    splits = max(-(-tiles // per_split), 1)
    tail_chunk = -(-(plan.max_model_len - plan.num_cols) // splits)
    return splits, per_split * block_n, tail_chunk


def settings_for(plan: LogitsPlan) -> LogitsSettings:
    """The launch settings of a checked call."""
    return logits_settings(plan.batch, plan.next_n, plan.heads, plan.num_cols,
                           plan.use_fp4_cache, plan.q_form, plan.sm_count, INTERPRETED,
                           plan.native)


def _logits_launch(plan: LogitsPlan, settings: LogitsSettings, scale_words: bool
                   ) -> tuple[Launch, tuple[int, int, int], Launch | None]:
    """(the scorer's launch, its grid, the fold's launch or None)."""
    splits, chunk, tail_chunk = split_columns(plan, settings)
    row_groups = -(-plan.next_n // settings.rows)
    pdl = settings.pdl if checks.pdl_supported(plan.device) else PDL_NONE
    nvidia = checks.nvidia_capability(plan.device) is not None
    options = checks.nvidia_options(nvidia, pdl != PDL_NONE, settings.max_registers)
    # The L2 hints before the wait: only for a dependent launch, a tile a page.
    hint = pdl != PDL_NONE and plan.block_size == settings.block_n and plan.num_blocks > 0
    # Scaled queries folded ahead by their own kernel (the stacked form's native dots only).
    folded = (settings.prefold and plan.native and plan.q_form >= Q_E4M3_MX
              and settings.variant == VARIANT_STACKED)
    launch = LOGITS_KERNEL.launch(
        plan.device, num_warps=settings.num_warps, options=options or None, **plan.strides,
        num_blocks=plan.num_blocks, max_model_len=plan.max_model_len, num_cols=plan.num_cols,
        chunk=chunk, tail_chunk=tail_chunk, heads=plan.heads,
        NEXT_N=plan.next_n, ROWS=settings.rows, CTX_2D=plan.ctx_2d, Q_FORM=plan.q_form,
        W_BF16=plan.weights_bf16, USE_FP4=plan.use_fp4_cache, MX_SCALES=plan.mx_scales,
        LAYOUT=plan.layout, N_PER_TILE=plan.n_per_tile, D_PER_TILE=plan.d_per_tile,
        SCALE_LANES=plan.scale_lanes, BLOCK_SIZE=plan.block_size,
        HP=plan.head_pad, BLOCK_N=settings.block_n, NUM_STAGES=settings.num_stages,
        CLEAN=plan.clean_logits, NATIVE=plan.native, SCALE_WORDS=scale_words,
        VARIANT=settings.variant,
        # Warps along the keys (MXFP4 rows are laid out for them; extra warps split columns).
        WARPS=min(settings.num_warps, max(settings.block_n // 16, 1)),
        HAS_BLOCKS=plan.num_blocks > 0, USE_PDL=pdl,
        RELU_BY_ABS=(settings.relu_by_abs and plan.native and plan.q_form != Q_BF16
                     and settings.variant == VARIANT_STACKED),
        HINT_TILES=next_power_of_2(settings.hint_tiles) if hint and settings.hint_tiles else 0,
        PREFOLDED=folded,
        PROGRAM_FOLD=(settings.program_fold and plan.native and plan.use_fp4_cache
                      and plan.q_form != Q_BF16 and settings.variant == VARIANT_STACKED))
    fold = None
    if folded:
        fold_options = checks.nvidia_options(nvidia, pdl != PDL_NONE, 0) or None
        query_strides = {name: plan.strides[name] for name in ("q_sb", "q_si", "q_sh",
                                                                "qs_sb", "qs_si")}
        fold = FOLD_KERNEL.launch(
            plan.device, num_warps=4, options=fold_options, **query_strides, heads=plan.heads,
            NEXT_N=plan.next_n, ROWS=settings.rows, Q_FORM=plan.q_form,
            USE_FP4=plan.use_fp4_cache, HP=plan.head_pad, USE_PDL=pdl)
    return launch, (plan.batch * row_groups, splits, 1), fold


def run_logits(plan: LogitsPlan, call: OpCall) -> None:
    """Run a checked call: write the logits into ``call.out``."""
    checks.check_apart(plan.apart, call)
    cache = cache_3d(call.k_cache)
    if plan.batch * plan.next_n == 0 or plan.max_model_len == 0:
        return
    if plan.backend == "reference":
        q = call.q_values if call.q_scales is None and plan.q_form == Q_BF16 else (
            call.q_values, call.q_scales)
        # Outside autograd, as the Triton backend is: a result that does not differentiate
        # to the queries or weights under one backend only.
        with torch.no_grad():
            reference_logits.paged_mqa_logits(
                q, cache, call.weights, call.context_lens, call.block_table,
                plan.max_model_len, use_fp4_cache=plan.use_fp4_cache, mx_scales=plan.mx_scales,
                layout_code=plan.layout, n_per_tile=plan.n_per_tile,
                d_per_tile=plan.d_per_tile, scale_lanes=plan.scale_lanes,
                clean_logits=plan.clean_logits, out=call.out)
        return
    settings = settings_for(plan)
    # Four-byte scale loads where the pages allow them (the address is the call's).
    scale_words = cache.data_ptr() % 4 == 0 and plan.strides["page_stride"] % 4 == 0
    key = (settings, scale_words)
    launch = plan.launches.get(key) or plan.launches.setdefault(
        key, _logits_launch(plan, settings, scale_words))
    kernel, grid, fold = launch
    values = _raw_bits(call.q_values)
    scales = call.q_scales if call.q_scales is not None else call.context_lens  # unread
    if fold is None:
        folded = call.context_lens  # unread
    else:
        groups = grid[0]
        entry = fold_entry_bytes(row_slots(settings.rows) * plan.head_pad)
        folded = torch.empty(groups * entry, dtype=torch.uint8, device=plan.device)
        fold((groups, 1, 1), q_ptr=values, qs_ptr=scales, fold_ptr=folded)
    kernel(grid, q_ptr=values, qs_ptr=scales, w_ptr=_raw_bits(call.weights), cache_ptr=cache,
           ctx_ptr=call.context_lens, table_ptr=call.block_table, out_ptr=call.out,
           fold_ptr=folded)


@declare_op(check=check_logits, run=run_logits, mutates=("out",))
def paged_mqa_logits_into(
    q_values: torch.Tensor,
    q_scales: torch.Tensor | None,
    k_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor,
    *,
    mx_scales: bool | None = None,
    shuffle: bool | None = None,
    mxfp4_n_per_tile: int = 0,
    clean_logits: bool = True,
    backend: str | None = None,
    mxfp4_d_per_tile: int = layout.MXFP4_D_PER_TILE,
    mxfp4_scale_lanes: int | None = None,
) -> None:
    """``paged_mqa_logits`` written into ``out`` (float32 ``[B * next_n, max_model_len]``),
    with the query as its two tensors: the ``torch.library`` op behind the public function."""


def paged_mqa_logits(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
    k_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
    *,
    mx_scales: bool | None = None,
    shuffle: bool | None = None,
    mxfp4_n_per_tile: int = 0,
    clean_logits: bool = True,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    mxfp4_d_per_tile: int = layout.MXFP4_D_PER_TILE,
    mxfp4_scale_lanes: int | None = None,
) -> torch.Tensor:
    """Score every query row against the keys of its sequence, reading the cache in place.

    ``logits[b * next_n + i, t] = sum_h weights[b * next_n + i, h] * relu(q[b, i, h, :] .
    K[b, t, :])`` with ``q`` and ``K`` dequantized, for every position ``t`` the row sees;
    ``K[b, t]`` is row ``t % block_size`` of block ``block_table[b, t // block_size]``.

    Args:
        q: bf16 ``[B, next_n, H, 128]``, or ``(values, scales)``: e4m3 ``[B, next_n, H,
            128]`` or packed MXFP4 uint8 ``[B, next_n, H, 64]`` (element ``2i`` in the low
            nibble), and ``None`` or int32 ``[B, next_n, H]`` holding four UE8M0 bytes
            (byte ``j``, little-endian, scales dims ``32j .. 32j + 31``; 255 is NaN, which
            makes every logit its row sees NaN); MXFP4 values need scales. ``H`` is 1 ..
            128.
        k_cache: the cache as the store writes it, uint8 ``[num_blocks, block_size, 132 |
            68]`` (pages may be padded) or the 4-d view ``[num_blocks, block_size, 1,
            row]``; FP8 or MXFP4 follows from the row width.
        weights: fp32 or bf16 ``[B * next_n, H]``.
        context_lens: int32 ``[B]`` (query ``i`` sees ``t < context_lens[b] - next_n + i +
            1``) or ``[B, next_n]`` (each query's own limit). Limits are clamped to
            ``[0, min(max_model_len, max_blocks * block_size)]``.
        block_table: int32 ``[B, max_blocks]``. A block id outside ``[0, num_blocks)`` is
            never dereferenced: its positions score ``-inf``.
        max_model_len: the width of the result.
        mx_scales, shuffle, mxfp4_n_per_tile, mxfp4_d_per_tile, mxfp4_scale_lanes: the
            cache's format and layout, as for the store (same defaults).
        clean_logits: write ``-inf`` past each row's limit (else leave those columns as
            they are: uninitialised memory when ``out`` is not given).
        out: float32 ``[B * next_n, max_model_len]`` to write into.
        backend: ``"triton"``, ``"reference"`` or ``None`` (Triton on GPUs and under
            ``TRITON_INTERPRET=1``, the torch reference otherwise).

    Returns:
        float32 ``[B * next_n, max_model_len]`` (``out`` when given).
    """
    values, scales = split_query(q)
    checks.check_int("max_model_len", max_model_len, at_least=0, at_most=checks.MAX_COLUMNS)
    rows = values.shape[0] * values.shape[1] if values.dim() == 4 else -1
    if rows < 0:
        _query_form(values, scales)  # names the bad shape
    if out is None:
        out = torch.empty((rows, max_model_len), dtype=torch.float32, device=values.device)
    elif isinstance(out, torch.Tensor) and tuple(out.shape) != (rows, max_model_len):
        fail_value("out", f"shape [B * next_n, max_model_len] = {[rows, max_model_len]}",
                   f"shape {tuple(out.shape)}")
    paged_mqa_logits_into(values, scales, k_cache, weights, context_lens, block_table, out,
                          mx_scales=mx_scales, shuffle=shuffle, mxfp4_n_per_tile=mxfp4_n_per_tile,
                          mxfp4_d_per_tile=mxfp4_d_per_tile, mxfp4_scale_lanes=mxfp4_scale_lanes,
                          clean_logits=clean_logits, backend=backend)
    return out
