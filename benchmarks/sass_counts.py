"""Instruction and register counts of a kernel compiled for sm_90, on any machine.

Triton compiles for a GPU it does not have when given the target: its NVIDIA backend
ships ``ptxas`` and ``cuobjdump``. This script compiles the store kernel (a format,
ratio and launch setting; by default the settings ``store_settings`` picks at 256K
tokens) or the top-k filter kernel (each warp appending its own candidates or the
block-wide path; tracking the rows' largest keys or not) and prints the
registers a thread, the stack frame a thread (where spills go), the SASS instructions of a
program's first pass (up to its first ``EXIT``: the store's ratio-2 second pass, rarely
taken, is left out) and, for the store, the warp instructions per written token.

    python benchmarks/sass_counts.py store --format mxfp4 --ratio 2
    python benchmarks/sass_counts.py store --format mxfp4 --ratio 1 --tokens-per-program 32 --warps 2
    python benchmarks/sass_counts.py topk-filter

The counts are of this machine's Triton, which need not be the one a GPU run used.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from indexer_kcache import layout, store
from indexer_kcache.kernels.store import indexer_k_store_kernel
from indexer_kcache.kernels.topk import topk_filter_kernel

TARGET = GPUTarget("cuda", 90, 32)
STORE_TOKENS = 262144


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_counts(fn, signature: dict, constexprs: dict, divisible: tuple, options: dict):
    """(registers, stack bytes, first-pass instructions) of ``fn`` compiled for sm_90.
    Spilled registers live in the stack frame (``cuobjdump``'s ``STACK``, not ``LOCAL``).
    Pointers and the ``divisible`` integers are marked 16-divisible, as Triton's
    specialisation marks them at a launch with such values."""
    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
             if kind.startswith("*") or name in divisible}
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                              options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    instructions = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    first_exit = next((i for i, line in enumerate(instructions) if "EXIT" in line),
                      len(instructions) - 1)
    return registers, stack, first_exit + 1


def store_counts(args) -> None:
    use_fp4, mx_scales = layout.FORMATS[args.format]
    s = store.store_settings(STORE_TOKENS, args.ratio, use_fp4, interpreted=False)
    s = s._replace(**{name: value for name, value in (
        ("tokens_per_program", args.tokens_per_program), ("num_warps", args.warps),
        ("eager_loads", args.eager), ("max_registers", args.max_registers),
        ("hint_ahead", args.hint_ahead))
        if value is not None})
    signature = {"k_pre_ptr": "*bf16", "k_pre_row_stride": "i32", "positions_ptr": "*i64",
                 "cos_sin_ptr": "*fp32", "cos_sin_row_stride": "i32", "max_pos": "i32",
                 "weight_ptr": "*bf16", "eps": "fp32", "cache_ptr": "*u8", "page_stride": "i32",
                 "num_slots": "i32", "slot_ptr": "*i64", "num_tokens": "i32"}
    constexprs = dict(COMPRESS_RATIO=args.ratio, USE_FP4=use_fp4, MX_SCALES=mx_scales,
                      LAYOUT=layout.ROW_MAJOR, N_PER_TILE=16, D_PER_TILE=layout.MXFP4_D_PER_TILE,
                      SCALE_LANES=0, BLOCK_SIZE=64, BLOCK_T=s.tokens_per_program,
                      EAGER_LOADS=s.eager_loads, COMPACT=s.compact, RANGES=s.ranges,
                      EXACT_CASTS=False, USE_PDL=2, HINT_AHEAD=s.hint_ahead,
                      GROUP_SCALES=s.group_scales and use_fp4)
    options = store.compile_options(True, True, s.max_registers) | {"num_warps": s.num_warps}
    registers, stack, first_pass = compile_counts(
        indexer_k_store_kernel, signature, constexprs,
        ("k_pre_row_stride", "cos_sin_row_stride", "page_stride"), options)
    line = (f"store {args.format} ratio {args.ratio} {s}: {registers} registers, "
            f"{stack} stack bytes, {first_pass} instructions a thread in the first pass")
    if not s.compact and not (args.ratio == 2 and s.eager_loads):
        # A program writes a token per pair at ratio 2, each of its tokens at ratio 1.
        line += f", {first_pass * s.num_warps / s.tokens_per_program:.0f} warp instructions " \
                "a written token"
    print(line)


def filter_counts(args) -> None:
    signature = {"logits_ptr": "*fp32", "row_stride": "i32", "cols": "i32", "lengths_ptr": "*i32",
                 "split_cols": "i32", "threshold_ptr": "*i32", "cand_ptr": "*i64",
                 "cand_count_ptr": "*i32", "capacity": "i32"}
    for warp_append in (True, False):
        for track_max in (False, True):
            constexprs = dict(IS_BF16=False, HAS_LENGTHS=False, BLOCK=1024,
                              WARP_APPEND=warp_append, TRACK_MAX=track_max, USE_PDL=2)
            registers, stack, _ = compile_counts(topk_filter_kernel, signature, constexprs,
                                                 ("row_stride", "split_cols"),
                                                 {"num_warps": 4, "launch_pdl": True})
            print(f"topk filter, WARP_APPEND={warp_append} TRACK_MAX={track_max}: "
                  f"{registers} registers, {stack} stack bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="kernel", required=True)
    p = sub.add_parser("store")
    p.add_argument("--format", choices=list(layout.FORMATS), default="fp8")
    p.add_argument("--ratio", type=int, choices=[1, 2], default=2)
    p.add_argument("--tokens-per-program", type=int)
    p.add_argument("--warps", type=int)
    p.add_argument("--eager", action=argparse.BooleanOptionalAction)
    p.add_argument("--max-registers", type=int)
    p.add_argument("--hint-ahead", type=int)
    sub.add_parser("topk-filter")
    args = parser.parse_args()
    (store_counts if args.kernel == "store" else filter_counts)(args)


if __name__ == "__main__":
    main()
