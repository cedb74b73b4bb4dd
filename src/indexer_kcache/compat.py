"""DeepGEMM-compatible entry points: switch an engine's scorer by changing an import.

::

    from indexer_kcache.compat import fp8_fp4_paged_mqa_logits, get_paged_mqa_logits_metadata

    schedule = get_paged_mqa_logits_metadata(context_lens, block_size, num_sms)
    logits = fp8_fp4_paged_mqa_logits((q_values, q_scales), kv_cache, weights, context_lens,
                                      block_tables, schedule, max_model_len, clean_logits=False)

The arguments are DeepGEMM's, in its order (``q, kv_cache, weights, context_lens,
block_table, schedule_meta, max_context_len, clean_logits, logits_dtype``) under the names
vLLM's wrapper gives them, so that both vLLM's call sites and calls written against DeepGEMM
itself (positional, or keywords from ``clean_logits`` on) run unchanged. DeepGEMM's
conventions are kept where they differ from ``paged_mqa_logits``:

* an FP8 cache holds MX scales (four UE8M0 bytes a key) when the queries come with scales,
  fp32 scales when they do not (DeepGEMM decides it so), whatever the platform default;
* a bare e4m3 ``q`` means unscaled queries, and packed MXFP4 queries may be int8 (DeepGEMM's
  dtype for them) as well as uint8;
* ``clean_logits`` defaults to False: the columns past a row's limit are not written;
* the result's rows are padded to a multiple of ``ROW_ALIGN`` columns (a view of the first
  ``max_model_len``), so that row starts stay 16-byte aligned whatever the width, as top-k
  kernels that read DeepGEMM's logits expect.

The work is done by ``indexer_kcache.logits.paged_mqa_logits`` on the cache's bytes as our
store writes them in DeepGEMM's row-major layout, on every platform (``shuffle=False``: a
cache stored in a ROCm layout is scored by ``paged_mqa_logits`` with its options).
"""

from __future__ import annotations

import re

import torch

from . import checks
from .logits import paged_mqa_logits

__all__ = ["fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata"]

# DeepGEMM's schedule: one (sequence, block) pair per SM boundary, plus the end.
_METADATA_COLUMNS = 2
ROW_ALIGN = 256  # columns: the result's row stride is a multiple of this
LOGITS_DTYPES = (torch.float32, torch.bfloat16)
Query = torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]  # (values, scales or None)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_size: int,
                                  num_sms: int, indices: torch.Tensor | None = None
                                  ) -> torch.Tensor:
    """A placeholder for DeepGEMM's work split: int32 zeros ``[num_sms + 1, 2]`` on the
    device of ``context_lens``.

    DeepGEMM's kernel reads its split of the work across SMs from this tensor. Ours does
    not need one: it splits each sequence's positions over programs by shape alone (see
    ``logits.logits_settings``), so nothing is computed here and the host never waits.
    The tensor only keeps call sites that build and pass it working unchanged.
    ``indices`` (DeepGEMM's variable-length decode) is not supported: it must be None.
    """
    if indices is not None:
        checks.fail_unsupported("indices", "None", checks.type_name(indices))
    checks.check_dtype("context_lens", context_lens, checks.INDEX_DTYPES)
    checks.check_int("block_size", block_size, at_least=1)
    checks.check_int("num_sms", num_sms, at_least=1)
    return torch.zeros(num_sms + 1, _METADATA_COLUMNS, dtype=torch.int32,
                       device=context_lens.device)


def _packed_as_uint8(values: object) -> object:
    """DeepGEMM's packed-FP4 dtype, int8, as the same bytes in ours (uint8)."""
    if isinstance(values, torch.Tensor) and values.dtype == torch.int8:
        return values.view(torch.uint8)
    return values


def _deepgemm_query(q: object) -> tuple[object, bool]:
    """(``q`` as ``paged_mqa_logits`` takes it, whether an FP8 cache has MX scales)."""
    if isinstance(q, torch.Tensor):
        # DeepGEMM reads a bare tensor as (q, None); a bf16 one is ours to score as is.
        return (q if q.dtype == torch.bfloat16 else (_packed_as_uint8(q), None)), False
    if isinstance(q, (tuple, list)) and len(q) == 2:
        values, scales = q
        return (_packed_as_uint8(values), scales), scales is not None
    return q, False  # paged_mqa_logits names what is wrong with it


def fp8_fp4_paged_mqa_logits(
    q: Query,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor | None,
    max_model_len: int,
    clean_logits: bool = False,
    logits_dtype: torch.dtype = torch.float32,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepGEMM's paged MQA logits, with its arguments.

    Args:
        q: ``(values, scales or None)``: e4m3 ``[B, next_n, H, 128]``, or packed MXFP4
            uint8 or int8 ``[B, next_n, H, 64]`` with int32 scales ``[B, next_n, H]``
            (four UE8M0 bytes); a bare e4m3 tensor is ``(q, None)``. A bf16 tensor is
            accepted too.
        kv_cache: uint8 ``[num_blocks, block_size, 1, 132 | 68]`` (or without the unit
            axis). An FP8 cache's scales are MX (UE8M0) when ``q`` has scales, fp32 when
            it has none.
        weights: ``[B * next_n, H]``, fp32 or bf16.
        context_lens: int32 ``[B]`` or ``[B, next_n]``.
        block_tables: int32 ``[B, max_blocks]``.
        schedule_metadata: ignored (see ``get_paged_mqa_logits_metadata``).
        max_model_len: the width of the result.
        clean_logits: write ``-inf`` past each row's limit (default: leave those columns
            unwritten, as DeepGEMM does).
        logits_dtype: ``torch.float32`` or ``torch.bfloat16`` (scored in float32, then
            rounded: one more pass over the logits).
        indices: DeepGEMM's variable-length decode; not supported (must be None).

    Returns:
        ``logits_dtype`` ``[B * next_n, max_model_len]``, its rows padded to a multiple of
        ``ROW_ALIGN`` columns.
    """
    if indices is not None:
        checks.fail_unsupported("indices", "None", checks.type_name(indices))
    if schedule_metadata is not None and not isinstance(schedule_metadata, torch.Tensor):
        checks.fail_type("schedule_metadata", "a torch.Tensor or None",
                         checks.type_name(schedule_metadata))
    checks.check_flag("clean_logits", clean_logits)
    if not isinstance(logits_dtype, torch.dtype):
        checks.fail_type("logits_dtype", "a torch.dtype", checks.type_name(logits_dtype))
    if logits_dtype not in LOGITS_DTYPES:
        checks.fail_value("logits_dtype", "torch.float32 or torch.bfloat16", logits_dtype)
    q, mx_scales = _deepgemm_query(q)
    rows = _result_rows(q, weights)
    out = None
    if rows is not None:  # else paged_mqa_logits names what is wrong
        checks.check_int("max_model_len", max_model_len, at_least=0,
                         at_most=checks.MAX_COLUMNS)
        out = _padded_rows(rows, max_model_len, torch.float32, weights.device)
    try:
        logits = paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                  max_model_len, mx_scales=mx_scales, shuffle=False,
                                  clean_logits=clean_logits, out=out)
    except (TypeError, ValueError, NotImplementedError) as error:
        raise _with_deepgemm_names(error) from None
    if logits_dtype == torch.float32:
        return logits
    rounded = _padded_rows(logits.shape[0], logits.shape[1], logits_dtype, logits.device)
    return rounded.copy_(logits)


# paged_mqa_logits's names for the arguments this module names as DeepGEMM does.
_DEEPGEMM_NAMES = {"k_cache": "kv_cache", "block_table": "block_tables"}
_OUR_NAMES = re.compile(r"\b(" + "|".join(_DEEPGEMM_NAMES) + r")\b")


def _with_deepgemm_names(error: Exception) -> Exception:
    """``error`` again, its message naming the arguments as the caller passed them."""
    return type(error)(_OUR_NAMES.sub(lambda m: _DEEPGEMM_NAMES[m.group(1)], str(error)))


def _result_rows(q: object, weights: object) -> int | None:
    """``B * next_n`` where ``q``'s values and ``weights`` agree on it, else None."""
    values = q if isinstance(q, torch.Tensor) else q[0] if isinstance(q, tuple) else None
    if not (isinstance(values, torch.Tensor) and values.dim() == 4
            and isinstance(weights, torch.Tensor) and weights.dim() == 2):
        return None
    rows = values.shape[0] * values.shape[1]
    return rows if weights.shape[0] == rows else None


def _padded_rows(rows: int, width: int, dtype: torch.dtype, device: torch.device
                 ) -> torch.Tensor:
    """A ``[rows, width]`` view of rows padded to a multiple of ``ROW_ALIGN`` columns."""
    padded = -(-width // ROW_ALIGN) * ROW_ALIGN
    return torch.empty(rows, padded, dtype=dtype, device=device)[:, :width]


def fp8_paged_mqa_logits(q: Query, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_tables: torch.Tensor,
                         schedule_metadata: torch.Tensor | None, max_model_len: int,
                         clean_logits: bool = False) -> torch.Tensor:
    """DeepGEMM's earlier name and signature for FP8 caches (e4m3 ``q``, float32 logits):
    ``fp8_fp4_paged_mqa_logits`` without ``logits_dtype`` and ``indices``."""
    return fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                    schedule_metadata, max_model_len, clean_logits)
