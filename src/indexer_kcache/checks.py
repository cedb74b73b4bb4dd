"""Argument checks shared by every op, and the host-side bounds checks.

Every failure raises ``TypeError`` (wrong type or dtype), ``ValueError`` (wrong shape,
stride, device or value) or ``NotImplementedError`` (a combination no layout defines),
naming the argument with what was expected and what was got. Checks run before any
byte of the cache is touched.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any

import torch

from . import layout
from .kernels import INTERPRETED, dependent_launch

# An op's call: the named tuple of its declared arguments, one type per op, made by the
# launcher when the op is declared (``launcher.Op.Call``), read by name (``call.k_cache``).
OpCall = Any

INDEX_DTYPES = (torch.int32, torch.int64)
# Columns of logits and top-k results are int32 in the kernels (and in top-k's output).
MAX_COLUMNS = 2**31 - 1
BACKENDS = (None, "triton", "reference")


def fail_type(name: str, expected: str, got: object) -> None:
    raise TypeError(f"{name}: expected {expected}, got {got}")


def type_name(value: object) -> str:
    """The name of ``value``'s type for an error: qualified by its module unless builtin
    (``numpy.bool``, not ``bool``)."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def fail_value(name: str, expected: str, got: object) -> None:
    raise ValueError(f"{name}: expected {expected}, got {got}")


def fail_unsupported(name: str, expected: str, got: object) -> None:
    raise NotImplementedError(f"{name}: expected {expected}, got {got}")


def check_dtype(name: str, t: object, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        fail_type(name, "a torch.Tensor", type_name(t))
    if t.layout != torch.strided:  # sparse tensors have no strides to index by
        fail_type(name, "a dense (strided) torch.Tensor", f"layout {t.layout}")
    if t.dtype not in dtypes:
        fail_type(name, "dtype " + " or ".join(str(d) for d in dtypes), t.dtype)


def check_rows(name: str, t: object, dtypes: tuple[torch.dtype, ...], width: int,
               shape: str) -> None:
    """A 2-d tensor of ``width`` columns with unit stride along its rows (``shape`` says
    the expected shape in the error)."""
    check_dtype(name, t, dtypes)
    if t.dim() != 2 or t.shape[1] != width:
        fail_value(name, shape, f"shape {tuple(t.shape)}")
    if t.stride(1) != 1:
        fail_value(f"{name}.stride(1)", "1", t.stride(1))


def check_index_vector(name: str, t: torch.Tensor) -> None:
    """int32/int64, one dimension, unit stride (the kernels index it as a flat array)."""
    check_dtype(name, t, INDEX_DTYPES)
    if t.dim() != 1:
        fail_value(name, "a 1-d tensor", f"shape {tuple(t.shape)}")
    if t.numel() > 1 and t.stride(0) != 1:
        fail_value(f"{name}.stride(0)", "1", t.stride(0))


def check_same_device(reference_name: str, reference: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.device != reference.device:
            fail_value(f"{name}.device", f"{reference.device} (the device of {reference_name})",
                       t.device)


def _fail_kind(name: str, expected: str, value: object, allow_none: bool) -> None:
    fail_type(name, expected + (" or None" if allow_none else ""), type_name(value))


def check_flag(name: str, value: object, allow_none: bool = False) -> None:
    """A bool, or None where allowed."""
    if not (isinstance(value, bool) or (allow_none and value is None)):
        _fail_kind(name, "a bool", value, allow_none)


def check_text(name: str, value: object, allow_none: bool = False) -> None:
    """A str (not bytes), or None where allowed."""
    if not (isinstance(value, str) or (allow_none and value is None)):
        _fail_kind(name, "a str", value, allow_none)


def check_rows_apart(name: str, t: torch.Tensor, width_name: str) -> None:
    """The rows of the 2-d output ``t`` (``width_name`` = its width) do not overlap."""
    if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        fail_value(f"{name}.stride(0)", f">= {width_name} = {t.shape[1]} (rows must not overlap)",
                   t.stride(0))


def extent_bytes(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to just past its last element (0 when empty)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def output_extents(call: OpCall, output: str, inputs: tuple[str | tuple[str, str], ...]
                   ) -> tuple[tuple[str, str, int], ...]:
    """``(field, name, extent_bytes)`` of the output ``call.<output>``, then of each input
    tensor of ``call`` in ``inputs`` (a field, or ``(field, name in messages)``; ``None``
    ones left out): what ``check_apart`` compares. A plan keeps them: they are fixed by
    the tensors' shapes and strides."""
    named = [(entry, entry) if isinstance(entry, str) else entry for entry in (output, *inputs)]
    return tuple((field, name, extent_bytes(getattr(call, field))) for field, name in named
                 if getattr(call, field) is not None)


def check_apart(extents: tuple[tuple[str, str, int], ...], call: OpCall) -> None:
    """The output of ``extents`` (``output_extents``) shares no byte with the inputs: a
    kernel that reads an input while writing over it would read its own results. Compared
    by address ranges, which are exact for dense tensors and err on the side of an error
    for interleaved views of one buffer."""
    (out_field, out_name, out_extent), *inputs = extents
    start = getattr(call, out_field).data_ptr()
    end = start + out_extent
    for field, name, extent in inputs:
        first = getattr(call, field).data_ptr()
        if first < end and start < first + extent and out_extent and extent:
            fail_value(out_name, f"memory apart from {name}", "tensors that overlap")


def _check_scale_lanes(lanes: int, n: int, got: object) -> None:
    if lanes < 1 or layout.SCALE_BYTES % lanes:
        fail_value("mxfp4_scale_lanes",
                   f"a divisor of {layout.SCALE_BYTES} (with mxfp4_n_per_tile = {n})", got)


def check_k_cache(k_cache: object, use_fp4_cache: bool) -> None:
    """uint8 [num_blocks, block_size, row_bytes] with rows packed and pages >= the payload."""
    check_dtype("k_cache", k_cache, (torch.uint8,))
    if k_cache.dim() != 3:
        fail_value("k_cache", "a 3-d tensor [num_blocks, block_size, row_bytes]",
                   f"shape {tuple(k_cache.shape)}")
    num_blocks, block_size, row_bytes = k_cache.shape
    expected_row = layout.cache_row_bytes(use_fp4_cache)
    if row_bytes != expected_row:
        fail_value("k_cache.shape[2]",
                   f"{expected_row} bytes per row ({'MXFP4' if use_fp4_cache else 'FP8'})",
                   row_bytes)
    if block_size < 1:
        fail_value("k_cache.shape[1] (block_size)", ">= 1", block_size)
    if k_cache.stride(2) != 1 or (block_size > 1 and k_cache.stride(1) != row_bytes):
        fail_value("k_cache.stride()", f"(page_stride, {row_bytes}, 1): rows packed inside a page",
                   k_cache.stride())
    if num_blocks > 1 and k_cache.stride(0) < block_size * row_bytes:
        fail_value("k_cache.stride(0)", f">= block_size * row_bytes = {block_size * row_bytes}",
                   k_cache.stride(0))


def check_real(name: str, value: object, allow_none: bool = False) -> None:
    """A real number (int or float, not a bool), or None where allowed."""
    if not ((isinstance(value, numbers.Real) and not isinstance(value, bool))
            or (allow_none and value is None)):
        _fail_kind(name, "a float", value, allow_none)


def check_int(name: str, value: object, allow_none: bool = False,
              at_least: int | None = None, at_most: int | None = None) -> None:
    """An int (not a bool), or None where allowed; ``>= at_least`` and ``<= at_most`` when
    given."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        _fail_kind(name, "an int", value, allow_none)
    if not -(1 << 63) <= value < 1 << 63:  # what an op's schema takes
        fail_value(name, "an int64", value)
    if at_least is not None and value < at_least:
        fail_value(name, f">= {at_least}", value)
    if at_most is not None and value > at_most:
        fail_value(name, f"<= {at_most}", value)


def resolve_layout(use_fp4_cache: bool, shuffle: bool | None, block_size: int,
                   mxfp4_n_per_tile: int, device: torch.device,
                   mxfp4_d_per_tile: int = layout.MXFP4_D_PER_TILE,
                   mxfp4_scale_lanes: int | None = None) -> tuple[int, int, int, int]:
    """(layout code, n_per_tile, d_per_tile, scale_lanes) for the arguments, after checking
    they define a layout. The three MXFP4 preshuffle numbers are 0 for the other layouts,
    which ignore them (a value that is no order's, such as a chunk that does not divide
    64, is an error all the same)."""
    check_int("mxfp4_n_per_tile", mxfp4_n_per_tile, at_least=0)
    check_int("mxfp4_d_per_tile", mxfp4_d_per_tile)
    check_int("mxfp4_scale_lanes", mxfp4_scale_lanes, allow_none=True)
    check_flag("shuffle", shuffle, allow_none=True)
    if mxfp4_d_per_tile < 1 or layout.MXFP4_VALUE_BYTES % mxfp4_d_per_tile:
        fail_value("mxfp4_d_per_tile",
                   f"a divisor of {layout.MXFP4_VALUE_BYTES} (the value bytes of an MXFP4 key)",
                   mxfp4_d_per_tile)
    if mxfp4_scale_lanes is not None:
        _check_scale_lanes(mxfp4_scale_lanes, mxfp4_n_per_tile, mxfp4_scale_lanes)
    if shuffle is None:
        shuffle = default_shuffle(device, block_size)
    code = layout.choose_layout(use_fp4_cache, shuffle, block_size)
    if code == layout.FP8_TILED and block_size % layout.TILE_TOKENS != 0:
        fail_value("k_cache.shape[1] (block_size)",
                   f"a multiple of {layout.TILE_TOKENS} for the tiled FP8 layout (shuffle=True)",
                   block_size)
    if code != layout.MXFP4_PRESHUFFLE:
        return code, 0, 0, 0
    n = mxfp4_n_per_tile
    if n == 0:
        fail_unsupported(
            "mxfp4_n_per_tile", "the MQA-logits kernel's tile N for the MXFP4 shuffled (ROCm) "
            f"layout, a divisor of block_size = {block_size} (one of "
            f"{layout.MXFP4_TILE_CHOICES} for the default mxfp4_scale_lanes)", 0)
    if block_size % n:
        fail_value("mxfp4_n_per_tile", f"a positive divisor of block_size = {block_size}", n)
    lanes = mxfp4_scale_lanes
    if lanes is None:  # (a value given was checked above)
        lanes = layout.default_scale_lanes(n)
        _check_scale_lanes(lanes, n, f"None, whose default {layout.ROCM_WAVEFRONT} // "
                           f"mxfp4_n_per_tile = {lanes} is not one")
    return code, n, mxfp4_d_per_tile, lanes


def default_shuffle(device: torch.device, block_size: int) -> bool:
    """The ROCm tiled layout is the platform default on ROCm GPUs for block_size > 1."""
    return device.type == "cuda" and torch.version.hip is not None and block_size > 1


def default_mx_scales(device: torch.device) -> bool:
    """Packed UE8M0 FP8 scales are the default on CUDA GPUs of compute capability 10.x."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] == 10


def interpreter_enabled() -> bool:
    """Whether the Triton kernels were built for the CPU interpreter (set at import time)."""
    from .kernels import INTERPRETED

    return INTERPRETED


def resolve_backend(backend: str | None, device: torch.device) -> str:
    if backend not in BACKENDS:
        fail_value("backend", "None, 'triton' or 'reference'", repr(backend))
    if backend is None:
        return "triton" if device.type != "cpu" or interpreter_enabled() else "reference"
    if backend == "triton" and device.type == "cpu" and not interpreter_enabled():
        fail_value("backend", "'reference' for CPU tensors (or set TRITON_INTERPRET=1 before "
                   "importing indexer_kcache to run the Triton kernels on the CPU)", "'triton'")
    return backend


# ------------------------------------------------------------------------ bounds checks
# Synchronising host checks, run only when a call asks for them (``check_bounds=True``):
# the kernels themselves skip out-of-range indices rather than touch memory outside the
# cache, but a caller may want to know.
def check_store_bounds(positions: torch.Tensor, max_pos: int, num_slots: int,
                       kv_slot_mapping: torch.Tensor, compress_ratio: int) -> None:
    """IndexError naming the first token whose slot is not -1 or a cache slot, or which
    writes (a group's last token) at a group position outside ``[0, max_pos)``."""
    num_tokens = kv_slot_mapping.shape[0]
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


def check_slots_in_range(slots: torch.Tensor, num_slots: int) -> None:
    """IndexError naming the first slot outside ``[0, num_slots)`` (synchronises)."""
    bad = ((slots < 0) | (slots >= num_slots)).nonzero()
    if bad.numel():
        first = int(bad[0, 0])
        raise IndexError(f"slots[{first}] = {int(slots[first])} is outside the cache's slots "
                         f"[0, {num_slots})")


def check_sequence_blocks(block_table: torch.Tensor, lengths: torch.Tensor, block_size: int,
                          num_blocks: int) -> None:
    """IndexError naming the first sequence longer than its block table's row, or the first
    ``block_table[b, j]`` a sequence reads that is not a block of the cache. ``lengths``: the
    sequences' token counts, on the host. Table-size work, whatever the lengths say (the
    slots are built only once the blocks are known good); synchronises."""
    columns = block_table.shape[1]
    blocks_read = -(-lengths // block_size)
    too_long = (blocks_read > columns).nonzero()
    if too_long.numel():
        b = int(too_long[0, 0])
        raise IndexError(f"block_table has {columns} columns; sequence {b} of "
                         f"{int(lengths[b])} tokens needs {int(blocks_read[b])}")
    read = (torch.arange(columns, device=block_table.device)
            < blocks_read.to(block_table.device)[:, None])
    bad = (read & ((block_table < 0) | (block_table >= num_blocks))).nonzero()
    if bad.numel():
        b, j = (int(i) for i in bad[0])
        raise IndexError(f"block_table[{b}, {j}] = {int(block_table[b, j])} is outside the "
                         f"cache's blocks [0, {num_blocks})")


def nvidia_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of an NVIDIA GPU running compiled kernels; None for the
    interpreter, CPU tensors and ROCm."""
    if INTERPRETED or device.type != "cuda" or torch.version.hip is not None:
        return None
    return torch.cuda.get_device_capability(device)


def native_fp8(device: torch.device) -> bool:
    """e4m3 conversions and FP8 tensor-core dots in hardware: NVIDIA sm_89 and newer,
    compiled kernels only."""
    capability = nvidia_capability(device)
    return capability is not None and capability >= (8, 9)


@functools.cache
def _sm_count_of(device_type: str, index: int | None) -> int:
    if device_type != "cuda":
        return 1
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the device, read once per device (1 off CUDA)."""
    index = device.index if device.index is not None or device.type != "cuda" else (
        torch.cuda.current_device())
    return _sm_count_of(device.type, index)


# Dependent-launch modes (the kernels' ``USE_PDL`` constexprs) as the host passes them.
PDL_NONE = dependent_launch.PDL_NONE.value
PDL_EARLY = dependent_launch.PDL_EARLY.value
PDL_AT_EXIT = dependent_launch.PDL_AT_EXIT.value


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: NVIDIA sm_90 and newer, compiled kernels only."""
    capability = nvidia_capability(device)
    return capability is not None and capability >= (9, 0)


def nvidia_options(nvidia: bool, pdl: bool, max_registers: int) -> dict:
    """Launch options of Triton's NVIDIA backend (others reject them by name): dependent
    launch (``pdl``, already resolved against ``pdl_supported``) and a register cap (on an
    NVIDIA GPU, ``nvidia``)."""
    options = {"launch_pdl": True} if pdl else {}
    if nvidia and max_registers:
        options["maxnreg"] = max_registers
    return options
