"""indexer-kcache: Triton kernels for DeepSeek V4.1's lightning-indexer key cache.

The store (``indexer_k_norm_rope_store``) normalises, rotates, quantizes (FP8 with fp32
or MX scales, or MXFP4) and writes the keys (bf16, or float32 / float16 rounded to bf16)
into the paged uint8 cache; the readers gather and dequantize them back; the scorer
(``paged_mqa_logits``) scores query rows against every cached key in place, and
``top_k_indices`` picks each row's best positions. See ``layout`` for the cache format,
``compat`` for DeepGEMM-style entry points, and the README's support table for what has
run where. Every op is also a ``torch.library`` op of the ``indexer_kcache`` namespace
(``launcher`` declares them).
"""

from . import compat
from .logits import paged_mqa_logits
from .readers import dequantize_indexer_k, gather_indexer_k, gather_indexer_k_by_blocks
from .reference.logits import lengths_from_context
from .store import indexer_k_norm_rope_store
from .topk import top_k_indices
from .util import allocate_k_cache, cache_row_bytes

__version__ = "0.1.0"

__all__ = [
    "allocate_k_cache",
    "cache_row_bytes",
    "compat",
    "dequantize_indexer_k",
    "gather_indexer_k",
    "gather_indexer_k_by_blocks",
    "indexer_k_norm_rope_store",
    "lengths_from_context",
    "paged_mqa_logits",
    "top_k_indices",
]
