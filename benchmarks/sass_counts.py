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


def _compile(fn, signature: dict, constexprs: dict, divisible: tuple, options: dict):
    """(registers, stack bytes, shared bytes, SASS instructions as (address, text)) of
    ``fn`` compiled for sm_90. Spilled registers live in the stack frame (``cuobjdump``'s
    ``STACK``, not ``LOCAL``). Pointers and the ``divisible`` integers are marked
    16-divisible, as Triton's specialisation marks them at a launch with such values."""
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
    instructions = [(int(m.group(1), 16), m.group(2)) for m in (
        re.match(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);", line) for line in sass.splitlines()) if m]
    return registers, stack, compiled.metadata.shared, instructions


def compile_counts(fn, signature: dict, constexprs: dict, divisible: tuple, options: dict):
    """(registers, stack bytes, first-pass instructions: up to the first ``EXIT``) of
    ``fn`` compiled for sm_90 (``_compile``)."""
    registers, stack, _, instructions = _compile(fn, signature, constexprs, divisible, options)
    first_exit = next((i for i, (_, text) in enumerate(instructions) if "EXIT" in text),
                      len(instructions) - 1)
    return registers, stack, first_exit + 1


def loops(instructions: list) -> list:
    """(first address, instructions, dot instructions, spill loads, spill stores) of each
    loop of ``instructions``: a backward branch and what lies between it and its target."""
    found = []
    for i, (address, text) in enumerate(instructions):
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            body = [t for a, t in instructions[:i + 1] if a >= int(target.group(1), 16)]
            found.append((int(target.group(1), 16), len(body),
                          sum("GMMA" in t for t in body), sum("LDL" in t for t in body),
                          sum("STL" in t for t in body)))
    return sorted(found)


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


def scorer_counts(args) -> None:
    """The scorer as the settings launch it at ``args.batch`` x ``args.context`` on an H200
    (132 SMs, H = 64, 64-token pages, row-major), compiled for sm_90: its plan is checked
    on small CPU tensors of the call's shapes (one page: the settings do not read the
    cache's size), then made native, as on the GPU."""
    import dataclasses

    import torch

    from indexer_kcache import checks, logits
    from indexer_kcache.kernels.logits import paged_mqa_logits_kernel

    heads, fp4, mx = 64, *layout.FORMATS[args.format]
    shape = (args.batch, args.next_n, heads)
    if args.q_form == "bf16":
        values, scales = torch.zeros(*shape, 128, dtype=torch.bfloat16), None
    else:
        values = torch.zeros(*shape, 64 if args.q_form == "mxfp4" else 128,
                             dtype=torch.uint8 if args.q_form == "mxfp4" else torch.float8_e4m3fn)
        scales = torch.zeros(shape, dtype=torch.int32) if args.q_form != "e4m3" else None
    cache = torch.zeros(1, 64, 68 if fp4 else 132, dtype=torch.uint8)
    out = torch.empty(args.batch * args.next_n, args.context)
    call = logits.paged_mqa_logits_into.op.bind(
        values, scales, cache, torch.zeros(args.batch * args.next_n, heads),
        torch.full((args.batch,), args.context, dtype=torch.int32),
        torch.zeros(args.batch, args.context // 64, dtype=torch.int32), out, mx_scales=mx)
    plan = dataclasses.replace(logits.check_logits(call), native=True, sm_count=132)
    settings = logits.settings_for(plan)
    if args.max_registers is not None:
        settings = settings._replace(max_registers=args.max_registers)
    launch = logits._logits_launch(plan, settings, scale_words=True)[0].state
    fixed = dict(launch.fixed, USE_PDL=settings.pdl)
    # Fixed ints as Triton specialises them at a launch: 1 a constant, multiples of 16
    # marked so (the per-call arguments: aligned pointers, unspecialised ints).
    constexprs = {p.name: fixed[p.name] for p in paged_mqa_logits_kernel.params
                  if p.is_constexpr or fixed.get(p.name) == 1}
    divisible = tuple(name for name, value in fixed.items()
                      if name not in constexprs and isinstance(value, int) and value % 16 == 0)
    signature = {name: "*i16" if name == "q_ptr" and args.q_form == "bf16" else "*u8"
                 if name in ("q_ptr", "cache_ptr", "fold_ptr") else "*i32"
                 if name in ("qs_ptr", "ctx_ptr", "table_ptr") else "*fp32"
                 if name.endswith("_ptr") else "i32"
                 for name in paged_mqa_logits_kernel.arg_names if name not in constexprs}
    options = dict(launch.launch_options, **checks.nvidia_options(
        True, settings.pdl != logits.PDL_NONE, settings.max_registers))
    registers, stack, shared, instructions = _compile(
        paged_mqa_logits_kernel, signature, constexprs, divisible, options)
    print(f"scorer {args.format} q {args.q_form} {args.batch}x{args.context} next_n "
          f"{args.next_n} {settings}: {registers} registers, {stack} stack bytes, {shared} "
          f"bytes of shared memory, {len(instructions)} instructions")
    for first, count, dots, spill_loads, spill_stores in loops(instructions):
        print(f"  loop at {first:#x}: {count} instructions, {dots} dot instructions, "
              f"{spill_loads} spill loads, {spill_stores} spill stores")


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
    p = sub.add_parser("scorer")
    p.add_argument("--format", choices=list(layout.FORMATS), default="fp8")
    p.add_argument("--q-form", choices=["bf16", "e4m3", "e4m3-mx", "mxfp4"], default="e4m3")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--next-n", type=int, default=1)
    p.add_argument("--max-registers", type=int)
    sub.add_parser("topk-filter")
    args = parser.parse_args()
    {"store": store_counts, "scorer": scorer_counts, "topk-filter": filter_counts}[
        args.kernel](args)


if __name__ == "__main__":
    main()
