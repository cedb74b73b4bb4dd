"""``indexer_k_norm_rope_store``: the public store, its checks and its launcher."""

from __future__ import annotations

import numbers

import torch

from . import checks, layout, reference
from .checks import fail_type, fail_value
from .direct_launch import launch_compiled, plain_eager
from .kernels import INTERPRETED, indexer_k_store_kernel
from .plan_cache import PlanCache

# float32 / float16 keys are rounded to bf16 as the kernel loads them.
K_PRE_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
COS_SIN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
WEIGHT_DTYPES = (torch.bfloat16, torch.float32)


class StorePlan:
    """Everything about a call that does not change while its tensors' metadata doesn't."""

    __slots__ = ("backend", "use_fp4_cache", "mx_scales", "layout", "n_per_tile", "d_per_tile",
                 "scale_lanes", "compress_ratio", "block_size", "exact_casts", "pdl", "nvidia",
                 "device", "sizes", "launches")

    def __init__(self, **fields):
        self.launches = {}  # specialization key -> compiled kernel (see launch_store)
        for name, value in fields.items():
            setattr(self, name, value)

    def constexprs(self, block_t: int, eager_loads: bool, compact: bool, ranges: int) -> tuple:
        """The kernel's compile-time arguments, in order."""
        return (self.compress_ratio, self.use_fp4_cache, self.mx_scales, self.layout,
                self.n_per_tile, self.d_per_tile, self.scale_lanes, self.block_size, block_t,
                eager_loads, compact, ranges, self.exact_casts, self.pdl)


def _nvidia_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of an NVIDIA GPU running compiled kernels; None for the
    interpreter, CPU tensors and ROCm."""
    if INTERPRETED or device.type != "cuda" or torch.version.hip is not None:
        return None
    return torch.cuda.get_device_capability(device)


def exact_casts_needed(device: torch.device) -> bool:
    """Use the integer float conversions unless the GPU converts to fp8/bf16 natively.

    Native e4m3 conversion exists on NVIDIA sm_89 and newer; elsewhere (the interpreter,
    ROCm, older NVIDIA) the portable conversions are the ones known to be exact.
    """
    capability = _nvidia_capability(device)
    return capability is None or capability < (8, 9)


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: NVIDIA sm_90 and newer, compiled kernels only."""
    capability = _nvidia_capability(device)
    return capability is not None and capability >= (9, 0)


def plan_store(
    k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache, kv_slot_mapping,
    compress_ratio, use_fp4_cache, mxfp4_n_per_tile, mx_scales, shuffle, backend, check_bounds,
    enable_pdl=None, mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE, mxfp4_scale_lanes=None,
) -> StorePlan:
    """Check every argument; return how to run the call. Raises before touching k_cache."""
    checks.check_flag("use_fp4_cache", use_fp4_cache)
    checks.check_flag("mx_scales", mx_scales, allow_none=True)
    checks.check_flag("check_bounds", check_bounds)
    checks.check_flag("enable_pdl", enable_pdl, allow_none=True)
    checks.check_dtype("k_pre", k_pre, K_PRE_DTYPES)
    if k_pre.dim() != 2 or k_pre.shape[1] != layout.HEAD_DIM:
        fail_value("k_pre", f"shape [num_tokens, {layout.HEAD_DIM}]", f"shape {tuple(k_pre.shape)}")
    if k_pre.stride(1) != 1:
        fail_value("k_pre.stride(1)", "1", k_pre.stride(1))
    checks.check_index_vector("positions", positions)
    checks.check_dtype("cos_sin_cache", cos_sin_cache, COS_SIN_DTYPES)
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != layout.ROPE_DIM:
        fail_value("cos_sin_cache", f"shape [max_pos, {layout.ROPE_DIM}] ({layout.ROPE_DIM // 2} cos "
                   f"then {layout.ROPE_DIM // 2} sin)", f"shape {tuple(cos_sin_cache.shape)}")
    if cos_sin_cache.stride(1) != 1:
        fail_value("cos_sin_cache.stride(1)", "1", cos_sin_cache.stride(1))
    checks.check_dtype("rms_norm_weight", rms_norm_weight, WEIGHT_DTYPES)
    if rms_norm_weight.dim() != 1 or rms_norm_weight.shape[0] != layout.HEAD_DIM:
        fail_value("rms_norm_weight", f"shape [{layout.HEAD_DIM}]",
                   f"shape {tuple(rms_norm_weight.shape)}")
    if rms_norm_weight.stride(0) != 1:
        fail_value("rms_norm_weight.stride(0)", "1", rms_norm_weight.stride(0))
    if not isinstance(rms_norm_eps, numbers.Real) or isinstance(rms_norm_eps, bool):
        fail_type("rms_norm_eps", "a float", type(rms_norm_eps).__name__)
    checks.check_k_cache(k_cache, use_fp4_cache)
    checks.check_index_vector("kv_slot_mapping", kv_slot_mapping)
    if not isinstance(compress_ratio, int) or isinstance(compress_ratio, bool):
        fail_type("compress_ratio", "an int", type(compress_ratio).__name__)
    if compress_ratio not in (1, 2):
        fail_value("compress_ratio", "1 or 2", compress_ratio)
    checks.check_same_device("k_cache", k_cache, k_pre=k_pre, positions=positions,
                             cos_sin_cache=cos_sin_cache, rms_norm_weight=rms_norm_weight,
                             kv_slot_mapping=kv_slot_mapping)
    num_tokens = kv_slot_mapping.shape[0]
    if k_pre.shape[0] < num_tokens:
        fail_value("k_pre.shape[0]", f">= kv_slot_mapping.numel() = {num_tokens}", k_pre.shape[0])
    if positions.shape[0] < num_tokens:
        fail_value("positions.numel()", f">= kv_slot_mapping.numel() = {num_tokens}",
                   positions.shape[0])
    device = k_cache.device
    block_size = k_cache.shape[1]
    layout_code, n_per_tile, d_per_tile, scale_lanes = checks.resolve_layout(
        use_fp4_cache, shuffle, block_size, mxfp4_n_per_tile, device, mxfp4_d_per_tile,
        mxfp4_scale_lanes)
    pdl = pdl_supported(device)
    if enable_pdl and not pdl:
        checks.fail_unsupported("enable_pdl", "False or None on this device (PDL needs an "
                                "NVIDIA GPU of compute capability 9.0 or newer)", enable_pdl)
    return StorePlan(
        device=k_cache.get_device(),
        # The kernel's size arguments that the plan's key fixes (strides and shapes).
        sizes=(k_pre.stride(0), cos_sin_cache.stride(0), cos_sin_cache.shape[0],
               k_cache.stride(0), k_cache.shape[0] * block_size),
        backend=checks.resolve_backend(backend, device),
        use_fp4_cache=use_fp4_cache,
        mx_scales=(checks.default_mx_scales(device) if mx_scales is None else mx_scales)
        and not use_fp4_cache,
        layout=layout_code,
        n_per_tile=n_per_tile,
        d_per_tile=d_per_tile,
        scale_lanes=scale_lanes,
        compress_ratio=compress_ratio,
        block_size=block_size,
        exact_casts=exact_casts_needed(device),
        pdl=pdl if enable_pdl is None else enable_pdl,
        nvidia=_nvidia_capability(device) is not None,
    )


def check_store_bounds(positions, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio) -> None:
    """Host-side (synchronising) check: IndexError naming the first bad token."""
    num_tokens = kv_slot_mapping.shape[0]
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    max_pos = cos_sin_cache.shape[0]
    slots = kv_slot_mapping.long()
    pos = positions[:num_tokens].long()
    group_pos = torch.div(pos, compress_ratio, rounding_mode="floor") * compress_ratio
    boundary = (pos + 1) % compress_ratio == 0
    bad_slot = (slots < -1) | (slots >= num_slots)
    bad_pos = (slots >= 0) & boundary & ((pos < 0) | (group_pos >= max_pos))
    bad = (bad_slot | bad_pos).nonzero()
    if bad.numel():
        t = int(bad[0, 0])
        raise IndexError(
            f"token {t}: slot {int(slots[t])} (valid: -1 or [0, {num_slots})), position "
            f"{int(pos[t])} -> group position {int(group_pos[t])} (valid: [0, {max_pos}))"
        )


def store_settings(num_tokens: int, compress_ratio: int, use_fp4: bool, interpreted: bool
                   ) -> tuple[int, int, bool, int, bool, int]:
    """(tokens per program, warps per program, eager key loads, register cap, compaction,
    ranges per program) for a launch.

    Deterministic in its inputs; chosen with ``benchmarks/tune_store.py`` on an H200
    (``benchmarks/results/h200-tune.txt``). Small launches are latency-bound: one or two
    tokens per program, key rows loaded with the slots and positions. Large ones are
    bandwidth-bound: 32 tokens per program over 4 warps, or over 2 for MXFP4 above 64K
    tokens (each token's reductions within a warp: fewer instructions for the heavier
    encoding). Ratio 2 takes token pairs, so that the rows of skipped tokens are not read;
    as each key row waits for the slots and positions, it needs more programs in flight:
    above 64K tokens, 16 pairs over 2 warps with a cap of 80 registers a thread (0 = the
    compiler's choice), 12 programs to an SM; 96 for MXFP4's longer encoding (10 to an SM).
    With compaction (the last two fields; the kernel's ``COMPACT`` and ``RANGES``) a
    program instead walks ``ranges`` ranges of ``tokens * compress_ratio`` tokens, loading
    each range's slots and positions while it encodes the previous one.
    """
    if interpreted:
        return 64, 1, False, 0, False, 1  # the interpreter's cost is per program: fewer, larger ones
    if num_tokens <= 64:
        return 1, 1, True, 0, False, 1
    if num_tokens <= 1024:
        return 2, 1, True, 0, False, 1
    if num_tokens <= 8192:
        return (8, 1, True, 0, False, 1) if compress_ratio == 1 else (4, 1, False, 0, False, 1)
    if num_tokens <= 65536:
        return (32, 4, True, 0, False, 1) if compress_ratio == 1 else (32, 4, False, 0, False, 1)
    if compress_ratio == 2:
        return (16, 2, False, 96, False, 1) if use_fp4 else (16, 2, False, 80, False, 1)
    return (32, 2, True, 0, False, 1) if use_fp4 else (32, 4, True, 0, False, 1)


def launch_store(plan: StorePlan, num_tokens: int, k_pre, positions, cos_sin_cache,
                 rms_norm_weight, rms_norm_eps, k_cache, kv_slot_mapping) -> None:
    """Launch the kernel for the first ``num_tokens`` tokens. After the first launch for a
    given specialization (the kernel's compile-time view of pointer alignment and int
    widths), later ones go straight to the compiled kernel, skipping Triton's per-call
    argument binding."""
    block_t, num_warps, eager_loads, max_registers, compact, ranges = store_settings(
        num_tokens, plan.compress_ratio, plan.use_fp4_cache, INTERPRETED)
    if compact:  # ranges of block_t * compress_ratio tokens
        tokens_per_program = block_t * plan.compress_ratio * ranges
    else:
        tokens_per_program = block_t * (1 if eager_loads else plan.compress_ratio)  # pairs
    grid = -(-num_tokens // tokens_per_program)
    if INTERPRETED:
        indexer_k_store_kernel[(grid,)](
            *_kernel_args(plan, k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps,
                          k_cache, kv_slot_mapping, num_tokens,
                          plan.constexprs(block_t, eager_loads, compact, ranges)),
            num_warps=num_warps)
        return
    k_pre_ptr, positions_ptr = k_pre.data_ptr(), positions.data_ptr()
    cos_sin_ptr, weight_ptr = cos_sin_cache.data_ptr(), rms_norm_weight.data_ptr()
    cache_ptr, slots_ptr = k_cache.data_ptr(), kv_slot_mapping.data_ptr()
    # Triton specializes pointers on 16-byte alignment and types an int as i32 or i64 by its
    # value: a kernel compiled for one must not be launched with the other. The plan's key
    # fixes every other argument's specialization.
    key = (block_t, num_warps, eager_loads, max_registers, compact, ranges, num_tokens > 0x7FFFFFFF,
           k_pre_ptr % 16 == 0, positions_ptr % 16 == 0, cos_sin_ptr % 16 == 0,
           weight_ptr % 16 == 0, cache_ptr % 16 == 0, slots_ptr % 16 == 0)
    launch = plan.launches.get(key)
    if launch is None:
        # The first launch of a specialization compiles it from the tensors themselves.
        constexprs = plan.constexprs(block_t, eager_loads, compact, ranges)
        with torch.cuda.device(plan.device):
            compiled = indexer_k_store_kernel[(grid,)](
                *_kernel_args(plan, k_pre, positions, cos_sin_cache, rms_norm_weight,
                              rms_norm_eps, k_cache, kv_slot_mapping, num_tokens, constexprs),
                num_warps=num_warps, **compile_options(plan.nvidia, plan.pdl, max_registers))
        plan.launches[key] = compiled, constexprs
        return
    # Later launches pass the addresses as integers: Triton's launcher then skips its
    # per-pointer driver query (is this a device address?), which the plan's device checks
    # have answered already.
    compiled, constexprs = launch
    launch_compiled(compiled, plan.device, grid, _kernel_args(
        plan, k_pre_ptr, positions_ptr, cos_sin_ptr, weight_ptr, rms_norm_eps, cache_ptr,
        slots_ptr, num_tokens, constexprs))


def _kernel_args(plan: StorePlan, k_pre, positions, cos_sin_cache, rms_norm_weight,
                 rms_norm_eps, k_cache, kv_slot_mapping, num_tokens: int,
                 constexprs: tuple) -> tuple:
    """The kernel's arguments in order; the tensors may be given as their addresses."""
    k_pre_row_stride, cos_sin_row_stride, max_pos, page_stride, num_slots = plan.sizes
    return (k_pre, k_pre_row_stride, positions, cos_sin_cache, cos_sin_row_stride, max_pos,
            rms_norm_weight, float(rms_norm_eps), k_cache, page_stride, num_slots,
            kv_slot_mapping, num_tokens, *constexprs)


def compile_options(nvidia: bool, pdl: bool, max_registers: int) -> dict:
    """Triton options for the store's compiled launch. PDL and the register cap are
    options of Triton's NVIDIA backend only: others reject them by name."""
    options = {"enable_fp_fusion": False}  # no fused multiply-adds: the reference's rounding
    if nvidia:
        options["launch_pdl"] = pdl
        if max_registers:
            options["maxnreg"] = max_registers
    return options


# A plan fixes everything but the token count: the first size of k_pre, positions and
# kv_slot_mapping (the tensors in the order ``store_impl`` passes them).
_PLANS = PlanCache(token_dims=((0,), (0,), (), (), (), (0,)))


def store_impl(
    k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache, kv_slot_mapping,
    compress_ratio, use_fp4_cache, mxfp4_n_per_tile=0, mx_scales=None, shuffle=None,
    backend=None, check_bounds=False, enable_pdl=None, mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE,
    mxfp4_scale_lanes=None,
) -> None:
    tensors = (k_pre, positions, cos_sin_cache, rms_norm_weight, k_cache, kv_slot_mapping)
    # With their types: 1.0 and True equal 1 as dictionary keys, but are not valid ratios.
    options = (type(rms_norm_eps), compress_ratio, use_fp4_cache, mxfp4_n_per_tile, mx_scales,
               shuffle, backend, check_bounds, enable_pdl, mxfp4_d_per_tile, mxfp4_scale_lanes,
               type(compress_ratio), type(use_fp4_cache), type(mxfp4_n_per_tile), type(mx_scales),
               type(shuffle), type(check_bounds), type(enable_pdl), type(mxfp4_d_per_tile),
               type(mxfp4_scale_lanes))
    plan = _PLANS.get(options, tensors)
    if plan is not None:
        num_tokens = kv_slot_mapping.shape[0]
        if k_pre.shape[0] < num_tokens or positions.shape[0] < num_tokens:
            plan = None  # the checks name the short tensor
    if plan is None:
        plan = plan_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps,
                          k_cache, kv_slot_mapping, compress_ratio, use_fp4_cache,
                          mxfp4_n_per_tile, mx_scales, shuffle, backend, check_bounds,
                          enable_pdl, mxfp4_d_per_tile, mxfp4_scale_lanes)  # raises on any bad argument
        # An index vector of one element may have any stride: a plan kept for it would
        # let a longer vector with that stride through.
        if positions.stride() == (1,) and kv_slot_mapping.stride() == (1,):
            _PLANS.add(options, tensors, plan)
        num_tokens = kv_slot_mapping.shape[0]
    if check_bounds:
        check_store_bounds(positions, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio)
    if num_tokens == 0:
        return
    if plan.backend == "reference":
        reference.store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                        kv_slot_mapping, compress_ratio, use_fp4_cache, mx_scales=plan.mx_scales,
                        layout_code=plan.layout, n_per_tile=plan.n_per_tile,
                        d_per_tile=plan.d_per_tile, scale_lanes=plan.scale_lanes)
    else:
        launch_store(plan, num_tokens, k_pre, positions, cos_sin_cache, rms_norm_weight,
                     rms_norm_eps, k_cache, kv_slot_mapping)


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
    if plain_eager(k_cache, k_pre):  # the op's implementation, without the dispatcher
        store_impl(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                   kv_slot_mapping, compress_ratio, use_fp4_cache, mxfp4_n_per_tile, mx_scales,
                   shuffle, backend, check_bounds, enable_pdl, mxfp4_d_per_tile, mxfp4_scale_lanes)
        return
    args = (k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
            kv_slot_mapping, compress_ratio, use_fp4_cache, mxfp4_n_per_tile)
    try:
        torch.ops.indexer_kcache.indexer_k_norm_rope_store(
            *args, mx_scales=mx_scales, shuffle=shuffle, backend=backend,
            check_bounds=check_bounds, enable_pdl=enable_pdl, mxfp4_d_per_tile=mxfp4_d_per_tile,
            mxfp4_scale_lanes=mxfp4_scale_lanes)
    except RuntimeError:
        # The op's schema rejects wrong argument types with a bare RuntimeError before
        # anything runs; name the argument instead.
        plan_store(*args, mx_scales, shuffle, backend, check_bounds, enable_pdl,
                   mxfp4_d_per_tile, mxfp4_scale_lanes)
        raise
