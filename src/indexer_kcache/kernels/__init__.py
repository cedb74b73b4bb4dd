"""Triton kernels. Each launcher module picks settings; each kernel module only computes."""

from triton.runtime.interpreter import InterpretedFunction

from .gather import gather_indexer_k_kernel
from .store import indexer_k_store_kernel

# ``triton.jit`` reads TRITON_INTERPRET when a kernel is defined, so this is fixed at import.
INTERPRETED = isinstance(indexer_k_store_kernel, InterpretedFunction)

__all__ = ["INTERPRETED", "gather_indexer_k_kernel", "indexer_k_store_kernel"]
