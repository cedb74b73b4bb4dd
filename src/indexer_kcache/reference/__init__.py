"""Pure-torch references: the contract of every op, in code, on any device.

Written for clarity, not speed. The Triton kernels must write and read exactly the bytes
these functions do (the store, the readers and the top-k) or stay within a stated bound of
them (the scorer).

* ``cache``: the store and the readers (normalise, rotate, quantize, page offsets).
"""

from .cache import *  # noqa: F403
from .cache import __all__ as _cache_names

__all__ = list(_cache_names)
