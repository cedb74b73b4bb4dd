"""The scorer on a GPU: correctness, the two launch forms and their settings, peers. One run:

    python benchmarks/logits_gpu.py [--quick] [--budget-s 200] [--no-peers] [--no-checks]

1. checks the Triton path against the reference with the contract's bound ``|got - want|
   <= 2e-3 * sum_h |w_h| sum_d |q_hd K_td|`` and exact ``-inf`` placement: every cache
   format and query form, next_n 1 to 4, the ROCm layouts, small blocks, 1 and 128 heads,
   in both launch forms (``VARIANT_ROWS``: a dot per row, MXFP4 keys per group;
   ``VARIANT_STACKED``: the rows' queries in one dot, MXFP4 group scales folded into the
   decoded keys), and the stacked form's exact paths (MXFP4 keys whose group scales lie
   too far apart to fold, scaled queries that do not fold);
2. times the issue's shapes (H = 64, block_size 64) for the row form with the settings of
   the previous heuristic ("old") and the stacked form with the current defaults and a
   few candidates around them (CUDA-graph replay, CUDA events, median) over inputs larger
   than the L2 (the calls of a graph rotate over distinct pages, queries and outputs), as
   a share of a device-to-device copy measured in the same run;
3. times peers: the unfused torch computation, and baseline kernels written here after
   what is known of vLLM 0.33.0's FP8 kernel and SGLang 0.5.23's MXFP4 kernel.

Details go to ``$OUT/logits_gpu.json`` (or ``./logits_gpu.json``); the tables are printed
last: per shape the old and new times, the best stacked settings and the speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import triton

from indexer_kcache import bench, layout
from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.bench.logits import torch_unfused
from indexer_kcache.kernels.logits import FP4_FOLD_SPAN, VARIANT_ROWS, VARIANT_STACKED
from indexer_kcache.logits import (
    Q_BF16,
    LogitsSettings,
    check_logits,
    logits_settings,
    paged_mqa_logits,
    paged_mqa_logits_into,
    run_logits,
    settings_for,
    split_query,
)
from indexer_kcache.reference import logits as reference_logits

DEV = "cuda"  # a CPU dry run of the checks can set it to "cpu" (with TRITON_INTERPRET=1)
BLOCK = 64
HEADS = 64
SHAPES = [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1), (64, 32768, 1),
          (128, 65536, 1), (64, 8192, 4), (64, 32768, 4)]
PEER_SHAPES = {(1, 4096), (1, 131072), (8, 32768), (64, 8192)}  # the unfused torch peer
COMBOS = [("fp8", "e4m3"), ("mxfp4", "e4m3"), ("mxfp4", "mxfp4")]  # (cache, query form)
BF16_COMBOS = [("fp8", "bf16"), ("fp8-mx", "bf16"), ("mxfp4", "bf16")]  # at 64 x 32768
FORMS = {VARIANT_ROWS: "rows", VARIANT_STACKED: "stacked"}
CHECK_CONTEXT = 3000  # keys of the longest sequence of a check


# ------------------------------------------------------------------------------ inputs
def store_cache(fmt: str, num_blocks: int, *, shuffle=False, n=0, seed=0, block=BLOCK
                ) -> torch.Tensor:
    """``num_blocks`` blocks of keys written by the store (every slot, scrambled order)."""
    fp4, mx = layout.FORMATS[fmt]
    inputs = bench.make_inputs(num_blocks * block, fmt, 1, DEV, seed=seed)
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(num_blocks * block)
    blocks = torch.randperm(num_blocks, generator=g)
    inputs["kv_slot_mapping"] = (blocks[t // block] * block + t % block).to(DEV)
    inputs["k_cache"] = torch.full((num_blocks, block, layout.cache_row_bytes(fp4)), 0xA5,
                                   dtype=torch.uint8, device=DEV)
    from indexer_kcache import indexer_k_norm_rope_store

    indexer_k_norm_rope_store(*[inputs[k] for k in bench.STORE_ARGS], n, mx_scales=mx,
                              shuffle=shuffle)
    return inputs["k_cache"]


def spread_group_scales(cache: torch.Tensor, drop: int) -> torch.Tensor:
    """A row-major MXFP4 cache where every fifth key has one group's UE8M0 exponent set
    ``drop`` binades below the largest of its other groups (at least 1)."""
    num_blocks, block, _ = cache.shape
    scales = cache.view(num_blocks, -1)[:, block * 64:block * 68].view(num_blocks, block, 4)
    e = scales.to(torch.int32)
    p = torch.arange(block, device=cache.device)
    keys = p % 5 == 0
    group = (p % 4)[None, :, None].expand(num_blocks, block, 1)
    others = e.scatter(2, group, 0).amax(2, keepdim=True)
    lowered = (others - drop).clamp_min(1)
    new = e.scatter(2, group, lowered)
    scales[:, keys] = new[:, keys].to(torch.uint8)
    return cache


def make_queries(q_form: str, batch: int, next_n: int, g: torch.Generator, heads=HEADS,
                 exponents=(121, 131)):
    return bench_logits.make_queries(q_form, batch, next_n, g, DEV, heads, exponents)


def make_calls(fmt: str, q_form: str, batch: int, context: int, next_n: int, seed: int = 0):
    """The bench's rotations of one shape (distinct pages, queries and tables per call,
    together more than the L2), without their outputs: ``checked`` gives each call its
    own. Returns (calls, key bytes of one call)."""
    calls, nbytes = bench_logits.make_calls(fmt, q_form, batch, context, next_n, DEV, seed)
    for call in calls:
        del call["out"]
    return calls, nbytes


TENSOR_ARGS = ("q", "k_cache", "weights", "context_lens", "block_table", "max_model_len")


def checked(call: dict, backend: str = "triton"):
    """(the op's arguments with a fresh ``out``, their plan)."""
    options = {k: v for k, v in call.items() if k not in TENSOR_ARGS}
    values, scales = split_query(call["q"])
    out = torch.empty(call["weights"].shape[0], call["max_model_len"], device=DEV)
    arguments = paged_mqa_logits_into.op.bind(
        values, scales, call["k_cache"], call["weights"], call["context_lens"],
        call["block_table"], out, backend=backend, **options)
    return arguments, check_logits(arguments)


def ours(call: dict, settings: LogitsSettings | None = None):
    """(call of the Triton path with these settings, its default settings, its output);
    checked once, here."""
    arguments, plan = checked(call)
    default = settings_for(plan)

    def run():
        with logits_settings.override(settings or default):
            run_logits(plan, arguments)

    return run, default, arguments.out


def old_settings(batch: int, next_n: int, heads: int, num_cols: int, q_form: int,
                 sm_count: int) -> LogitsSettings:
    """The row form with the previous heuristic's settings (4 programs an SM of 4 to 64
    tiles each), for the comparison."""
    head_pad = max(16, 1 << (heads - 1).bit_length())
    q_bytes = 128 * head_pad * (2 if q_form == Q_BF16 else 1)
    rows = max(1, min(next_n, 4, 65536 // q_bytes))
    row_groups = batch * -(-next_n // rows)
    tiles = max(-(-num_cols // 64), 1)
    per_program = min(max(-(-tiles * row_groups // (4 * sm_count)), 4), 64)
    return LogitsSettings(64, rows, max(-(-tiles // per_program), 1), 4, 3, VARIANT_ROWS, 0)


# ----------------------------------------------------------------------------- timing
def graph_us(fns, min_calls: int = 20) -> float:
    """Median GPU time per call of a CUDA graph calling each of ``fns`` in turn, at least
    ``min_calls`` calls."""
    return bench.graph_time_us(fns, len(fns) * max(1, -(-min_calls // len(fns))))


def candidates(base: LogitsSettings, next_n: int, fp4: bool, q_form: str, quick: bool
               ) -> list[LogitsSettings]:
    """Stacked-form settings around the default, the likeliest first (each new compiled
    form costs seconds): programs per row (splits), for several rows the rows a program
    takes and 8 warps (two warpgroups splitting the columns), a lower register cap, a
    deeper pipeline."""
    out = [base]
    if quick:
        return out
    out += [base._replace(splits=max(1, round(base.splits * f))) for f in (2.0, 0.5)]
    if next_n > 1:
        out += [base._replace(num_warps=8), base._replace(num_warps=8, splits=base.splits * 2),
                base._replace(rows=max(1, base.rows // 2), splits=base.splits),
                base._replace(rows=max(1, base.rows // 2), splits=max(1, base.splits // 2))]
    if base.max_registers:
        out.append(base._replace(max_registers=96 if q_form != "bf16" else 128))
    out.append(base._replace(num_stages=4))
    return list(dict.fromkeys(out))


def label(s: LogitsSettings) -> str:
    text = f"{FORMS[s.variant][0]} n{s.block_n} w{s.num_warps} s{s.num_stages} r{s.rows} x{s.splits}"
    return text + (f" reg{s.max_registers}" if s.max_registers else "")


# --------------------------------------------------------------------------- correctness
def check_case(fmt, q_form, next_n, *, shuffle=False, n=0, ctx_2d=False, seed=0, variant=None,
               heads=HEADS, block=BLOCK, spread=0, q_spread=False) -> dict:
    """Triton vs the float64 reference on the same cache, with the contract's bound; the
    default settings, in the given launch form when ``variant`` is set. ``spread``: some
    MXFP4 keys' group exponents that far apart; ``q_spread``: query group exponents 40
    binades apart (neither folds)."""
    fp4, mx = layout.FORMATS[fmt]
    batch = 4
    blocks = -(-CHECK_CONTEXT // block)
    cache = store_cache(fmt, batch * blocks, shuffle=shuffle, n=n, seed=seed, block=block)
    if spread:
        cache = spread_group_scales(cache, spread)
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = make_queries(q_form, batch, next_n, g, heads=heads,
                     exponents=(100, 141) if q_spread else (121, 131))
    weights = torch.randn(batch * next_n, heads, generator=g, device=DEV)
    table = torch.randperm(batch * blocks, generator=g, device=DEV).to(torch.int32)
    table = table.view(batch, blocks).contiguous()
    table[1, 3] = 10**6  # out of range: -inf
    lens = torch.tensor([CHECK_CONTEXT, 0, CHECK_CONTEXT // 2, CHECK_CONTEXT - 1], dtype=torch.int32,
                        device=DEV)
    if ctx_2d:
        lens = torch.randint(0, blocks * block, (batch, next_n), generator=g, device=DEV,
                             dtype=torch.int32)
    width = blocks * block + 50
    options = dict(mx_scales=mx, shuffle=shuffle, mxfp4_n_per_tile=n)
    args = (q, cache, weights, lens, table, width)
    _, plan = checked(dict(q=q, k_cache=cache, weights=weights, context_lens=lens,
                           block_table=table, max_model_len=width, **options))
    settings = settings_for(plan)
    if variant is not None:
        settings = settings._replace(variant=variant)
    with logits_settings.override(settings):
        got = paged_mqa_logits(*args, backend="triton", **options)
    want = paged_mqa_logits(*args, backend="reference", **options)
    keys, _ = reference_logits.sequence_keys(cache, table, plan.num_cols, fp4, plan.mx_scales,
                                             plan.layout, plan.n_per_tile)
    bound = bench_logits.contract_bound(q, keys, weights, torch.float64)
    finite = torch.isfinite(want[:, :plan.num_cols])
    err = (got[:, :plan.num_cols].double() - want[:, :plan.num_cols].double()).abs()
    slack = bound + 1e-6 * want[:, :plan.num_cols].double().abs()  # want is float32
    ok_inf = torch.equal(torch.isneginf(got), torch.isneginf(want))
    ok_nan = torch.equal(torch.isnan(got), torch.isnan(want))
    ok_err = bool((err[finite] <= slack[finite]).all())
    ratio = float((err[finite] / slack[finite].clamp_min(1e-30)).max()) if finite.any() else 0.0
    return dict(format=fmt, q_format=q_form, next_n=next_n, shuffle=shuffle, n_per_tile=n,
                ctx_2d=ctx_2d, heads=heads, block=block, spread=spread, q_spread=q_spread,
                form=FORMS[settings.variant], settings=label(settings),
                ok=ok_inf and ok_nan and ok_err, inf_ok=ok_inf, worst_err_over_bound=ratio)


BASE_CHECKS = (
    [dict(fmt=f, q_form=q, next_n=1) for f in ("fp8", "fp8-mx", "mxfp4")
     for q in ("bf16", "e4m3", "e4m3-mx", "mxfp4")]
    + [dict(fmt="fp8", q_form="e4m3", next_n=4), dict(fmt="mxfp4", q_form="mxfp4", next_n=4),
       dict(fmt="mxfp4", q_form="e4m3", next_n=4, ctx_2d=True),
       dict(fmt="fp8-mx", q_form="e4m3-mx", next_n=4),
       dict(fmt="fp8", q_form="e4m3", next_n=1, shuffle=True),
       dict(fmt="mxfp4", q_form="mxfp4", next_n=1, shuffle=True, n=16),
       dict(fmt="mxfp4", q_form="e4m3", next_n=2, shuffle=True, n=64)]
)
STACKED_CHECKS = [
    dict(fmt="fp8", q_form="e4m3", next_n=3, ctx_2d=True),
    dict(fmt="mxfp4", q_form="e4m3", next_n=3),
    dict(fmt="mxfp4", q_form="bf16", next_n=2),
    dict(fmt="fp8", q_form="bf16", next_n=4),
    dict(fmt="mxfp4", q_form="mxfp4", next_n=1, heads=1),
    dict(fmt="fp8", q_form="e4m3", next_n=2, heads=128),
    dict(fmt="mxfp4", q_form="e4m3", next_n=2, heads=128),
    dict(fmt="mxfp4", q_form="e4m3", next_n=1, block=16),
    dict(fmt="fp8", q_form="e4m3-mx", next_n=2, block=32),
    dict(fmt="mxfp4", q_form="e4m3", next_n=1, spread=FP4_FOLD_SPAN - 1),
    dict(fmt="mxfp4", q_form="e4m3", next_n=1, spread=FP4_FOLD_SPAN),
    dict(fmt="mxfp4", q_form="mxfp4", next_n=4, spread=40),
    dict(fmt="mxfp4", q_form="e4m3", next_n=2, spread=40, ctx_2d=True),
    dict(fmt="mxfp4", q_form="mxfp4", next_n=1, q_spread=True),
    dict(fmt="fp8", q_form="e4m3-mx", next_n=2, q_spread=True),
    dict(fmt="mxfp4", q_form="e4m3-mx", next_n=4, q_spread=True, spread=40),
]
# The row form is unchanged since run 1 (every check passed there): a few cases.
ROWS_CHECKS = [dict(fmt="fp8", q_form="e4m3", next_n=1), dict(fmt="mxfp4", q_form="mxfp4", next_n=1),
               dict(fmt="mxfp4", q_form="e4m3", next_n=4, ctx_2d=True),
               dict(fmt="fp8-mx", q_form="bf16", next_n=1)]
CHECKS = ([dict(case, variant=VARIANT_STACKED) for case in BASE_CHECKS + STACKED_CHECKS]
          + [dict(case, variant=VARIANT_ROWS) for case in ROWS_CHECKS])


# --------------------------------------------------------------------------------- peers
def baseline(call: dict, fp4: bool):
    """The bench's baseline kernel of the cache's format, writing a fresh output."""
    out = torch.empty(call["weights"].shape[0], call["max_model_len"], device=DEV)
    return bench_logits.baseline(dict(call, out=out), fp4)


# ----------------------------------------------------------------------------------- run
def time_shape(fmt, q_form, batch, context, next_n, quick, records, copy, budget_end):
    """Time the row form with the old settings, then the stacked form's candidates (all of
    them while within the budget, else only its default). Returns a summary dict."""
    fp4, _ = layout.FORMATS[fmt]
    calls, nbytes = make_calls(fmt, q_form, batch, context, next_n)
    arguments, plan = checked(calls[0])
    default = settings_for(plan)
    old = old_settings(batch, next_n, HEADS, plan.num_cols, plan.q_form, plan.sm_count)
    first, _, reference_out = ours(calls[0], old)
    first()
    reference_out = reference_out.clone()
    trial = [old] + candidates(default, next_n, fp4, q_form, quick)
    results = []
    for settings in trial:
        if time.monotonic() > budget_end and settings not in (default, old):
            continue
        try:
            fns = [ours(call, settings)[0] for call in calls]
            fn0, _, out0 = ours(calls[0], settings)
            fn0()
            agrees = bool(torch.allclose(out0, reference_out, rtol=1e-3, atol=1e-3,
                                         equal_nan=True))
            us = graph_us(fns)
        except Exception as error:  # report what ran
            print(f"  {fmt}/{q_form} {batch}x{context} n{next_n} {label(settings)}: "
                  f"{type(error).__name__}: {str(error)[:300]}", flush=True)
            continue
        results.append((us, settings, agrees))
        records.append(dict(op="logits", impl="indexer_kcache", format=fmt, q_format=q_form,
                            batch=batch, context=context, next_n=next_n, heads=HEADS,
                            gpu_us=us, bytes=nbytes, settings=settings._asdict(),
                            form=FORMS[settings.variant], default=settings == default,
                            old=settings == old, agrees=agrees,
                            pct_copy=100 * nbytes / us / 1e3 / copy))
    del calls
    print(f"{fmt:6} {q_form:7} {batch:4}x{context:<6} n{next_n}: " + ", ".join(
        f"{label(s)} {us:.1f}" for us, s, _ in sorted(results, key=lambda r: r[0])), flush=True)
    stacked = [r for r in results if r[1].variant == VARIANT_STACKED]
    best = min(stacked, key=lambda r: r[0]) if stacked else None
    return dict(
        fmt=fmt, q_form=q_form, batch=batch, context=context, next_n=next_n, bytes=nbytes,
        old_us=next((us for us, s, _ in results if s == old), None),
        default_us=next((us for us, s, _ in results if s == default), None),
        best_us=best[0] if best else None, best=label(best[1]) if best else "",
        disagree=not all(a for _, _, a in results))


def time_variants(calls: list, variants: dict, rounds: int) -> tuple[dict, dict, dict]:
    """Settings variants of one shape (``calls``: its rotations), each checked bit for bit
    against the first variant's logits, then timed in alternation ``rounds`` times:
    (identical, all times, median time) by variant name."""
    run, _, out = ours(calls[0], next(iter(variants.values())))
    run()
    want = out.clone()
    same = {}
    for name, settings in variants.items():
        run, _, out = ours(calls[0], settings)
        run()
        same[name] = torch.equal(out.view(torch.int32), want.view(torch.int32))
    runs = {name: [ours(c, s)[0] for c in calls] for name, s in variants.items()}
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name in variants:
            times[name].append(bench.graph_time_us(runs[name], 40))
    return same, times, {name: statistics.median(t) for name, t in times.items()}


def variant_experiment(name: str, shapes: dict, variants_of, rounds: int,
                       ranked: bool = False) -> None:
    """The loop of a settings experiment. For each (cache format, query form): [(batch,
    context, next_n)] of ``shapes``, ``variants_of(default, case)`` (``case``: the batch,
    context, next_n and the context's tiles, as a dict) gives the variants ({name:
    settings}, the reference first; None skips the shape), timed in alternation
    ``rounds`` times (``time_variants``). A line a shape (fastest first when ``ranked``);
    the records and the lines to ``$OUT/<name>.json`` (``report``)."""
    copy = bench.copy_bandwidth_GBps()
    lines, records = [], []
    for (fmt, q_form), cases in shapes.items():
        for batch, context, next_n in cases:
            calls, nbytes = make_calls(fmt, q_form, batch, context, next_n)
            _, default, _ = ours(calls[0])
            tiles = -(-context // default.block_n)
            variants = variants_of(default, dict(batch=batch, context=context,
                                                 next_n=next_n, tiles=tiles))
            if variants is None:
                continue
            same, times, median = time_variants(calls, variants, rounds)
            order = sorted(variants, key=median.get) if ranked else list(variants)
            lines.append(
                f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} n{next_n}  default: rows "
                f"{default.rows}, {-(-tiles // default.splits)} tiles a program, stages "
                f"{default.num_stages}, registers {default.max_registers}, pdl "
                f"{int(default.pdl)}, hint {default.hint_tiles}\n    " + "  ".join(
                    f"{v} {median[v]:.2f} us ({pct(nbytes, median[v], copy):.0f} %"
                    f"{'' if same[v] else ', DIFFERS'})" for v in order))
            print(lines[-1], flush=True)
            records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                                next_n=next_n, bytes=nbytes, default=default._asdict(),
                                times_us=times, identical=same))
            del calls
    report(name, copy, records, lines)


def experiment_rounds(doc: str) -> int:
    """An experiment's command line: ``--rounds`` (default 3)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args().rounds


def report(name: str, copy: float, records: list, lines: list[str]) -> None:
    """An experiment's end: its records to ``$OUT/<name>.json``, its table printed last."""
    with open(os.path.join(os.environ.get("OUT", "."), f"{name}.json"), "w") as f:
        json.dump(dict(copy_GBps=copy, records=records), f, indent=1)
    print(f"copy {copy:.0f} GB/s")
    print("\n".join(lines))


def pct(nbytes, us, copy):
    return 100 * nbytes / us / 1e3 / copy if us else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="default settings only")
    parser.add_argument("--budget-s", type=float, default=180.0,
                        help="stop trying non-default settings after this long")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers")
    parser.add_argument("--no-checks", action="store_true", help="skip the correctness checks")
    args = parser.parse_args()
    start = time.monotonic()
    budget_end = start + args.budget_s
    out_dir = os.environ.get("OUT", ".")
    device = torch.cuda.get_device_name()
    copy = bench.copy_bandwidth_GBps()
    empty_us = bench.graph_time_us(bench.empty_launch_fn(), 200)
    print(f"{device}  torch {torch.__version__}  triton {triton.__version__}  copy {copy:.0f} GB/s"
          f"  empty launch {empty_us:.2f} us (graph)", flush=True)

    checks = []
    for case in CHECKS if not args.no_checks else ():
        try:
            checks.append(check_case(**case))
        except Exception as error:
            checks.append(dict(case, ok=False, error=f"{type(error).__name__}: {str(error)[:300]}"))
        if not checks[-1]["ok"]:
            print("check FAILED", checks[-1], flush=True)
    print(f"checks: {sum(c['ok'] for c in checks)}/{len(checks)} pass; worst error/bound "
          f"{max((c.get('worst_err_over_bound', 0) for c in checks), default=0):.4f}; "
          f"{time.monotonic() - start:.0f} s", flush=True)

    records, table = [], []
    combos = [(f, q, b, c, n) for f, q in COMBOS for b, c, n in SHAPES]
    combos += [(f, q, 64, 32768, 1) for f, q in BF16_COMBOS]
    for fmt, q_form, batch, context, next_n in combos:
        table.append(time_shape(fmt, q_form, batch, context, next_n, args.quick, records, copy,
                                budget_end))

    peers = []
    for fmt in ("fp8", "mxfp4") if not args.no_peers else ():
        fp4, mx = layout.FORMATS[fmt]
        for batch, context, next_n in SHAPES:
            if next_n != 1:
                continue
            calls, nbytes = make_calls(fmt, "e4m3" if not fp4 else "bf16", batch, context, 1)
            kernel = [baseline(c, fp4) for c in calls]
            impl = "sglang-like-mxfp4" if fp4 else "vllm-like-fp8"
            for name, fns in ((impl, kernel),
                              ("torch-unfused", [torch_unfused(c, fp4, mx) for c in calls[:2]]
                               if (batch, context) in PEER_SHAPES else None)):
                if fns is None:
                    continue
                try:
                    us = graph_us(fns, min_calls=5 if name == "torch-unfused" else 20)
                except Exception as error:
                    print(f"peer {name} {fmt} {batch}x{context}: {type(error).__name__}: "
                          f"{str(error)[:200]}")
                    continue
                peers.append(dict(op="logits", impl=name, format=fmt,
                                  q_format="bf16" if fp4 else "e4m3", batch=batch,
                                  context=context, next_n=1, heads=HEADS, gpu_us=us,
                                  bytes=nbytes, pct_copy=100 * nbytes / us / 1e3 / copy))
            del calls

    result = dict(gpu=device, torch=torch.__version__, triton=triton.__version__, copy_GBps=copy,
                  empty_launch_graph_us=empty_us, checks=checks, records=records + peers,
                  summary=table, wall_s=time.monotonic() - start)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "logits_gpu.json"), "w") as f:
        json.dump(result, f, indent=1)

    print()
    for r in peers:
        print(f"peer {r['impl']:18} {r['format']:6} {r['batch']:>4}x{r['context']:<6} "
              f"{r['gpu_us']:9.1f} us {r['pct_copy']:6.1f}%")
    print(f"\n{device}: copy {copy:.0f} GB/s, empty launch {empty_us:.2f} us; checks "
          f"{sum(c['ok'] for c in checks)}/{len(checks)} pass"
          + "".join(f"\n  FAILED {c}" for c in checks if not c["ok"]))
    print(f"{'cache':6} {'q':7} {'B x ctx':>10} {'n':>1} {'old us':>7} {'%cp':>5} "
          f"{'new us':>7} {'best us':>7} {'%cp':>5} {'x old':>5}  best stacked settings")
    for r in table:
        old, new, best = r["old_us"], r["default_us"], r["best_us"]
        po, pb = pct(r["bytes"], old, copy), pct(r["bytes"], best, copy)
        fmt_us = lambda v: f"{v:7.1f}" if v else "      -"  # noqa: E731
        fmt_pc = lambda v: f"{v:5.1f}" if v else "    -"  # noqa: E731
        gain = f"{old / best:5.2f}" if old and best else "    -"
        print(f"{r['fmt']:6} {r['q_form']:7} {r['batch']:>4}x{r['context']:<6}{r['next_n']:>1} "
              f"{fmt_us(old)} {fmt_pc(po)} {fmt_us(new)} {fmt_us(best)} {fmt_pc(pb)} {gain}  "
              f"{r['best']}{'  SETTINGS DISAGREE' if r['disagree'] else ''}")
    print(f"wall {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
