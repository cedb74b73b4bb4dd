"""``indexer_k_norm_rope_store``: its checks, its launch settings and its declaration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from . import checks, layout, reference
from .checks import OpCall, fail_value
from .kernels import INTERPRETED, indexer_k_store_kernel
from .launcher import Kernel, Launch, declare_op, tunable

# float32 / float16 keys are rounded to bf16 as the kernel loads them.
K_PRE_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
COS_SIN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
WEIGHT_DTYPES = (torch.bfloat16, torch.float32)
FLOAT32_MAX = torch.finfo(torch.float32).max  # the largest rms_norm_eps the kernels can add

STORE_KERNEL = Kernel(indexer_k_store_kernel)
# Ratio-2 pairs programs above 64K tokens (but float32 keys into MXFP4) hint the indices of
# the program this many further on into L2: about half the programs an H200 holds at once
# (BENCHMARKS.md, ratio 2).
HINT_AHEAD = 660
MAX_SIZES_KEPT = 1024  # token counts whose launch a plan keeps


@dataclass(frozen=True, slots=True, eq=False)
class StorePlan:
    """A checked store call: what holds while its options and tensors' metadata don't
    change (everything but the token count)."""

    backend: str
    device: torch.device
    use_fp4_cache: bool
    mx_scales: bool
    layout: int
    n_per_tile: int  # the MXFP4 preshuffle order's three numbers (0 for other layouts)
    d_per_tile: int
    scale_lanes: int
    compress_ratio: int
    block_size: int
    check_bounds: bool
    exact_casts: bool  # integer float conversions (see exact_casts_needed)
    pdl: bool
    nvidia: bool  # compiled for an NVIDIA GPU (options only its backend takes)
    key_bytes: int  # of a k_pre element (4: float32 keys, twice the registers a row)
    # Kernel arguments the metadata fixes.
    k_pre_row_stride: int
    cos_sin_row_stride: int
    max_pos: int
    eps: float
    page_stride: int
    num_slots: int
    launches: dict = field(default_factory=dict)  # StoreSettings -> Launch
    # num_tokens -> (the settings function that chose, launch, grid): the last calls' sizes
    by_tokens: dict = field(default_factory=dict)
    # (k_pre rows, positions rows, tokens) whose k_cache was compared against the inputs
    apart_checked: set = field(default_factory=set)


class StoreSettings(NamedTuple):
    """How one launch spreads its tokens over programs."""

    tokens_per_program: int  # token pairs with compress_ratio 2 unless eager_loads
    num_warps: int
    eager_loads: bool  # load key rows with the slots and positions (latency-bound sizes)
    max_registers: int  # a cap per thread; 0 = the compiler's choice
    # Ratio 2: each program walks ``ranges`` ranges of tokens_per_program * 2 tokens and
    # hands the written ones of each range to its lanes (the kernel's COMPACT, RANGES).
    compact: bool = False
    ranges: int = 1
    # Ratio-2 pairs on NVIDIA: each program hints the indices of the program this many
    # further on into L2 (the kernel's HINT_AHEAD); 0: none.
    hint_ahead: int = 0
    # MXFP4: scale bytes stored by group, after the values (the kernel's GROUP_SCALES).
    group_scales: bool = False


def exact_casts_needed(device: torch.device) -> bool:
    """Use the integer float conversions unless the GPU converts to fp8/bf16 natively.

    Native e4m3 conversion exists on NVIDIA sm_89 and newer; elsewhere (the interpreter,
    ROCm, older NVIDIA) the portable conversions are the ones known to be exact.
    """
    return not checks.native_fp8(device)


def check_token_counts(call: OpCall) -> int:
    """The call's token count, after checking the tensors that must cover it (their sizes
    are left free by a kept plan, so this runs on every call)."""
    num_tokens = call.kv_slot_mapping.shape[0]
    if call.k_pre.shape[0] < num_tokens:
        fail_value("k_pre.shape[0]", f">= kv_slot_mapping.numel() = {num_tokens}",
                   call.k_pre.shape[0])
    if call.positions.shape[0] < num_tokens:
        fail_value("positions.numel()", f">= kv_slot_mapping.numel() = {num_tokens}",
                   call.positions.shape[0])
    return num_tokens


def check_store(call: OpCall) -> StorePlan:
    """Check every argument; return how to run the call. Raises before touching k_cache."""
    checks.check_flag("use_fp4_cache", call.use_fp4_cache)
    checks.check_flag("mx_scales", call.mx_scales, allow_none=True)
    checks.check_flag("check_bounds", call.check_bounds)
    checks.check_flag("enable_pdl", call.enable_pdl, allow_none=True)
    k_pre = call.k_pre
    checks.check_rows("k_pre", k_pre, K_PRE_DTYPES, layout.HEAD_DIM,
                      f"shape [num_tokens, {layout.HEAD_DIM}]")
    checks.check_index_vector("positions", call.positions)
    cos_sin = call.cos_sin_cache
    checks.check_rows("cos_sin_cache", cos_sin, COS_SIN_DTYPES, layout.ROPE_DIM,
                      f"shape [max_pos, {layout.ROPE_DIM}] ({layout.ROPE_DIM // 2} cos then "
                      f"{layout.ROPE_DIM // 2} sin)")
    weight = call.rms_norm_weight
    checks.check_dtype("rms_norm_weight", weight, WEIGHT_DTYPES)
    if weight.dim() != 1 or weight.shape[0] != layout.HEAD_DIM:
        fail_value("rms_norm_weight", f"shape [{layout.HEAD_DIM}]", f"shape {tuple(weight.shape)}")
    if weight.stride(0) != 1:
        fail_value("rms_norm_weight.stride(0)", "1", weight.stride(0))
    checks.check_real("rms_norm_eps", call.rms_norm_eps)
    # NaN fails too (it would poison every key), and so does a value float32 cannot hold
    # (the kernels add it in float32: it would zero every key).
    if not 0 <= call.rms_norm_eps <= FLOAT32_MAX:
        fail_value("rms_norm_eps", f"a finite float >= 0 and <= {FLOAT32_MAX!r} (float32's "
                   "largest)", call.rms_norm_eps)
    k_cache = call.k_cache
    checks.check_k_cache(k_cache, call.use_fp4_cache)
    checks.check_index_vector("kv_slot_mapping", call.kv_slot_mapping)
    compress_ratio = call.compress_ratio
    checks.check_int("compress_ratio", compress_ratio)
    if compress_ratio not in (1, 2):
        fail_value("compress_ratio", "1 or 2", compress_ratio)
    checks.check_same_device("k_cache", k_cache, k_pre=k_pre, positions=call.positions,
                             cos_sin_cache=cos_sin, rms_norm_weight=weight,
                             kv_slot_mapping=call.kv_slot_mapping)
    check_token_counts(call)
    device = k_cache.device
    num_blocks, block_size, _ = k_cache.shape
    layout_code, n_per_tile, d_per_tile, scale_lanes = checks.resolve_layout(
        call.use_fp4_cache, call.shuffle, block_size, call.mxfp4_n_per_tile, device,
        call.mxfp4_d_per_tile, call.mxfp4_scale_lanes)
    pdl = checks.pdl_supported(device)
    if call.enable_pdl and not pdl:
        checks.fail_unsupported("enable_pdl", "False or None on this device (PDL needs an "
                                "NVIDIA GPU of compute capability 9.0 or newer)", call.enable_pdl)
    mx_scales = checks.default_mx_scales(device) if call.mx_scales is None else call.mx_scales
    return StorePlan(
        backend=checks.resolve_backend(call.backend, device),
        device=device,
        use_fp4_cache=call.use_fp4_cache,
        mx_scales=mx_scales and not call.use_fp4_cache,
        layout=layout_code,
        n_per_tile=n_per_tile,
        d_per_tile=d_per_tile,
        scale_lanes=scale_lanes,
        compress_ratio=compress_ratio,
        block_size=block_size,
        check_bounds=call.check_bounds,
        exact_casts=exact_casts_needed(device),
        pdl=pdl if call.enable_pdl is None else call.enable_pdl,
        nvidia=checks.nvidia_capability(device) is not None,
        key_bytes=k_pre.element_size(),
        k_pre_row_stride=k_pre.stride(0),
        cos_sin_row_stride=cos_sin.stride(0),
        max_pos=cos_sin.shape[0],
        eps=float(call.rms_norm_eps),
        page_stride=k_cache.stride(0),
        num_slots=num_blocks * block_size,
    )


@tunable
def store_settings(num_tokens: int, compress_ratio: int, use_fp4: bool, interpreted: bool,
                   key_bytes: int = 2) -> StoreSettings:
    """The launch setting for a call: deterministic in its inputs, chosen on an H200 with
    ``benchmarks/tune_store.py`` (results and reasons: BENCHMARKS.md, "The store").

    Small launches are latency-bound (a token or two per program, key rows loaded with the
    indices); large ones bandwidth-bound (32 tokens per program over several warps; at ratio
    2 up to 64K tokens, 8 token pairs on one warp). Ratio 2
    takes token pairs, so that the rows of skipped tokens are not read, and needs more
    programs in flight (a register cap) above 64K tokens, where its programs first hint
    the indices of the program ``HINT_AHEAD`` further on into L2 (but for float32 keys into
    MXFP4). Float32 keys into MXFP4 take 16 tokens a program at ratio 1, as FP8 does, not
    32. No default compacts a range's written tokens onto the lanes (``compact``): it is
    a setting to tune with.
    """
    if interpreted:
        return StoreSettings(64, 1, False, 0)  # the interpreter's cost is per program
    if num_tokens <= 64:
        return StoreSettings(1, 1, True, 0)
    if num_tokens <= 1024:
        return StoreSettings(2, 1, True, 0)
    if num_tokens <= 8192:
        return StoreSettings(8, 1, True, 0) if compress_ratio == 1 else StoreSettings(4, 1, False, 0)
    if num_tokens <= 65536:
        return StoreSettings(32, 4, True, 0) if compress_ratio == 1 else StoreSettings(8, 1, False, 0)
    if compress_ratio == 2:  # see BENCHMARKS.md, ratio 2
        # The programs hint the indices of a later program into L2, but for float32 keys
        # into MXFP4 (no gain there: the keys' own round trip is the longer).
        hint = 0 if use_fp4 and key_bytes > 2 else HINT_AHEAD
        return StoreSettings(16, 2, False, 96, hint_ahead=hint)
    if use_fp4 and key_bytes == 2:
        return StoreSettings(32, 2, True, 0, group_scales=True)
    # FP8, and float32 keys into MXFP4 (twice the registers a row): 16 tokens a program.
    return StoreSettings(16, 2, True, 0)


def compile_options(nvidia: bool, pdl: bool, max_registers: int) -> dict:
    """Triton options for the store's compiled launch. PDL and the register cap are
    options of Triton's NVIDIA backend only: others reject them by name."""
    # No fused multiply-adds: the reference's rounding.
    return {"enable_fp_fusion": False, **checks.nvidia_options(nvidia, pdl, max_registers)}


def _store_launch(plan: StorePlan, settings: StoreSettings) -> Launch:
    return STORE_KERNEL.launch(
        plan.device,
        num_warps=settings.num_warps,
        options=compile_options(plan.nvidia, plan.pdl, settings.max_registers),
        k_pre_row_stride=plan.k_pre_row_stride,
        cos_sin_row_stride=plan.cos_sin_row_stride,
        max_pos=plan.max_pos,
        eps=plan.eps,
        page_stride=plan.page_stride,
        num_slots=plan.num_slots,
        COMPRESS_RATIO=plan.compress_ratio,
        USE_FP4=plan.use_fp4_cache,
        MX_SCALES=plan.mx_scales,
        LAYOUT=plan.layout,
        N_PER_TILE=plan.n_per_tile,
        D_PER_TILE=plan.d_per_tile,
        SCALE_LANES=plan.scale_lanes,
        BLOCK_SIZE=plan.block_size,
        BLOCK_T=settings.tokens_per_program,
        EAGER_LOADS=settings.eager_loads,
        COMPACT=settings.compact,
        RANGES=settings.ranges,
        EXACT_CASTS=plan.exact_casts,
        USE_PDL=plan.pdl,
        HINT_AHEAD=settings.hint_ahead if plan.nvidia else 0,
        GROUP_SCALES=settings.group_scales and plan.use_fp4_cache,
    )


def run_store(plan: StorePlan, call: OpCall) -> None:
    num_tokens = call.kv_slot_mapping.shape[0]
    token_shapes = (call.k_pre.shape[0], call.positions.shape[0], num_tokens)
    if token_shapes not in plan.apart_checked:
        # k_cache against the inputs' memory on the first call of each token shapes, not on
        # every call: on the eager path that costs more than the call's budget (measured,
        # BENCHMARKS.md). A plan is found again by the tensors' metadata, not their addresses.
        checks.check_apart(checks.output_extents(call, "k_cache", (
            "k_pre", "positions", "cos_sin_cache", "rms_norm_weight", "kv_slot_mapping")), call)
        if len(plan.apart_checked) >= MAX_SIZES_KEPT:
            plan.apart_checked.clear()
        plan.apart_checked.add(token_shapes)
    if call.k_pre.shape[0] < num_tokens or call.positions.shape[0] < num_tokens:
        check_token_counts(call)  # raises, naming the short tensor
    if plan.check_bounds:
        checks.check_store_bounds(call.positions, plan.max_pos, plan.num_slots,
                                  call.kv_slot_mapping, plan.compress_ratio)
    if num_tokens == 0:
        return
    if plan.backend == "reference":
        reference.store(*call[:9], mx_scales=plan.mx_scales, layout_code=plan.layout,
                        n_per_tile=plan.n_per_tile, d_per_tile=plan.d_per_tile,
                        scale_lanes=plan.scale_lanes)
        return
    # The launch for this size, kept while store_settings stays the same function (an
    # override swaps it; one that changes its answer over time is not followed).
    chosen = plan.by_tokens.get(num_tokens)
    if chosen is None or chosen[0] is not store_settings:
        chosen = _launch_for(plan, num_tokens)
    _, launch, grid = chosen
    launch(grid, k_pre_ptr=call.k_pre, positions_ptr=call.positions,
           cos_sin_ptr=call.cos_sin_cache, weight_ptr=call.rms_norm_weight,
           cache_ptr=call.k_cache, slot_ptr=call.kv_slot_mapping, num_tokens=num_tokens)


def _launch_for(plan: StorePlan, num_tokens: int) -> tuple:
    """(store_settings, launch, grid) for ``num_tokens``, kept in ``plan.by_tokens``."""
    settings = store_settings(num_tokens, plan.compress_ratio, plan.use_fp4_cache, INTERPRETED,
                              plan.key_bytes)
    launch = plan.launches.get(settings) or plan.launches.setdefault(
        settings, _store_launch(plan, settings))
    if settings.compact:  # ranges of tokens_per_program * compress_ratio tokens
        per_program = settings.tokens_per_program * plan.compress_ratio * settings.ranges
    else:  # pairs with compress_ratio 2, unless the rows are loaded eagerly
        per_program = settings.tokens_per_program * (
            1 if settings.eager_loads else plan.compress_ratio)
    chosen = (store_settings, launch, (-(-num_tokens // per_program),))
    if len(plan.by_tokens) >= MAX_SIZES_KEPT:
        plan.by_tokens.clear()
    plan.by_tokens[num_tokens] = chosen
    return chosen


@declare_op(check=check_store, run=run_store, mutates=("k_cache",),
            token_dims={"k_pre": (0,), "positions": (0,), "kv_slot_mapping": (0,)})
def indexer_k_norm_rope_store(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
    use_fp4_cache: bool,
    mxfp4_n_per_tile: int = 0,
    *,
    mx_scales: bool | None = None,
    shuffle: bool | None = None,
    backend: str | None = None,
    check_bounds: bool = False,
    enable_pdl: bool | None = None,
    mxfp4_d_per_tile: int = layout.MXFP4_D_PER_TILE,
    mxfp4_scale_lanes: int | None = None,
) -> None:
    """RMS-norm -> RoPE -> quantize -> paged store of the indexer keys; mutates ``k_cache``.

    The first nine arguments are those of vLLM's function of the same name. Token ``t <
    kv_slot_mapping.numel()`` is written iff its slot is >= 0 and ``(positions[t] + 1) %
    compress_ratio == 0``; slots or group positions out of range are skipped (or, with
    ``check_bounds=True``, reported as ``IndexError`` by a synchronising host check).

    ``k_pre`` may be bf16, float32 or float16: the bytes are those of the same call with
    ``k_pre.to(torch.bfloat16)``. A written key that is not finite after the norm and the
    rotation (NaN or infinity in its row of ``k_pre`` or ``cos_sin_cache``, or on the way)
    is stored poisoned: every value code zero and its scale NaN.

    Args:
        mxfp4_n_per_tile: tokens per run of the ROCm MXFP4 preshuffle layout (aiter's
            ``n_per_tile``, the MQA-logits kernel's MFMA N): a divisor of block_size.
        mx_scales: FP8 scales as four UE8M0 bytes; ``None`` = true on CUDA cc 10.x.
        shuffle: ROCm value layout; ``None`` = true on ROCm when ``block_size > 1``.
        backend: ``"triton"``, ``"reference"`` or ``None`` (Triton on GPUs and under
            ``TRITON_INTERPRET=1``, the torch reference otherwise).
        check_bounds: raise ``IndexError`` for out-of-range slots or positions.
        enable_pdl: programmatic dependent launch: the kernel may be launched while the
            previous kernel in the stream is still running, and waits for it before reading
            or writing memory; it also lets the next kernel launch early. ``None`` = on for
            NVIDIA GPUs of compute capability 9.0 and newer.
        mxfp4_d_per_tile: bytes per chunk of a token's 64 value bytes in a run of the
            preshuffle layout (aiter's ``d_per_tile``): a divisor of 64.
        mxfp4_scale_lanes: aiter's ``scale_lanes``: a run's scales are stored as ``[scale %
            scale_lanes, token, scale // scale_lanes]``; a divisor of 4. ``None`` = ``64 //
            mxfp4_n_per_tile`` (vLLM's order).
    """
