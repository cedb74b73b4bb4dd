"""Top-k on a GPU: exactness at the issue's shapes, then times against ``torch.topk``.

    python benchmarks/topk_gpu.py [--k 2048] [--quick] [--shapes 512x8192 ...]

1. Checks ``top_k_indices`` (k = 2048) against the reference, element for element, at
   every shape: random normal logits, rows of ties, NaN and -inf, ragged lengths and bf16
   with the default settings, normal logits with every candidate setting timed below.
   Reports how often a long row fell back from its candidates to the whole row.
2. Times, by CUDA-graph replay and CUDA events (median), each candidate setting and
   ``torch.topk(logits, k, dim=1, sorted=True)``, cycling through logits buffers that
   together exceed the L2 cache, so every call reads its logits from device memory.
   Bytes are the logits read; % copy is against a device-to-device copy (bytes read plus
   written per second) measured in the same run.
3. Per-kernel GPU times of the default settings launched without dependent launch
   (profiler, eager calls).

Candidate settings: ``default`` is ``topk_settings``' choice; the others change one thing
of it (``sampled``: short rows through the sample and filter kernels; ``direct``: rows up
to 8192 columns ranked whole; ``select-kernel``/``count-and-place``: the candidates
counted into their buckets and placed by the other kernels than the default's;
``place-<part>-w<warps>``: the count and place kernels at other sizes; ``shared-slots``
(rows read whole) / ``global-slots`` (candidates): the select kernel counting its pairs
into their buckets in shared memory / in device memory, whichever the default does not;
``shared-sample``: the sample's threshold by digit counts in shared memory;
``sample-x2``/``-x4``: a sample two or four times larger).

Writes ``topk_gpu.json`` (records ``{"op": "topk", "impl", "rows", "cols", "k", "gpu_us",
"bytes", ...}``) and ``topk_gpu.txt`` to ``$OUT`` when it is set; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from indexer_kcache import topk
from indexer_kcache.bench import copy_bandwidth_GBps, graph_time_us
from indexer_kcache.bench import topk as bench_topk
from indexer_kcache.reference import topk as reference

SHAPES = [(1, 131072), (64, 8192), (64, 65536), (128, 65536), (512, 8192)]
SMOKE_SHAPES = [(2, 5000), (3, 500)]  # --smoke: the checks only, tiny, on any device
DEVICE = "cuda"
TIME_BUDGET_S = 150  # past this, the remaining shapes time two variants only
L2_BYTES = 50 << 20
# Timed as the bench times the op (bench.topk): logits cycled through per timing (five
# times the L2), an output per logits buffer, CALLS calls per graph at least.
ROTATION_BYTES = bench_topk.ROTATION_BYTES
CALLS = 40


# ----------------------------------------------------------------------------- timing
def make_logits(kind: str, rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, cols, device=DEVICE, generator=g)
    if kind == "ties":  # eight distinct values
        x = torch.randint(0, 8, (rows, cols), device=DEVICE, generator=g).float()
    elif kind == "nan-inf":
        which = torch.randint(0, 16, (rows, cols), device=DEVICE, generator=g)
        x[which == 0] = float("nan")
        x[which == 1] = float("-inf")
        x[which == 2] = float("inf")
        x[which == 3] = -0.0
    return x


def ragged_lengths(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    lengths = torch.randint(0, cols + 1, (rows,), device=DEVICE, generator=g, dtype=torch.int32)
    lengths[0] = cols
    if rows > 1:
        lengths[1] = 1000  # fewer than k
    return lengths


# The targets: at least 3 times faster than torch.topk, and at 64 x 65536 and
# larger at least half the copy bandwidth on the logits bytes.
TARGET_SPEEDUP = 3.0
TARGET_COPY_SHARE = 0.5
BANDWIDTH_TARGET_MIN_ELEMENTS = 64 * 65536


def candidate_settings(rows: int, cols: int, k: int, quick: bool,
                       interpreted: bool = False) -> dict[str, topk.TopKSettings]:
    """The default settings and a handful of variations, by label."""
    base = topk.topk_settings(rows, cols, k, interpreted=interpreted)
    out = {"default": base}
    if base.splits == 0:
        sampled = topk.topk_settings(rows, cols, k, interpreted=interpreted,
                                     direct_max_cols=0)._asdict()
        variants = [("shared-slots", dict(shared_slots=True)),  # (rows read whole: off)
                    ("sampled", sampled), ("direct-w8", dict(select_warps=8)),
                    ("select-w32", dict(select_warps=32)), ("select-reg64", dict(max_registers=64))]
    else:
        def filter_(step, steps, warps=base.filter_warps):
            return dict(step=step, split_steps=steps, filter_warps=warps,
                        splits=-(-cols // (step * steps)))

        other_steps = 1 if base.split_steps > 1 else 2
        other_warps = 16 if base.select_warps < 16 else 8
        other_chunk = 2 * topk.RANK_CHUNK
        # The other placement, with its own sample and block.
        other = topk.topk_settings(rows, cols, k, interpreted=interpreted,
                                   count_and_place=not base.place_part)._asdict()
        # The select kernel counting in device memory, on the default's sample and block,
        # or on its own where the default counts and places (the "select-kernel" variant
        # there counts in shared memory, as the select kernel does by default).
        select = other if base.place_part else {}
        variants = [
            ("global-slots", dict(select, shared_slots=False)),
            ("shared-sample", dict(shared_sample=True)),  # on the default's placement
            ("select-kernel" if base.place_part else "count-and-place", other),
            (f"filter-{other_steps}-steps", filter_(base.step, other_steps)),
        ]
        if base.place_part:  # the place kernel at half or twice its warps
            variants += [(f"place-w{warps}", dict(place_warps=warps))
                         for warps in (base.place_warps // 2, base.place_warps * 2)
                         if 1 <= warps <= 16]
        else:
            variants += [
                (f"select-w{other_warps}", dict(select_warps=other_warps)),
                ("select-w32", dict(select_warps=32)),
                ("select-reg64", dict(max_registers=64)),  # two programs an SM at 16 warps
            ]
        variants += [
            (f"chunk{other_chunk}", dict(chunk=other_chunk)),
            ("sample-2-bits", dict(sample_digit_bits=2)),
            ("threshold-14-bits", dict(threshold_bits=14)),
            ("threshold-15-bits", dict(threshold_bits=15)),
            ("sample-w4", dict(sample_warps=4)),
            ("sample-w16", dict(sample_warps=16)),
        ]
        # Half the sample (a looser threshold) with the block its candidates need.
        half = base.sample_block // 2
        if half >= topk.MIN_SAMPLE:
            needed = -(-5 * topk.expected_candidates(cols, k, half) // 4)
            block = min(max(base.block, 1 << (needed - 1).bit_length()), topk.MAX_SORTED)
            variants.append(("sample-half", dict(sample_block=half, block=block,
                                                 place_part=min(base.place_part, block))))
        # The count and place kernels at other sizes (programs a row).
        for part in (1024, 256):
            if base.place_part and part < base.block:
                variants.append((f"place-{part}", dict(place_part=part)))
        # A larger sample: a threshold closer to the k-th value, fewer candidates to order.
        for times in (2, 4):
            if base.sample_block * times <= topk.MAX_SAMPLE:
                variants.append((f"sample-x{times}",
                                 dict(sample_block=base.sample_block * times)))
    # (Where the select kernel cannot use shared memory, a variant asking it to would time
    # the plain select kernel under its label: left out.)
    variants = [(label, change) for label, change in variants
                if not change.get("shared_slots")
                or topk.shared_slots_fit(change.get("block", base.block),
                                         change.get("select_warps", base.select_warps))]
    if quick:
        variants = variants[:2]
    for label, change in variants:
        out[label] = base._replace(**change)
    return out


def launch(logits, lengths, out, settings, buffers=None):
    """One launch of the Triton path with these settings (checked here, each time)."""
    arguments = topk.top_k_indices_into.op.bind(logits, lengths, out, backend="triton")
    plan = topk.check_topk(arguments)
    with topk.topk_settings.override(settings):
        topk.launch_topk(plan, arguments, buffers)


def call(logits, k, lengths, out, settings):
    arguments = topk.top_k_indices_into.op.bind(logits, lengths, out, backend="triton")
    plan = topk.check_topk(arguments)

    def run():
        with topk.topk_settings.override(settings):
            topk.launch_topk(plan, arguments)

    return run


# ----------------------------------------------------------------------------- checks
def check_shape(rows, cols, k, settings_by_label, g, log) -> list[str]:
    failures = []
    for kind in ("normal", "ties", "nan-inf", "ragged", "bf16"):
        logits = make_logits(kind if kind in ("ties", "nan-inf") else "normal", rows, cols, g)
        if kind == "bf16":
            logits = logits.bfloat16()
        lengths = ragged_lengths(rows, cols, g) if kind == "ragged" else None
        want = reference.top_k_indices(logits, k, lengths)
        # Every setting on one input (each is a compile); the default on every input.
        labels = settings_by_label if kind == "normal" else ["default"]
        for label in labels:
            s = settings_by_label[label]
            out = torch.full((rows, k), -7, dtype=torch.int32, device=DEVICE)
            buffers = {}
            launch(logits, lengths, out, s, buffers)
            same = torch.equal(out, want)
            note = ""
            if "cand_count" in buffers:
                counts = buffers["cand_count"]
                n = lengths.clamp(0, cols) if lengths is not None else torch.full_like(counts, cols)
                fallback = (counts > s.block) | (counts < n.clamp(max=k))
                note = (f" candidates/k median {float(counts.float().median()) / k:.2f}, "
                        f"row fallbacks {int(fallback.sum())}/{rows}")
            if not same:
                bad = (out != want).any(1).nonzero().flatten().tolist()
                failures.append(f"{rows}x{cols} {kind} {label}: rows {bad[:8]} differ")
            log(f"check {rows}x{cols} k={k} {kind:8} {label:18} "
                f"{'identical' if same else 'DIFFERENT'}{note}")
    return failures


def profile_kernels(rows, cols, k, settings, logits_list, out) -> dict[str, float]:
    """Mean GPU time per call of each kernel (eager calls under the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fns = [call(x, k, None, out, settings) for x in logits_list]
    for f in fns:
        f()
    torch.cuda.synchronize()
    calls = 3 * len(fns)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fns[i % len(fns)]()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        if "topk_" in event.key and "kernel" in event.key:
            device_us = getattr(event, "device_time_total", None)
            if device_us is None:
                device_us = event.cuda_time_total
            times[event.key] = device_us / calls
    return times


# ----------------------------------------------------------------------------- main
def smoke() -> int:
    """The checks of step 1 at tiny sizes: the script's own test."""
    global DEVICE
    from indexer_kcache.kernels import INTERPRETED

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=DEVICE).manual_seed(0)
    failures = []
    for rows, cols in SMOKE_SHAPES:
        labels = candidate_settings(rows, cols, 64, False, interpreted=INTERPRETED)
        failures += check_shape(rows, cols, 64, labels, g, print)
    print("all identical" if not failures else failures)
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="two variants per shape")
    parser.add_argument("--shapes", nargs="+", default=None, metavar="ROWSxCOLS",
                        help="only these shapes (default: the issue's five)")
    parser.add_argument("--smoke", action="store_true",
                        help="checks only, tiny shapes, k=64, on the CPU without a GPU "
                        "(set TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    k = args.k
    if args.smoke:
        return smoke()
    out_dir = os.environ.get("OUT")
    lines = []

    def log(line=""):
        print(line, flush=True)
        lines.append(line)

    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    import triton

    log(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
        f"triton {triton.__version__}")
    copy = copy_bandwidth_GBps()
    log(f"copy bandwidth {copy:.0f} GB/s (read + write)")
    g = torch.Generator(device=DEVICE).manual_seed(0)
    records, failures, summary = [], [], []
    shapes = ([tuple(int(n) for n in shape.split("x")) for shape in args.shapes]
              if args.shapes else SHAPES)
    for rows, cols in shapes:
        quick = args.quick or time.time() - t_start > TIME_BUDGET_S
        settings_by_label = candidate_settings(rows, cols, k, quick)
        for label, s in settings_by_label.items():
            log(f"settings {rows}x{cols} {label}: {s}")
        failures += check_shape(rows, cols, k, settings_by_label, g, log)

        nbytes = rows * cols * 4
        count = max(4, min(256, -(-ROTATION_BYTES // nbytes)))
        logits_list = [torch.randn(rows, cols, device=DEVICE, generator=g) for _ in range(count)]
        outs = [torch.empty((rows, k), dtype=torch.int32, device=DEVICE) for _ in logits_list]
        calls = max(count, CALLS)
        torch_us = graph_time_us(
            [lambda x=x: torch.topk(x, k, dim=1, sorted=True) for x in logits_list], calls)
        records.append(dict(op="topk", impl="torch-topk", rows=rows, cols=cols, k=k,
                            gpu_us=torch_us, bytes=nbytes))
        log(f"time {rows}x{cols} torch.topk(sorted=True) {torch_us:8.2f} us")
        timed = {}
        for label, s in settings_by_label.items():
            us = graph_time_us([call(x, k, None, o, s) for x, o in zip(logits_list, outs,
                                                                       strict=True)], calls)
            timed[label] = us
            records.append(dict(op="topk", impl="indexer_kcache", rows=rows, cols=cols, k=k,
                                gpu_us=us, bytes=nbytes, settings_label=label,
                                settings=s._asdict()))
            gbps = nbytes / us / 1e3
            log(f"time {rows}x{cols} {label:18} {us:8.2f} us  x{torch_us / us:5.2f} vs torch  "
                f"{gbps:6.0f} GB/s  {100 * gbps / copy:5.1f}% copy")
        try:
            # Without dependent launch: a kernel launched early would count its wait for
            # the previous one as its own time.
            per_kernel = profile_kernels(rows, cols, k,
                                         settings_by_label["default"]._replace(pdl=0),
                                         logits_list[:8], outs[0])
            log(f"kernels {rows}x{cols} default without PDL (eager, profiler): " + ", ".join(
                f"{name} {us:.2f} us" for name, us in per_kernel.items()))
        except Exception as error:  # the profile is a detail; keep the run's results
            log(f"kernels {rows}x{cols}: no profile ({type(error).__name__}: {error})")
        best = min(timed, key=timed.get)
        summary.append((rows, cols, torch_us, timed["default"], best, timed[best], nbytes))
        del logits_list
        torch.cuda.empty_cache()
        log(f"elapsed {time.time() - t_start:.0f} s")

    table = [f"top-k k={k} on {props.name}: copy {copy:.0f} GB/s; logits from device memory; "
             f"target: {TARGET_SPEEDUP:g}x torch, and {100 * TARGET_COPY_SHARE:g}% copy from "
             f"{BANDWIDTH_TARGET_MIN_ELEMENTS} elements",
             f"{'shape':>12} {'torch us':>9} {'target us':>9} {'default us':>10} {'x torch':>7} "
             f"{'% copy':>6} {'met':>3}  {'best setting':18} {'us':>7} {'x torch':>7} "
             f"{'% copy':>6} {'met':>3}"]
    for rows, cols, torch_us, default_us, best, best_us, nbytes in summary:
        pct = lambda us, nbytes=nbytes: 100 * nbytes / us / 1e3 / copy
        target_us = torch_us / TARGET_SPEEDUP
        if rows * cols >= BANDWIDTH_TARGET_MIN_ELEMENTS:
            target_us = min(target_us, nbytes / (TARGET_COPY_SHARE * copy) / 1e3)
        met = lambda us, target_us=target_us: "yes" if us <= target_us else "no"
        table.append(f"{f'{rows}x{cols}':>12} {torch_us:9.2f} {target_us:9.2f} "
                     f"{default_us:10.2f} {torch_us / default_us:7.2f} {pct(default_us):6.1f} "
                     f"{met(default_us):>3}  {best:18} {best_us:7.2f} {torch_us / best_us:7.2f} "
                     f"{pct(best_us):6.1f} {met(best_us):>3}")
    table.append("all results identical to the reference" if not failures
                 else "MISMATCHES: " + "; ".join(failures))
    log()
    for line in table:
        log(line)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "topk_gpu.json"), "w") as f:
            json.dump(dict(gpu=props.name, torch=torch.__version__, triton=triton.__version__,
                           copy_GBps=copy, records=records, mismatches=failures), f, indent=1)
        with open(os.path.join(out_dir, "topk_gpu.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
