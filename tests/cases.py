"""Building test inputs: random keys, scrambled slots, padded pages full of sentinel bytes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import indexer_kcache as ik
from indexer_kcache import layout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 0xA5
PAGE_PAD = 24  # bytes of padding after each page's payload


@dataclass
class StoreCase:
    k_pre: torch.Tensor
    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    weight: torch.Tensor
    eps: float
    slots: torch.Tensor
    compress_ratio: int
    use_fp4_cache: bool
    num_blocks: int
    block_size: int
    page_bytes: int

    def new_cache(self) -> torch.Tensor:
        """A padded cache whose every byte (pad included) holds the sentinel."""
        cache = ik.allocate_k_cache(self.num_blocks, self.block_size, self.use_fp4_cache,
                                    device=self.k_pre.device, page_bytes=self.page_bytes)
        pages(cache).fill_(SENTINEL)
        return cache

    def args(self, cache: torch.Tensor) -> tuple:
        return (self.k_pre, self.positions, self.cos_sin_cache, self.weight, self.eps, cache,
                self.slots, self.compress_ratio, self.use_fp4_cache)


def slots_by_blocks(block_table: torch.Tensor, lengths: list[int], block_size: int) -> torch.Tensor:
    """The slots of sequence ``b``'s first ``lengths[b]`` tokens through ``block_table``, on the
    host, in sequence order: the readers' by-blocks rows, written apart from the library."""
    table = block_table.cpu().long()
    return torch.cat([table[b, torch.arange(n) // block_size] * block_size
                      + torch.arange(n) % block_size for b, n in enumerate(lengths)])


def pages(cache: torch.Tensor) -> torch.Tensor:
    """All bytes of a cache made by ``StoreCase.new_cache``: [num_blocks, page_bytes]."""
    return cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))


def make_case(
    num_tokens: int = 29,
    *,
    use_fp4_cache: bool = False,
    compress_ratio: int = 1,
    block_size: int = 16,
    num_blocks: int | None = None,
    skip_every: int = 4,
    cos_sin_dtype: torch.dtype = torch.float32,
    weight_dtype: torch.dtype = torch.bfloat16,
    index_dtype: torch.dtype = torch.int64,
    k_row_stride: int = 192,
    cos_sin_row_stride: int = 80,
    extra_rows: int = 3,
    max_pos: int = 300,
    scale: float = 3.0,
    page_pad: int = PAGE_PAD,
    device: str = DEVICE,
    generator: torch.Generator | None = None,
) -> StoreCase:
    """Fresh random inputs. Rows of skipped tokens (slot -1 or not a group end) hold NaN.

    ``k_pre`` and ``cos_sin_cache`` are strided views with wide rows; ``k_pre`` and
    ``positions`` have ``extra_rows`` rows past the tokens, as under CUDA-graph padding.
    """
    g = generator or torch.Generator().manual_seed(torch.seed() % 2**31)
    if num_blocks is None:
        num_blocks = max(2, -(-2 * num_tokens // block_size))
    rows = num_tokens + extra_rows
    k_store = (torch.randn(rows, k_row_stride, generator=g) * scale).to(torch.bfloat16)
    # Vary the magnitude per token so the scales span many exponents.
    k_store *= torch.exp2(torch.randint(-6, 7, (rows, 1), generator=g)).to(torch.bfloat16)
    k_store = k_store.to(device)
    k_pre = k_store[:, :layout.HEAD_DIM]
    positions = torch.randint(0, max_pos, (rows,), generator=g)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    if skip_every:
        slots[torch.randperm(num_tokens, generator=g)[: num_tokens // skip_every]] = -1
    skipped = (slots < 0) | ((positions[:num_tokens] + 1) % compress_ratio != 0)
    k_pre[:num_tokens][skipped.to(device)] = float("nan")
    k_pre[num_tokens:] = float("nan")
    pairs = layout.ROPE_DIM // 2
    angles = torch.rand(max_pos, pairs, generator=g) * 6.3
    cs_store = torch.randn(max_pos, cos_sin_row_stride, generator=g)
    cs_store[:, :pairs], cs_store[:, pairs:2 * pairs] = angles.cos(), angles.sin()
    cos_sin = cs_store.to(cos_sin_dtype).to(device)[:, :layout.ROPE_DIM]
    weight = (1 + 0.2 * torch.randn(layout.HEAD_DIM, generator=g)).to(weight_dtype)
    row = ik.cache_row_bytes(use_fp4_cache)
    return StoreCase(
        k_pre=k_pre, positions=positions.to(index_dtype).to(device),
        cos_sin_cache=cos_sin, weight=weight.to(device), eps=1e-6,
        slots=slots.to(index_dtype).to(device), compress_ratio=compress_ratio,
        use_fp4_cache=use_fp4_cache, num_blocks=num_blocks, block_size=block_size,
        page_bytes=block_size * row + page_pad,
    )


def every_bf16_up_to_6() -> torch.Tensor:
    """Every non-negative bf16 value up to 6 (each E2M1 threshold, tie and neighbour among
    them), as float32."""
    return torch.arange(0, 0x40C1, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()


def scaled_e2m1_pairs(g: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs of scaled values for an E2M1 byte: every bf16 value in [-6, 6], and those of
    at least 1 scaled down to float32's subnormals, each with a shuffled partner."""
    x = every_bf16_up_to_6()
    big = x[x.abs() >= 1]
    x = torch.cat([x, big * torch.exp2(-torch.randint(0, 150, (big.numel(),), generator=g).float())])
    x = torch.cat([x, -x])
    return x, x[torch.randperm(x.numel(), generator=g)]


def unscaled_e2m1_keys(g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """What the store hands its E2M1 encode: bf16 keys x, y and their group's exponent e,
    |x|, |y| <= 6 * 2**e: every bf16 value v in [-6, 6], and a shuffled partner, times 2**e
    for random e in -126..126, then each value below 4 at both extremes, rounded to bf16 as
    keys are (those below bf16's normal range lose bits: the reference scales what is
    stored; 2**126 times more than 4 is no bf16 value). Returns (x, y, e, the E2M1 bytes
    of x / 2**e and y / 2**e by the reference)."""
    from indexer_kcache import reference

    v = every_bf16_up_to_6()
    v = torch.cat([v, -v])
    e = torch.randint(-126, 127, (v.numel(),), dtype=torch.int32, generator=g)
    below_4 = v[v.abs() < 4]
    v = torch.cat([v, below_4, below_4])
    e = torch.cat([e, torch.full_like(below_4, -126, dtype=torch.int32),
                   torch.full_like(below_4, 126, dtype=torch.int32)])
    scale = torch.exp2(e.double())
    x = (v.double() * scale).to(torch.bfloat16).float()
    y = (v[torch.randperm(v.numel(), generator=g)].double() * scale).to(torch.bfloat16).float()
    keys = x.isfinite() & y.isfinite()
    x, y, e, scale = x[keys], y[keys], e[keys], scale[keys]
    want = (reference.e2m1_codes((x.double() / scale).float())
            | (reference.e2m1_codes((y.double() / scale).float()) << 4))
    return x, y, e, want.to(torch.uint8)
