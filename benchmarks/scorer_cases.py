"""The scorer at a few of the bench's shapes, for A/B runs of two revisions on one host
(run it once per revision's package, e.g. with ``PYTHONPATH`` set to the other's ``src``):

    python benchmarks/scorer_cases.py [--set bf16-decode | program-fold | store-in-place | tile-bounds
                                         | scaled-queries | scaled-rows]
        [--copy-GBps 4250] [--scaled-registers N] [--cases fp8-mx:e4m3-mx:64x8192:4 ...]

Each shape is checked against the contract's bound (``mismatches``), then timed as the
bench times it (CUDA-graph replay over calls that rotate over more keys than the L2 holds).
``--cases`` takes the named cases instead of a set's (``format:q_form:BATCHxCONTEXT:next_n``).
``--scaled-registers`` sets the register cap of one-row programs of queries with group
scales (e4m3 or MXFP4 values) to ``N`` instead of the settings' cap, for the experiment.
"""

from __future__ import annotations

import argparse
import contextlib

import indexer_kcache
from indexer_kcache import logits
from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.kernels.logits import Q_E4M3_MX

BF16_DECODE = [("mxfp4", "bf16", 64, 32768, 1), ("mxfp4", "bf16", 128, 65536, 1),
         ("mxfp4", "bf16", 8, 32768, 1), ("mxfp4", "bf16", 64, 8192, 1),
         ("mxfp4", "bf16", 64, 8192, 4), ("mxfp4", "e4m3", 64, 32768, 1),
         ("fp8", "bf16", 64, 32768, 1)]
# MXFP4 keys against e4m3 and MXFP4 queries (the program-wide fold), bf16 as a control.
PROGRAM_FOLD = [("mxfp4", "e4m3", b, ctx, n) for b, ctx, n in (
    (1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1), (64, 32768, 1), (128, 65536, 1),
    (64, 8192, 4))] + [("mxfp4", "mxfp4", b, ctx, 1) for b, ctx in (
        (1, 4096), (8, 32768), (64, 32768), (128, 65536))] + [("mxfp4", "bf16", 64, 32768, 1)]
# The stacked form's logits stored from the dot's layout: the shapes whose programs wait on
# their chain of tiles (few long rows) and two of each key format, one row a program.
STORE_IN_PLACE = [("fp8", "e4m3", b, ctx, 1) for b, ctx in (
    (1, 131072), (8, 32768), (64, 8192), (64, 32768))] + [
        ("mxfp4", "e4m3", 64, 8192, 1), ("mxfp4", "e4m3", 64, 32768, 1)]
# The tile's two output masks each folded into one bound (and the NaN watch one max a
# value): both key formats, one and four rows a program, MXFP4 queries.
TILE_BOUNDS = [("fp8", "e4m3", b, ctx, n) for b, ctx, n in (
    (1, 131072, 1), (8, 32768, 1), (64, 8192, 1), (64, 32768, 1), (64, 8192, 4))] + [
        ("mxfp4", "e4m3", b, ctx, 1) for b, ctx in ((8, 32768), (64, 8192), (64, 32768))] + [
        ("mxfp4", "mxfp4", 64, 32768, 1)]
# FP8 keys against e4m3 queries with group scales whose exponents (the bench's: 121 to
# 130) lie too far apart for the e4m3 fold; bf16 and e4m3 queries as controls, and MXFP4
# keys against the same queries (scored per group).
SCALED_QUERIES = [(fmt, "e4m3-mx", b, ctx, n) for fmt in ("fp8-mx", "fp8") for b, ctx, n in (
    (1, 4096, 1), (8, 32768, 1), (64, 32768, 1), (64, 8192, 4))] + [
        ("fp8-mx", "bf16", 64, 32768, 1), ("fp8", "e4m3", 64, 32768, 1),
        ("mxfp4", "e4m3-mx", 64, 32768, 1)]
# Scaled queries the e4m3 fold cannot take, several rows a program: scored again with the
# rows side by side in one bf16 dot (each key read once) instead of one bf16 pass a row;
# one row and bf16 queries as controls.
SCALED_ROWS = [(fmt, "e4m3-mx", b, ctx, n) for fmt in ("fp8-mx", "fp8", "mxfp4")
               for b, ctx, n in ((64, 8192, 2), (64, 8192, 4), (64, 32768, 4))] + [
                   ("fp8-mx", "e4m3-mx", 64, 32768, 1), ("fp8-mx", "bf16", 64, 8192, 4),
                   ("fp8-mx", "bf16", 64, 32768, 4)]
SETS = {"bf16-decode": BF16_DECODE, "program-fold": PROGRAM_FOLD,
        "store-in-place": STORE_IN_PLACE, "tile-bounds": TILE_BOUNDS,
        "scaled-queries": SCALED_QUERIES, "scaled-rows": SCALED_ROWS}


def scaled_registers(cap: int):
    """The settings, but one-row programs of scaled queries capped at ``cap`` registers."""
    choose = logits.logits_settings

    def capped(batch, next_n, heads, num_cols, use_fp4_cache, q_form, *args, **kwargs):
        settings = choose(batch, next_n, heads, num_cols, use_fp4_cache, q_form, *args,
                          **kwargs)
        if q_form >= Q_E4M3_MX and settings.rows == 1 and settings.max_registers:
            settings = settings._replace(max_registers=cap)
        return settings

    return choose.override(capped)


def parse_case(text: str) -> tuple[str, str, int, int, int]:
    """``fp8-mx:e4m3-mx:64x8192:4`` -> ``("fp8-mx", "e4m3-mx", 64, 8192, 4)``."""
    try:
        fmt, q_form, shape, next_n = text.split(":")
        batch, context = shape.split("x")
        return fmt, q_form, int(batch), int(context), int(next_n)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FORMAT:Q_FORM:BATCHxCONTEXT:NEXT_N, got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=SETS, default="bf16-decode", help="the cases")
    parser.add_argument("--copy-GBps", type=float, default=4250.0,
                        help="the copy bandwidth the % column divides by")
    parser.add_argument("--scaled-registers", type=int, default=0,
                        help="register cap of one-row programs of scaled queries (0: the "
                             "settings')")
    parser.add_argument("--cases", nargs="+", type=parse_case, default=None,
                        metavar="FMT:Q:BxC:N", help="these cases instead of the set's")
    args = parser.parse_args()
    copy = args.copy_GBps
    result = {"records": [], "byte_mismatches": []}
    cap = (scaled_registers(args.scaled_registers) if args.scaled_registers
           else contextlib.nullcontext())
    with cap:
        bench_logits.run_gpu(result, cases=args.cases or SETS[args.set], peers=False)
    package = indexer_kcache.__file__
    for r in result["records"]:
        share = 100 * r["bytes"] / r["gpu_us"] / 1e3 / copy
        print(f"{r['format']:6} {r['q_format']:5} {r['batch']:4}x{r['context']:<6} "
              f"n{r['next_n']} {r['gpu_us']:8.1f} us {share:5.1f} %")
    print(f"{package}: mismatches {result['byte_mismatches']}")


if __name__ == "__main__":
    main()
