"""indexer-kcache: Triton kernels for DeepSeek V4.1's lightning-indexer key cache.

The store (``indexer_k_norm_rope_store``) normalises, rotates, quantizes (FP8 with fp32
or MX scales, or MXFP4) and writes the keys (bf16, or float32 / float16 rounded to bf16)
into the paged uint8 cache; the readers gather and dequantize them back. See ``layout``
for the cache format, and the README's support table for what has run where.
"""

from . import library  # noqa: F401  (registers the torch.library ops)
from .layout import cache_row_bytes
from .readers import dequantize_indexer_k, gather_indexer_k, gather_indexer_k_by_blocks
from .store import indexer_k_norm_rope_store
from .util import allocate_k_cache

__version__ = "0.1.0"

__all__ = [
    "allocate_k_cache",
    "cache_row_bytes",
    "dequantize_indexer_k",
    "gather_indexer_k",
    "gather_indexer_k_by_blocks",
    "indexer_k_norm_rope_store",
]
