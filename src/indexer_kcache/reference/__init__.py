"""Pure-torch references: the contract of every op, in code, on any device.

Written for clarity, not speed. The Triton kernels must write and read exactly the bytes
these functions do (the store, the readers and the top-k) or stay within a stated bound of
them (the scorer).

* ``cache``: the store and the readers (normalise, rotate, quantize, page offsets);
* ``logits``: the scorer, ``sum_h w_h * relu(q_h . K)`` over every cached key;
* ``topk``: the selection of the k highest-scoring positions per row.

The store's and the readers' functions are also names of this package
(``reference.store``); the scorer's and the top-k's live in their modules
(``reference.logits.paged_mqa_logits``, ``reference.topk.top_k_indices``).
"""

from . import logits, topk
from .cache import *  # noqa: F403
from .cache import __all__ as _cache_names

__all__ = [*_cache_names, "logits", "topk"]
