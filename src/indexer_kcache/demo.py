"""The main job, end to end: a mixed serving batch stored, checked and read back.

``python -m indexer_kcache demo`` builds a decode step of 64 sequences plus a 2K-token
prefill chunk, stores it with every format and ``compress_ratio`` 1 and 2 into a paged
cache (block_size 64) on the best device there is, and once more with float32 keys (a
``wk`` GEMM's accumulator, rounded to bf16 as they are loaded), checks every byte against
the torch reference, dequantizes the written keys and reports their error.
"""

from __future__ import annotations

import time

import torch

from . import layout, reference
from .readers import dequantize_indexer_k
from .store import indexer_k_norm_rope_store

BLOCK_SIZE = 64
FORMATS = layout.FORMATS


def make_batch(compress_ratio: int, device, decode_seqs: int = 64, prefill_tokens: int = 2048,
               seed: int = 0) -> dict:
    """Decode tokens of ``decode_seqs`` sequences, then one prefill chunk, as one batch.

    Each sequence owns whole cache blocks (scrambled) for its compressed positions
    ``pos // compress_ratio``; every token carries the slot of its group, and only the
    group's last token writes it.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(100, 8000, (decode_seqs,), generator=g)
    prefill_start = int(torch.randint(0, 4000, (1,), generator=g))
    seq_positions = [lengths[i : i + 1] - 1 for i in range(decode_seqs)]
    seq_positions.append(prefill_start + torch.arange(prefill_tokens))
    max_pos = 16384
    blocks_per_seq = max_pos // compress_ratio // BLOCK_SIZE
    num_blocks = blocks_per_seq * (decode_seqs + 1)
    block_perm = torch.randperm(num_blocks, generator=g).view(decode_seqs + 1, blocks_per_seq)
    slots = []
    for seq, pos in enumerate(seq_positions):
        group = pos // compress_ratio
        slots.append(block_perm[seq, group // BLOCK_SIZE] * BLOCK_SIZE + group % BLOCK_SIZE)
    positions = torch.cat(seq_positions)
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float32),
                         10000.0 ** (-torch.arange(32) / 32))
    return dict(
        k_pre=(torch.randn(positions.numel(), layout.HEAD_DIM, generator=g) * 1.5).to(torch.bfloat16)
        .to(device),
        positions=positions.to(device),
        cos_sin_cache=torch.cat([angles.cos(), angles.sin()], 1).to(device),
        rms_norm_weight=(1 + 0.1 * torch.randn(layout.HEAD_DIM, generator=g)).to(torch.bfloat16)
        .to(device),
        rms_norm_eps=1e-6,
        kv_slot_mapping=torch.cat(slots).to(device),
        num_blocks=num_blocks,
    )


def run_case(fmt: str, compress_ratio: int, device, k_pre_dtype: torch.dtype = torch.bfloat16
             ) -> dict:
    fp4, mx = FORMATS[fmt]
    batch = make_batch(compress_ratio, device)
    num_blocks = batch.pop("num_blocks")
    if k_pre_dtype != torch.bfloat16:  # the bf16 keys nudged off its grid: the store rounds them back
        batch["k_pre"] = (batch["k_pre"].float() * (1 + 2.0**-10)).to(k_pre_dtype)
    caches = {}
    elapsed = 0.0
    for backend in ("fast", "reference"):
        cache = torch.full((num_blocks, BLOCK_SIZE, layout.cache_row_bytes(fp4)), 0xA5,
                           dtype=torch.uint8, device=device)
        args = (batch["k_pre"], batch["positions"], batch["cos_sin_cache"], batch["rms_norm_weight"],
                batch["rms_norm_eps"], cache, batch["kv_slot_mapping"], compress_ratio, fp4)
        if backend == "fast":
            if torch.device(device).type == "cuda":
                indexer_k_norm_rope_store(*args, mx_scales=mx)  # warm-up: compiles
                cache.fill_(0xA5)
            _sync(device)
            t0 = time.perf_counter()
            indexer_k_norm_rope_store(*args, mx_scales=mx)
            _sync(device)
            elapsed = time.perf_counter() - t0
        else:
            indexer_k_norm_rope_store(*args, mx_scales=mx, backend="reference")
        caches[backend] = cache
    pos = batch["positions"]
    written = ((pos + 1) % compress_ratio == 0).nonzero().squeeze(1)
    slots = batch["kv_slot_mapping"][written]
    group_pos = pos[written] // compress_ratio * compress_ratio
    keys = reference.normalize_and_rope(batch["k_pre"][written], group_pos, batch["cos_sin_cache"],
                                        batch["rms_norm_weight"], batch["rms_norm_eps"])
    error = (dequantize_indexer_k(caches["fast"], slots, fp4, mx_scales=mx) - keys).abs()
    return dict(format=fmt, keys=str(k_pre_dtype).removeprefix("torch."),
                compress_ratio=compress_ratio, tokens=pos.numel(),
                written=written.numel(), identical=torch.equal(caches["fast"], caches["reference"]),
                max_err=float(error.max()), mean_err=float(error.mean()),
                rel_err=float(error.norm() / keys.norm()), ms=elapsed * 1e3)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    from .kernels import INTERPRETED

    if torch.cuda.is_available():
        device, how = "cuda", f"Triton on {torch.cuda.get_device_name()}"
    elif INTERPRETED:
        device, how = "cpu", "Triton kernel under the CPU interpreter (no GPU found)"
    else:
        device, how = "cpu", "torch reference on the CPU (no GPU, TRITON_INTERPRET unset)"
    print(f"indexer K store demo: 64 decode tokens + a 2048-token prefill chunk, block_size "
          f"{BLOCK_SIZE}\nrunning: {how}\n")
    rows = [run_case(fmt, cr, device) for fmt in FORMATS for cr in (1, 2)]
    rows.append(run_case("mxfp4", 1, device, torch.float32))
    print(f"{'format':7} {'keys':8} {'cr':>2} {'tokens':>6} {'written':>7} {'bytes identical':>15} "
          f"{'max |err|':>9} {'mean |err|':>10} {'rel err':>8} {'time ms':>8}")
    for r in rows:
        print(f"{r['format']:7} {r['keys']:8} {r['compress_ratio']:>2} {r['tokens']:>6} {r['written']:>7} "
              f"{'yes' if r['identical'] else 'NO':>15} {r['max_err']:9.4f} {r['mean_err']:10.5f} "
              f"{r['rel_err']:8.4f} {r['ms']:8.2f}")
    ok = all(r["identical"] for r in rows)
    print("\nall bytes identical to the reference" if ok else "\nBYTES DIFFER FROM THE REFERENCE")
    return 0 if ok else 1
