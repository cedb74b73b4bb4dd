"""The scorer in pure torch: paged MQA logits, computed from the cache's bytes.

For query row ``r = b * next_n + i`` (query ``i`` of sequence ``b``) and position ``t``::

    logits[r, t] = sum_h weights[r, h] * relu(q[b, i, h, :] . K[b, t, :])

``q`` and ``K`` are the dequantized values (every scale applied) and ``K[b, t]`` is the key
stored at row ``t % block_size`` of block ``block_table[b, t // block_size]``. A row sees
the positions below its limit (``lengths_from_context``); a position whose block id lies outside
``[0, num_blocks)`` scores ``-inf``; the columns past the limit are ``-inf`` when
``clean_logits``, left as they were otherwise.

Written for clarity: the keys of every sequence are gathered and dequantized through the
readers' functions (``cache.token_byte_offsets``, ``cache.dequantize``) and the products
are summed in float64. The Triton kernel must stay within a stated bound of it.
"""

from __future__ import annotations

import torch

from ..checks import INDEX_DTYPES, check_dtype, check_int, fail_value
from ..layout import HEAD_DIM, MXFP4_D_PER_TILE, MXFP4_GROUP
from .cache import cache_bytes, decode_e2m1, dequantize, token_byte_offsets, ue8m0_to_float

INT32_MAX = 2**31 - 1

__all__ = [
    "lengths_from_context",
    "q_scale_bytes",
    "dequantize_q",
    "sequence_keys",
    "paged_mqa_logits",
]


def lengths_from_context(context_lens: torch.Tensor, next_n: int, num_cols: int) -> torch.Tensor:
    """Per-row lengths of the scorer's logits: int32 ``[B * next_n]``, row ``b * next_n + i``
    for query ``i`` of sequence ``b``.

    With ``context_lens`` of shape ``[B]`` (speculative decoding with ``next_n`` queries per
    sequence), query ``i`` sees the positions ``t < context_lens[b] - next_n + i + 1``; with
    shape ``[B, next_n]`` it sees ``t < context_lens[b, i]``. Lengths are clamped to
    ``[0, num_cols]`` (the logits' width).
    """
    check_int("next_n", next_n, at_least=1)
    check_int("num_cols", num_cols, at_least=0)
    if num_cols > INT32_MAX:
        fail_value("num_cols", f"<= {INT32_MAX} (the lengths are int32)", num_cols)
    check_dtype("context_lens", context_lens, INDEX_DTYPES)
    if context_lens.dim() not in (1, 2) or (context_lens.dim() == 2
                                            and context_lens.shape[1] != next_n):
        fail_value("context_lens", f"shape [B] or [B, next_n = {next_n}]",
                   f"shape {tuple(context_lens.shape)}")
    lens = context_lens.to(torch.int64)
    if lens.dim() == 1:
        query = torch.arange(next_n, device=lens.device)
        # Clamped first: an int64 context near its minimum must not wrap around.
        lens = lens.clamp_min(0)[:, None] - next_n + query[None, :] + 1
    return lens.reshape(-1).clamp(0, num_cols).to(torch.int32)


def q_scale_bytes(scales: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., H]`` query scales -> their four UE8M0 bytes ``[..., H, 4]`` (int64);
    byte ``j`` (little-endian) scales dims ``32 j .. 32 j + 31``."""
    shifts = torch.arange(4, device=scales.device) * 8
    return (scales.to(torch.int64)[..., None] >> shifts) & 0xFF


def dequantize_q(q: torch.Tensor | tuple) -> torch.Tensor:
    """The queries as float32 ``[B, next_n, H, 128]``.

    ``q`` is a bf16 tensor ``[B, next_n, H, 128]`` or a pair ``(values, scales)``: e4m3
    values ``[B, next_n, H, 128]`` or packed MXFP4 values (uint8 ``[B, next_n, H, 64]``,
    element ``2i`` in the low nibble), and ``None`` or int32 UE8M0 scales ``[B, next_n, H]``.
    """
    if isinstance(q, torch.Tensor):
        return q.float()
    values, scales = q
    if values.dtype == torch.uint8:  # MXFP4: two E2M1 codes a byte
        flat = values.reshape(-1, values.shape[-1])
        x = decode_e2m1(flat).reshape(*values.shape[:-1], HEAD_DIM)
    else:
        x = values.float()
    if scales is None:
        return x
    factor = ue8m0_to_float(q_scale_bytes(scales))  # [B, next_n, H, 4]
    return x * factor.repeat_interleave(MXFP4_GROUP, dim=-1)


def sequence_keys(k_cache: torch.Tensor, block_table: torch.Tensor, num_cols: int,
                  use_fp4_cache: bool, mx_scales: bool, layout_code: int, n_per_tile: int,
                  d_per_tile: int = MXFP4_D_PER_TILE, scale_lanes: int | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The dequantized keys of positions ``0 .. num_cols - 1`` of every sequence:
    ``(keys float32 [B, num_cols, 128], readable bool [B, num_cols])``. Positions whose
    block id is outside ``[0, num_blocks)`` are not read: their keys are zeros and
    ``readable`` is false."""
    num_blocks, block_size, _ = k_cache.shape
    batch = block_table.shape[0]
    t = torch.arange(num_cols, device=block_table.device)
    blocks = block_table.long()[:, t // block_size]  # [B, num_cols]
    readable = (blocks >= 0) & (blocks < num_blocks)
    slots = torch.where(readable, blocks * block_size + t % block_size, 0).reshape(-1)
    keys = torch.zeros(batch * num_cols, HEAD_DIM, dtype=torch.float32, device=k_cache.device)
    if num_blocks and slots.numel():
        value_at, scale_at = token_byte_offsets(k_cache, slots, use_fp4_cache, layout_code,
                                                n_per_tile, d_per_tile, scale_lanes)
        flat = cache_bytes(k_cache)
        keys = dequantize(flat[value_at], flat[scale_at], use_fp4_cache, mx_scales)
        keys = torch.where(readable.reshape(-1, 1).to(keys.device), keys, 0.0)
    return keys.reshape(batch, num_cols, HEAD_DIM), readable


def paged_mqa_logits(
    q: torch.Tensor | tuple,
    k_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
    *,
    use_fp4_cache: bool,
    mx_scales: bool,
    layout_code: int,
    n_per_tile: int,
    d_per_tile: int = MXFP4_D_PER_TILE,
    scale_lanes: int | None = None,
    clean_logits: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scorer, in torch. Arguments are assumed valid (the public API checks them);
    ``k_cache`` is 3-d ``[num_blocks, block_size, row_bytes]``.

    Returns float32 ``[B * next_n, max_model_len]`` (``out`` when given, written in place).
    """
    qf = dequantize_q(q)
    batch, next_n, _, _ = qf.shape
    rows = batch * next_n
    max_blocks = block_table.shape[1]
    block_size = k_cache.shape[1]
    num_cols = min(max_model_len, max_blocks * block_size)
    if out is None:
        out = torch.empty(rows, max_model_len, dtype=torch.float32, device=weights.device)
        clean_logits = True  # a new tensor has no columns to leave as they were
    limits = lengths_from_context(context_lens, next_n, num_cols).long()
    keys, readable = sequence_keys(k_cache, block_table, num_cols, use_fp4_cache, mx_scales,
                                   layout_code, n_per_tile, d_per_tile, scale_lanes)
    # [B, next_n, H, 128] x [B, num_cols, 128] -> [B, next_n, num_cols, H], in float64.
    dots = torch.einsum("bihd,btd->bith", qf.double(), keys.double())
    w = weights.double().reshape(batch, next_n, 1, -1)
    scores = (w * torch.relu(dots)).sum(-1).reshape(rows, num_cols)
    scores = torch.where(readable.repeat_interleave(next_n, dim=0), scores, float("-inf"))

    column = torch.arange(max_model_len, device=out.device)
    seen = column[None, :] < limits.to(out.device)[:, None]  # [rows, max_model_len]
    full = torch.full((rows, max_model_len), float("-inf"), dtype=torch.float64,
                      device=out.device)
    full[:, :num_cols] = scores.to(out.device)
    result = torch.where(seen, full, float("-inf")).float()
    if clean_logits:
        out.copy_(result)
    else:
        out.copy_(torch.where(seen, result, out))
    return out
