"""The main job, end to end: a mixed serving batch stored, checked and read back.

``python -m indexer_kcache demo`` builds a decode step of 64 sequences plus a 2K-token
prefill chunk, stores it with every format and ``compress_ratio`` 1 and 2 into a paged
cache (block_size 64) on the best device there is, and once more with float32 keys (a
``wk`` GEMM's accumulator, rounded to bf16 as they are loaded), checks every byte against
the torch reference, dequantizes the written keys and reports their error. Then, in every
format, it scores a decode batch against a cache of long sequences in place, picks each
row's top-2048 positions, and reports the logits' error against float64 and how many of
the float64 top-2048 each format keeps.
"""

from __future__ import annotations

import time

import torch

from . import layout, reference
from .logits import paged_mqa_logits
from .readers import dequantize_indexer_k
from .store import indexer_k_norm_rope_store
from .topk import top_k_indices

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
    import argparse

    from .kernels import INTERPRETED

    argparse.ArgumentParser(
        prog="python -m indexer_kcache demo",
        description="Store a realistic batch in every format (and float32 keys), check its "
                    "bytes against the reference, read it back, score it and pick its top-k. "
                    "No options.").parse_args(argv)

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
    print_scoring([run_scoring(fmt, device) for fmt in FORMATS])
    return 0 if ok else 1


# ----------------------------------------------------------------------------- scoring
SCORE_SEQS, SCORE_CONTEXT, SCORE_HEADS, TOP_K = 2, 4096, 64, 2048


def run_scoring(fmt: str, device, seed: int = 1) -> dict:
    """Store ``SCORE_SEQS`` sequences of ``SCORE_CONTEXT`` keys in ``fmt``, score one decode
    query per sequence against the cache in place, pick each row's top-2048, and compare
    with float64 logits of the unquantized keys."""
    fp4, mx = FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    tokens = SCORE_SEQS * SCORE_CONTEXT
    blocks_per_seq = SCORE_CONTEXT // BLOCK_SIZE
    num_blocks = SCORE_SEQS * blocks_per_seq
    block_table = torch.randperm(num_blocks, generator=g).view(SCORE_SEQS, blocks_per_seq)
    t = torch.arange(SCORE_CONTEXT)
    slots = (block_table[:, t // BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE).reshape(-1)
    positions = t.repeat(SCORE_SEQS)
    angles = torch.outer(torch.arange(SCORE_CONTEXT, dtype=torch.float32),
                         10000.0 ** (-torch.arange(32) / 32))
    k_pre = (torch.randn(tokens, 128, generator=g) * 1.5).to(torch.bfloat16)
    cos_sin = torch.cat([angles.cos(), angles.sin()], 1)
    weight = (1 + 0.1 * torch.randn(128, generator=g)).to(torch.bfloat16)
    cache = torch.full((num_blocks, BLOCK_SIZE, layout.cache_row_bytes(fp4)), 0xA5,
                       dtype=torch.uint8, device=device)
    indexer_k_norm_rope_store(k_pre.to(device), positions.to(device), cos_sin.to(device),
                              weight.to(device), 1e-6, cache, slots.to(device), 1, fp4,
                              mx_scales=mx)
    q = torch.randn(SCORE_SEQS, 1, SCORE_HEADS, 128, generator=g).to(torch.bfloat16)
    weights = torch.randn(SCORE_SEQS, SCORE_HEADS, generator=g) / SCORE_HEADS
    context_lens = torch.full((SCORE_SEQS,), SCORE_CONTEXT, dtype=torch.int32)
    args = (q.to(device), cache, weights.to(device), context_lens.to(device),
            block_table.to(torch.int32).to(device), SCORE_CONTEXT)
    if torch.device(device).type == "cuda":
        top_k_indices(paged_mqa_logits(*args, mx_scales=mx), TOP_K)  # warm-up: compiles
    _sync(device)
    t0 = time.perf_counter()
    logits = paged_mqa_logits(*args, mx_scales=mx)
    picked = top_k_indices(logits, TOP_K)
    _sync(device)
    elapsed = time.perf_counter() - t0
    # float64 of the keys before quantization (normalised, rotated, bf16 values).
    keys = reference.normalize_and_rope(k_pre, positions, cos_sin, weight, 1e-6).double()
    keys = keys.view(SCORE_SEQS, SCORE_CONTEXT, 128)
    scores = torch.einsum("bhd,btd->bht", q[:, 0].double(), keys)
    want = (torch.relu(scores) * weights.double()[:, :, None]).sum(1)
    got = logits.double().cpu()
    kept = [len(set(picked[b].tolist()) & set(want[b].topk(TOP_K).indices.tolist()))
            for b in range(SCORE_SEQS)]
    return dict(format=fmt, keys=tokens, rel_err=float((got - want).norm() / want.norm()),
                max_err=float((got - want).abs().max()), kept=sum(kept) / len(kept),
                ms=elapsed * 1e3)


def print_scoring(rows: list[dict]) -> None:
    print(f"\nscoring: {SCORE_SEQS} decode rows x {SCORE_CONTEXT} cached keys, "
          f"{SCORE_HEADS} heads, bf16 queries; top-{TOP_K} per row\n")
    print(f"{'format':7} {'keys':>6} {'rel err vs float64':>18} {'max |err|':>10} "
          f"{f'top-{TOP_K} kept':>14} {'time ms':>8}")
    for r in rows:
        print(f"{r['format']:7} {r['keys']:>6} {r['rel_err']:18.4f} {r['max_err']:10.4f} "
              f"{r['kept']:>9.0f}/{TOP_K} {r['ms']:8.2f}")
