"""Small helpers: building caches, launch sizes."""

from __future__ import annotations

import torch

from . import layout
from .checks import check_flag, check_int


def cache_row_bytes(use_fp4_cache: bool) -> int:
    """The last dimension of ``k_cache``: value bytes plus 4 scale bytes (132 for FP8, 68
    for MXFP4)."""
    check_flag("use_fp4_cache", use_fp4_cache)
    return layout.cache_row_bytes(use_fp4_cache)


def allocate_k_cache(
    num_blocks: int,
    block_size: int,
    use_fp4_cache: bool,
    device: torch.device | str = "cpu",
    page_bytes: int | None = None,
) -> torch.Tensor:
    """A zeroed uint8 cache ``[num_blocks, block_size, row_bytes]``.

    ``page_bytes`` (at least ``block_size * row_bytes``) pads every page: the result is
    then a strided view into ``[num_blocks, page_bytes]`` storage whose padding the
    store never touches.
    """
    check_int("num_blocks", num_blocks, at_least=0)
    check_int("block_size", block_size, at_least=1)
    check_int("page_bytes", page_bytes, allow_none=True)
    row = cache_row_bytes(use_fp4_cache)
    payload = block_size * row
    if page_bytes is None:
        page_bytes = payload
    if page_bytes < payload:
        raise ValueError(f"page_bytes: expected >= block_size * row_bytes = {payload}, got "
                         f"{page_bytes}")
    pages = torch.zeros((num_blocks, page_bytes), dtype=torch.uint8, device=device)
    return pages.as_strided((num_blocks, block_size, row), (page_bytes, row, 1))


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(n - 1, 0).bit_length()
