"""The store and the readers in pure torch: the cache's contract in code, on any device.

Every function here is written for clarity, not speed. The Triton kernels must write
and read exactly the bytes these functions do. Two choices make that possible by
construction rather than by luck:

* the sum of squares is a fixed tree of pairwise additions (adjacent pairs first), the
  same tree the kernel builds;
* every rounding step is explicit and correctly rounded: sqrt and division are done in
  float64 and rounded once to float32 (exact for these operations), bf16 rounding is
  round-to-nearest-even, and scale exponents come from the float's bits, not ``log2``.

Keys given in float32 or float16 are first rounded to bf16: the store writes exactly what
it writes for ``k_pre.to(torch.bfloat16)``. A written key with a value that is not finite
after the norm and the rotation is stored poisoned (every value code zero, its scale NaN).
"""

from __future__ import annotations

import torch

from .. import layout
from ..checks import check_slots_in_range
from ..layout import (
    FP8_AMAX_FLOOR,
    FP8_MAX,
    FP32_NAN_BITS,
    HEAD_DIM,
    MXFP4_AMAX_FLOOR,
    MXFP4_GROUP,
    MXFP4_MAX,
    ROPE_DIM,
    SCALE_BYTES,
    UE8M0_BIAS,
    UE8M0_NAN,
)

__all__ = [
    "ROPE_DIM",
    "FP8_MAX",
    "FP8_AMAX_FLOOR",
    "MXFP4_MAX",
    "MXFP4_AMAX_FLOOR",
    "E2M1_VALUES",
    "pair_tree_sum",
    "round_to_bf16",
    "ceil_log2",
    "pow2",
    "normalize_and_rope",
    "quantize_fp8",
    "e2m1_codes",
    "quantize_mxfp4",
    "poison_nonfinite",
    "cache_bytes",
    "token_byte_offsets",
    "written_tokens",
    "store",
    "gather",
    "slots_of_sequences",
    "decode_fp8",
    "decode_e2m1",
    "ue8m0_to_float",
    "dequantize",
]

# Magnitudes of the eight E2M1 codes.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# ----------------------------------------------------------------------------- numerics
def pair_tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last (power-of-two) dim as a fixed tree: adjacent pairs, halving."""
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def _sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    # float64 sqrt rounded to float32 is the correctly rounded float32 sqrt; torch's own
    # float32 sqrt on some CPUs is not.
    return torch.sqrt(x.double()).float()


def _div_rn(a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    b = b.double() if isinstance(b, torch.Tensor) else b
    return (a.double() / b).float()


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def ceil_log2(q: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(q))`` for positive normal float32 ``q``, read off its bits (int32)."""
    bits = q.contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    return exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """``2**e`` as float32 for int32 ``e`` in [-126, 127], built from its bits."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def normalize_and_rope(
    k: torch.Tensor,
    group_pos: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
) -> torch.Tensor:
    """RMS-normalise rows of ``k`` ([n, 128]) and rotate dims 64..127 at ``group_pos``.

    ``k`` may be bf16, float32 or float16: it is first rounded to bf16 (round to nearest
    even), as ``k.to(torch.bfloat16)`` does. Returns float32 [n, 128]; every value is a
    bf16 number (or not finite).
    """
    k = round_to_bf16(k.float())
    sum_sq = pair_tree_sum(k * k)
    eps = torch.full_like(sum_sq, rms_norm_eps)  # eps as float32, added in float32
    inv_rms = _div_rn(torch.ones_like(sum_sq), _sqrt_rn(sum_sq * (1.0 / HEAD_DIM) + eps))
    k = round_to_bf16(k * inv_rms[:, None] * rms_norm_weight.float()[None, :])

    cos_sin = cos_sin_cache[group_pos].float()
    cos, sin = cos_sin[:, : ROPE_DIM // 2], cos_sin[:, ROPE_DIM // 2 : ROPE_DIM]
    x, y = k[:, HEAD_DIM - ROPE_DIM :: 2], k[:, HEAD_DIM - ROPE_DIM + 1 :: 2]
    out = k.clone()
    out[:, HEAD_DIM - ROPE_DIM :: 2] = round_to_bf16(x * cos - y * sin)
    out[:, HEAD_DIM - ROPE_DIM + 1 :: 2] = round_to_bf16(y * cos + x * sin)
    return out


def quantize_fp8(k: torch.Tensor, mx_scales: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, 128] float32 -> (uint8 [n, 128] e4m3fn codes, uint8 [n, 4] scale bytes)."""
    amax = k.abs().amax(dim=1).clamp_min(FP8_AMAX_FLOOR)
    e = ceil_log2(_div_rn(amax, FP8_MAX))
    scaled = (k * pow2(-e)[:, None]).clamp(-FP8_MAX, FP8_MAX)
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    if mx_scales:
        scales = (e + UE8M0_BIAS).to(torch.uint8)[:, None].expand(-1, SCALE_BYTES).contiguous()
    else:
        # The fp32 scale's bytes, little-endian as on every GPU.
        scales = pow2(e).contiguous().view(torch.uint8).view(-1, SCALE_BYTES)
    return poison_nonfinite(k, codes, scales, fp32_scale=not mx_scales)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """E2M1 code (sign << 3 | magnitude index) of already-scaled float32 values."""
    a = x.abs()
    index = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
             + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())
    sign = (x.view(torch.int32) < 0).int()
    return (sign << 3) | index


def quantize_mxfp4(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, 128] float32 -> (uint8 [n, 64] packed E2M1 pairs, uint8 [n, 4] UE8M0 scales)."""
    groups = k.view(k.shape[0], HEAD_DIM // MXFP4_GROUP, MXFP4_GROUP)
    amax = groups.abs().amax(dim=2).clamp_min(MXFP4_AMAX_FLOOR)
    e = ceil_log2(_div_rn(amax, MXFP4_MAX)).clamp(-UE8M0_BIAS, UE8M0_BIAS)  # a UE8M0 byte: 0..254
    codes = e2m1_codes((groups * pow2(-e)[:, :, None]).reshape(k.shape[0], HEAD_DIM).contiguous())
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return poison_nonfinite(k, packed, (e + UE8M0_BIAS).to(torch.uint8), fp32_scale=False)


def poison_nonfinite(k: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, fp32_scale: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The bytes of each row of ``k`` with a NaN or an infinity: every value code zero and
    the scale NaN (the fp32 NaN ``0x7FC00000``, or the UE8M0 NaN ``0xFF`` in every scale
    byte), so that the key dequantizes to NaN wherever it is read. Other rows unchanged."""
    poisoned = ~k.isfinite().all(dim=1)
    if fp32_scale:
        nan = torch.tensor([FP32_NAN_BITS], dtype=torch.int32).view(torch.uint8)  # little-endian
    else:
        nan = torch.full((SCALE_BYTES,), UE8M0_NAN, dtype=torch.uint8)
    values = values.masked_fill(poisoned[:, None], 0)
    scales = torch.where(poisoned[:, None], nan.to(scales.device), scales)
    return values, scales


# --------------------------------------------------------------------------- paged bytes
def cache_bytes(k_cache: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of every byte ``k_cache`` spans (pages and their padding)."""
    num_blocks, block_size, row_bytes = k_cache.shape
    span = (num_blocks - 1) * k_cache.stride(0) + block_size * row_bytes if num_blocks else 0
    return k_cache.as_strided((span,), (1,))


def token_byte_offsets(
    k_cache: torch.Tensor, slots: torch.Tensor, use_fp4_cache: bool, layout_code: int, n_per_tile: int,
    d_per_tile: int = layout.MXFP4_D_PER_TILE, scale_lanes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets into ``cache_bytes(k_cache)`` of each slot's value bytes and scale bytes.

    ``n_per_tile``, ``d_per_tile`` and ``scale_lanes`` (None: ``64 // n_per_tile``) are the
    MXFP4 preshuffle's parameters, unused by the other layouts."""
    block_size = k_cache.shape[1]
    vb = layout.value_bytes(use_fp4_cache)
    if scale_lanes is None:
        scale_lanes = layout.default_scale_lanes(n_per_tile) if n_per_tile else 0
    tile = (n_per_tile, d_per_tile, scale_lanes)
    slots = slots.long()
    page = (slots // block_size) * k_cache.stride(0)
    p = (slots % block_size)[:, None]
    d = torch.arange(vb, device=slots.device)[None, :]
    i = torch.arange(SCALE_BYTES, device=slots.device)[None, :]
    values = page[:, None] + layout.value_offset(p, d, block_size, vb, layout_code, *tile)
    scales = page[:, None] + layout.scale_offset(p, i, block_size, vb, layout_code, *tile)
    return values, scales


# ------------------------------------------------------------------------------- store
def written_tokens(
    positions: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
    num_slots: int,
    max_pos: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the tokens that are written, and their group positions.

    A token is written iff its slot is in ``[0, num_slots)``, its position is not negative,
    it ends its group (``(pos + 1) % compress_ratio == 0``) and the group's position
    ``(pos // compress_ratio) * compress_ratio`` is a row of ``cos_sin_cache``.
    Out-of-range slots and positions are skipped rather than read or written.
    """
    num_tokens = kv_slot_mapping.numel()
    slots = kv_slot_mapping.reshape(-1).long()
    pos = positions.reshape(-1)[:num_tokens].long()
    group_pos = torch.div(pos, compress_ratio, rounding_mode="floor") * compress_ratio
    written = ((slots >= 0) & (slots < num_slots) & (pos >= 0)
               & ((pos + 1) % compress_ratio == 0) & (group_pos < max_pos))
    index = written.nonzero().squeeze(1)
    return index, group_pos[index]


def store(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
    use_fp4_cache: bool,
    *,
    mx_scales: bool,
    layout_code: int,
    n_per_tile: int,
    d_per_tile: int = layout.MXFP4_D_PER_TILE,
    scale_lanes: int | None = None,
) -> None:
    """The whole store, in torch. Arguments are assumed valid (the public API checks)."""
    num_blocks, block_size, _ = k_cache.shape
    index, group_pos = written_tokens(
        positions, kv_slot_mapping, compress_ratio, num_blocks * block_size, cos_sin_cache.shape[0]
    )
    if index.numel() == 0:
        return
    k = normalize_and_rope(k_pre[index], group_pos, cos_sin_cache, rms_norm_weight, rms_norm_eps)
    if use_fp4_cache:
        values, scales = quantize_mxfp4(k)
    else:
        values, scales = quantize_fp8(k, mx_scales)
    slots = kv_slot_mapping.reshape(-1)[index]
    value_at, scale_at = token_byte_offsets(k_cache, slots, use_fp4_cache, layout_code, n_per_tile,
                                            d_per_tile, scale_lanes)
    flat = cache_bytes(k_cache)
    flat[value_at.reshape(-1)] = values.reshape(-1)
    flat[scale_at.reshape(-1)] = scales.reshape(-1)


# ----------------------------------------------------------------------------- readers
def gather(
    k_cache: torch.Tensor, slots: torch.Tensor, use_fp4_cache: bool, layout_code: int, n_per_tile: int,
    d_per_tile: int = layout.MXFP4_D_PER_TILE, scale_lanes: int | None = None,
    check_bounds: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``i`` holds the value and scale bytes stored for ``slots[i]``, token-major. A slot
    outside the cache is an ``IndexError`` (``check_bounds``) or a row of zeros."""
    slots = slots.reshape(-1).long()
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    inside = None  # checked, every slot is inside: no mask to build
    if check_bounds:
        check_slots_in_range(slots, num_slots)
    else:
        inside = (slots >= 0) & (slots < num_slots)
        slots = torch.where(inside, slots, 0)
    value_at, scale_at = token_byte_offsets(k_cache, slots, use_fp4_cache, layout_code,
                                            n_per_tile, d_per_tile, scale_lanes)
    if inside is None:
        flat = cache_bytes(k_cache)
        return flat[value_at].contiguous(), flat[scale_at].contiguous()
    if num_slots == 0:  # nothing to read: every row is outside
        return (torch.zeros(value_at.shape, dtype=torch.uint8, device=k_cache.device),
                torch.zeros(scale_at.shape, dtype=torch.uint8, device=k_cache.device))
    flat = cache_bytes(k_cache)
    keep = inside[:, None]
    return (torch.where(keep, flat[value_at], 0).contiguous(),
            torch.where(keep, flat[scale_at], 0).contiguous())


def slots_of_sequences(
    block_table: torch.Tensor, cu_seq_lens: torch.Tensor, block_size: int,
    check_bounds: bool = True,
) -> torch.Tensor:
    """The slot of every token of every sequence, in ``cu_seq_lens`` order. A sequence
    longer than the block table's columns is an ``IndexError`` (``check_bounds``), or its
    tokens past them get slot -1 (outside every cache)."""
    cu = cu_seq_lens.reshape(-1).long()
    lengths = cu[1:] - cu[:-1]
    total = int(cu[-1]) if cu.numel() else 0
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths,
                                  output_size=total)
    i = torch.arange(total, device=cu.device) - cu[seq]
    blocks_needed = i // block_size
    columns = block_table.shape[1]
    if check_bounds and total and int(blocks_needed.max()) >= columns:
        raise IndexError(
            f"block_table has {columns} columns; a sequence needs "
            f"{int(blocks_needed.max()) + 1}"
        )
    if columns == 0:
        return torch.full((total,), -1, dtype=torch.int64, device=cu.device)
    # (Checked, every token's block is in the table: no mask to build.)
    column = blocks_needed if check_bounds else blocks_needed.clamp(max=columns - 1)
    # A block id past any cache keeps its slots past it (no int64 wrap-around into range).
    blocks = block_table.long()[seq, column].clamp(
        min=-1, max=torch.iinfo(torch.int64).max // block_size - 1)
    slots = blocks * block_size + i % block_size
    return slots if check_bounds else torch.where(blocks_needed < columns, slots, -1)


def decode_fp8(codes: torch.Tensor) -> torch.Tensor:
    return codes.contiguous().view(torch.float8_e4m3fn).float()


def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 64] packed pairs -> float32 [n, 128] E2M1 values (unscaled)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()  # n may be 0
    magnitude = table[codes & 0x7]
    return torch.where(codes >= 8, -magnitude, magnitude)


def ue8m0_to_float(scale_bytes: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> float32 ``2**(byte - 127)``; 0 is 2**-127, 255 is NaN."""
    b = scale_bytes.to(torch.int32)
    value = torch.where(b == 0, torch.full_like(b, 0x00400000), b << 23).view(torch.float32)
    return torch.where(b == UE8M0_NAN, torch.full_like(value, float("nan")), value)


def dequantize(values: torch.Tensor, scales: torch.Tensor, use_fp4_cache: bool, mx_scales: bool
               ) -> torch.Tensor:
    """Gathered bytes -> float32 [n, 128] keys."""
    n = values.shape[0]
    if use_fp4_cache:
        per_group = ue8m0_to_float(scales)  # [n, 4]
        groups = HEAD_DIM // MXFP4_GROUP
        return (decode_e2m1(values).view(n, groups, MXFP4_GROUP) * per_group[:, :, None]).view(n, HEAD_DIM)
    if mx_scales:
        scale = ue8m0_to_float(scales[:, 0])
    else:
        scale = scales.contiguous().view(torch.float32).reshape(n)
    return decode_fp8(values) * scale[:, None]
