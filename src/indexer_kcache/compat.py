"""DeepGEMM-compatible entry points: switch an engine's scorer by changing an import.

::

    from indexer_kcache.compat import fp8_fp4_paged_mqa_logits, get_paged_mqa_logits_metadata

    schedule = get_paged_mqa_logits_metadata(context_lens, block_size, num_sms)
    logits = fp8_fp4_paged_mqa_logits((q_values, q_scales), kv_cache, weights, context_lens,
                                      block_tables, schedule, max_model_len)

The arguments and the result are those of DeepGEMM's functions as vLLM calls them; the
work is done by ``indexer_kcache.logits.paged_mqa_logits`` on the cache's bytes as our
store writes them (row-major layout, FP8 scales as the platform default).
"""

from __future__ import annotations

import torch

from . import checks
from .logits import paged_mqa_logits

__all__ = ["fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata"]

# DeepGEMM's schedule: one (sequence, block) pair per SM boundary, plus the end.
_METADATA_COLUMNS = 2


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_size: int,
                                  num_sms: int) -> torch.Tensor:
    """A placeholder for DeepGEMM's work split: int32 zeros ``[num_sms + 1, 2]`` on the
    device of ``context_lens``.

    DeepGEMM's kernel reads its split of the work across SMs from this tensor. Ours does
    not need one: it splits each sequence's positions over programs by shape alone (see
    ``logits.logits_settings``), so nothing is computed here and the host never waits.
    The tensor only keeps call sites that build and pass it working unchanged.
    """
    checks.check_dtype("context_lens", context_lens, checks.INDEX_DTYPES)
    checks.check_int("block_size", block_size, at_least=1)
    checks.check_int("num_sms", num_sms, at_least=1)
    return torch.zeros(num_sms + 1, _METADATA_COLUMNS, dtype=torch.int32,
                       device=context_lens.device)


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor | None,
    max_model_len: int,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepGEMM's paged MQA logits, with its arguments.

    Args:
        q: ``(values, scales or None)``: e4m3 ``[B, next_n, H, 128]``, or packed MXFP4
            uint8 ``[B, next_n, H, 64]`` with int32 scales ``[B, next_n, H]`` (four UE8M0
            bytes). A bf16 tensor is accepted too.
        kv_cache: uint8 ``[num_blocks, block_size, 1, 132 | 68]`` (or without the unit axis).
        weights: ``[B * next_n, H]``, fp32 or bf16.
        context_lens: int32 ``[B]`` or ``[B, next_n]``.
        block_tables: int32 ``[B, max_blocks]``.
        schedule_metadata: ignored (see ``get_paged_mqa_logits_metadata``).
        max_model_len: the width of the result.
        indices: not supported (must be None).

    Returns:
        float32 ``[B * next_n, max_model_len]``. As with DeepGEMM, the columns past a
        row's context are not written (``clean_logits=False``).
    """
    if indices is not None:
        checks.fail_unsupported("indices", "None", checks.type_name(indices))
    if schedule_metadata is not None and not isinstance(schedule_metadata, torch.Tensor):
        checks.fail_type("schedule_metadata", "a torch.Tensor or None",
                         checks.type_name(schedule_metadata))
    return paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len,
                            clean_logits=False)
