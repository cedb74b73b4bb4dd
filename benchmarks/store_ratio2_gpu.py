"""The store at compress_ratio 2 on a GPU: the pairs path against the compacted one.

    python benchmarks/store_ratio2_gpu.py [--calls 50] [--formats fp8 fp8-mx mxfp4]

For fp8, fp8-mx and mxfp4 at 32768 and 262144 tokens: ratio 1 with the launcher's own
setting, and ratio 2 with the launcher's setting (the pairs path) and every candidate of
the compacted path (``COMPACT``; fp8-mx times the pairs path and fp8's three best). Each
setting's bytes are first checked against the reference on a batch with poisoned keys
(NaN, +Inf and -Inf in keys and in cos/sin rows, a key whose sum of squares overflows);
then it is timed by CUDA-graph replay (CUDA events, median). Then: float32 keys (bytes
against the bf16 call; time at 256K tokens), and the launcher's settings at other sizes
beside the figures committed in ``benchmarks/results/h200.json``. Prints us, % of the copy
bandwidth (minimal bytes) and the ratio-2 speed-up over ratio 1, a compact table last;
with ``$OUT`` set, writes ``store_ratio2.json`` and ``store_ratio2.txt`` there. Settings are
(tokens per program or batch, warps, eager loads, register cap, compaction, ranges per
program).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import time

import torch

from indexer_kcache import bench, layout, store

DEVICE = "cuda"
SIZES = (32768, 262144)
COMMITTED = os.path.join(os.path.dirname(__file__), "results", "h200.json")
# The compacted path: (tokens per batch, warps, register cap, ranges per program).
COMPACT = {
    False: [(16, 2, 0, 1), (16, 2, 0, 2), (16, 2, 0, 4), (16, 2, 128, 4), (16, 2, 96, 4),
            (32, 4, 0, 2), (32, 4, 0, 4), (32, 2, 0, 2), (8, 1, 0, 4), (8, 1, 128, 4)],
    True: [(16, 2, 0, 1), (16, 2, 0, 2), (16, 2, 0, 4), (16, 2, 168, 4), (16, 2, 128, 4),
           (32, 2, 0, 2), (32, 2, 0, 4), (32, 4, 0, 2), (8, 1, 0, 4), (8, 1, 128, 4)],
}
OTHER_SIZES = (1, 512, 4096)

DEFAULT_SETTINGS = store.store_settings  # the launcher's own choice (taken before any override)
# The override in force (see use): one at a time, closed at the end of the run.
OVERRIDE = contextlib.ExitStack()


def label(setting) -> str:
    block_t, warps, eager, max_registers, compact, ranges, *hints = setting
    kind = f"compact{ranges}" if compact else ("eager" if eager else "pairs")
    hints = hints + [0] * (2 - len(hints))
    return (f"{kind} {block_t}x{warps}" + f" r{max_registers}" * bool(max_registers)
            + f" hint{hints[0]}" * bool(hints[0]) + " group-scales" * bool(hints[1]))


def use(setting) -> None:
    """Launch the store with ``setting`` until the next ``use`` (``None``: its own choice)."""
    OVERRIDE.close()
    if setting is not None:
        OVERRIDE.enter_context(store.store_settings.override(store.StoreSettings(*setting)))


def poisoned(inputs: dict, seed: int = 1) -> dict:
    """A copy with about 1 % of the keys poisoned and one key of huge values."""
    g = torch.Generator().manual_seed(seed)
    k_pre, cos_sin = inputs["k_pre"].clone(), inputs["cos_sin_cache"].clone()
    tokens = k_pre.shape[0]
    rows = torch.randperm(tokens, generator=g)[: max(tokens // 100, 6)].tolist()
    for i, row in enumerate(rows):
        value = (float("nan"), float("inf"), -float("inf"))[i % 3]
        column = int(torch.randint(0, layout.HEAD_DIM, (1,), generator=g))
        if i % 2:
            k_pre[row, column] = value
        else:
            pos = int(inputs["positions"][row]) // inputs["compress_ratio"] * inputs["compress_ratio"]
            cos_sin[pos, column % layout.ROPE_DIM] = value
    k_pre[rows[0]] = 3.0e38  # its sum of squares overflows: it normalises to zeros
    return dict(inputs, k_pre=k_pre, cos_sin_cache=cos_sin)


@functools.lru_cache(maxsize=4)
def batch(fp4: bool, ratio: int, tokens: int, k_pre_dtype: torch.dtype):
    """(inputs, poisoned inputs, the reference's cache for the poisoned ones, per MX flag)."""
    fmt = "mxfp4" if fp4 else "fp8"
    inputs = bench.make_inputs(tokens, fmt, ratio, DEVICE, k_pre_dtype=k_pre_dtype)
    bad = poisoned(inputs)
    want = {}
    for mx in ((False,) if fp4 else (False, True)):
        cache = dict(bad, k_cache=torch.full_like(bad["k_cache"], 0xA5))
        bench.store_call(cache, mx, backend="reference")()
        want[mx] = cache["k_cache"]
    return inputs, bad, want


def experiment(doc: str, rounds: int = 2) -> tuple[argparse.Namespace, Run]:
    """An experiment script's options (``--calls``, ``--rounds``) and its ``Run``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=rounds)
    args = parser.parse_args()
    return args, Run(args.calls)


class Run:
    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.copy = bench.copy_bandwidth_GBps()
        self.records: list[dict] = []
        self.lines: list[str] = []
        self.say(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton "
                 f"{__import__('triton').__version__}  copy {self.copy:.0f} GB/s")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def save(self, name: str) -> None:
        """Write ``<name>.json`` (the records) and ``<name>.txt`` (the lines) to ``$OUT``,
        if it is set."""
        out = os.environ.get("OUT")
        if out:
            with open(os.path.join(out, f"{name}.json"), "w") as f:
                json.dump({"copy_GBps": self.copy, "records": self.records}, f, indent=1)
            with open(os.path.join(out, f"{name}.txt"), "w") as f:
                f.write("\n".join(self.lines) + "\n")

    def measure(self, fmt: str, ratio: int, tokens: int, setting, section: str,
                k_pre_dtype=torch.bfloat16) -> dict:
        fp4, mx = bench.FORMATS[fmt]
        inputs, bad, want = batch(fp4, ratio, tokens, k_pre_dtype)
        use(setting)
        record = dict(section=section, format=fmt, compress_ratio=ratio, tokens=tokens,
                      setting=list(setting), label=label(setting), k_pre=str(k_pre_dtype)[6:],
                      bytes=bench.minimal_store_bytes(inputs))
        try:
            got = dict(bad, k_cache=torch.full_like(bad["k_cache"], 0xA5))
            bench.store_call(got, mx)()
            record["bytes_ok"] = torch.equal(got["k_cache"], want[mx])
            if k_pre_dtype != torch.bfloat16:  # the bytes of the bf16 call
                as_bf16 = dict(inputs, k_pre=inputs["k_pre"].to(torch.bfloat16))
                got, want = (dict(d, k_cache=torch.full_like(d["k_cache"], 0xA5))
                             for d in (inputs, as_bf16))
                bench.store_call(got, mx)()
                bench.store_call(want, mx)()
                record["bytes_ok"] &= torch.equal(got["k_cache"], want["k_cache"])
            calls = self.calls if tokens >= 32768 else 4 * self.calls
            record["us"] = bench.graph_time_us(bench.store_call(inputs, mx), calls)
            record["pct"] = 100 * record["bytes"] / record["us"] / 1e3 / self.copy
        except Exception as error:  # a setting the compiler refuses: report, go on
            record.update(us=None, pct=None, bytes_ok=False, error=f"{type(error).__name__}: "
                          f"{str(error)[:120]}")
        self.records.append(record)
        mark = "" if record["bytes_ok"] else "  BYTES DIFFER" + (f" ({record['error']})"
                                                                 if "error" in record else "")
        us = f"{record['us']:8.2f} us {record['pct']:5.1f} %" if record["us"] else "       -"
        self.say(f"  {section:10} {fmt:6} cr{ratio} {tokens:>7} {record['k_pre']:8} "
                 f"{record['label']:20} {us}{mark}")
        return record


def ratio2_sweep(run: Run, formats) -> dict:
    best = {}
    for fmt in formats:
        fp4 = bench.FORMATS[fmt][0]
        for tokens in SIZES:
            run.measure(fmt, 1, tokens, DEFAULT_SETTINGS(tokens, 1, fp4, False), "cr1")
            run.measure(fmt, 2, tokens, DEFAULT_SETTINGS(tokens, 2, fp4, False), "cr2-pairs")
        candidates = [(t, w, False, r, True, n) for t, w, r, n in COMPACT[fp4]]
        if fmt == "fp8-mx" and "fp8" in best:  # the same kernel but its scale bytes
            candidates = best["fp8"]
        for setting in candidates:
            for tokens in SIZES:
                run.measure(fmt, 2, tokens, setting, "cr2-new")
        ranked = sorted((r for r in run.records if r["format"] == fmt and r["section"] == "cr2-new"
                         and r["tokens"] == SIZES[-1] and r["us"] and r["bytes_ok"]),
                        key=lambda r: r["us"])
        best[fmt] = [tuple(r["setting"]) for r in ranked[:3]]
    return best


def float_keys(run: Run, formats, best: dict) -> None:
    tokens = SIZES[-1]
    for fmt in formats:
        fp4 = bench.FORMATS[fmt][0]
        for dtype in (torch.float32, torch.bfloat16):
            run.measure(fmt, 1, tokens, DEFAULT_SETTINGS(tokens, 1, fp4, False), "float-keys",
                        dtype)
            if best.get(fmt):
                run.measure(fmt, 2, tokens, best[fmt][0], "float-keys", dtype)


def other_sizes(run: Run, formats) -> None:
    for fmt in formats:
        fp4 = bench.FORMATS[fmt][0]
        for ratio in (1, 2):
            for tokens in OTHER_SIZES:
                run.measure(fmt, ratio, tokens, DEFAULT_SETTINGS(tokens, ratio, fp4, False),
                            "other-size")


def committed_us() -> dict:
    try:
        with open(COMMITTED) as f:
            result = json.load(f)
    except OSError:
        return {}
    return {(r["format"], r["compress_ratio"], r["tokens"]): r["graph_us"]
            for r in result["records"] if r["impl"] == "indexer_kcache" and r["op"] == "store"}


def table(run: Run, formats) -> list[str]:
    def find(**where):
        rows = [r for r in run.records if all(r.get(k) == v for k, v in where.items())
                and r.get("us")]
        return min(rows, key=lambda r: r["us"]) if rows else None

    committed = committed_us()
    lines = ["", "ratio 2 (minimal bytes, % of copy bandwidth; speed-up = cr1 us / cr2 us):",
             f"{'format':7} {'tokens':>7} {'cr1 us':>8} {'cr2 pairs us':>13} {'%':>5} "
             f"{'x':>5} {'cr2 best new us':>16} {'%':>5} {'x':>5}  best new setting"]
    for fmt in formats:
        for tokens in SIZES:
            cr1 = find(section="cr1", format=fmt, tokens=tokens)
            old = find(section="cr2-pairs", format=fmt, tokens=tokens)
            new = find(section="cr2-new", format=fmt, tokens=tokens, bytes_ok=True)
            if not (cr1 and old and new):
                continue
            lines.append(f"{fmt:7} {tokens:>7} {cr1['us']:8.2f} {old['us']:13.2f} {old['pct']:5.1f} "
                         f"{cr1['us'] / old['us']:5.2f} {new['us']:16.2f} {new['pct']:5.1f} "
                         f"{cr1['us'] / new['us']:5.2f}  {new['label']}")
    lines.append(f"targets at {SIZES[-1]} tokens: cr2 >= 85 % for every format; MXFP4 cr2 >= 1.6x "
                 "faster than its cr1")
    lines += ["", f"float32 keys at {SIZES[-1]} tokens (us, % of copy bandwidth: their rows are "
              "512 B):"]
    for fmt in formats:
        for ratio in (1, 2):
            rows = {r["k_pre"]: r for r in run.records if r["section"] == "float-keys"
                    and r["format"] == fmt and r["compress_ratio"] == ratio and r.get("us")}
            if "float32" in rows and "bfloat16" in rows:
                f32, b16 = rows["float32"], rows["bfloat16"]
                lines.append(f"{fmt:7} cr{ratio} {f32['label']:20} fp32 {f32['us']:7.2f} us "
                             f"{f32['pct']:5.1f} %   bf16 {b16['us']:7.2f} us {b16['pct']:5.1f} %")
    lines += ["", "the launcher's settings against the committed H200 figures (us):"]
    for r in run.records:
        if r["section"] in ("cr1", "cr2-pairs", "other-size") and r.get("us"):
            was = committed.get((r["format"], r["compress_ratio"], r["tokens"]))
            change = f"{r['us']:8.2f} vs {was:8.2f} ({100 * (r['us'] / was - 1):+5.1f} %)" if was else (
                f"{r['us']:8.2f}")
            lines.append(f"  {r['format']:6} cr{r['compress_ratio']} {r['tokens']:>7} {change}")
    bad = [f"{r['format']} cr{r['compress_ratio']} {r['tokens']} {r['label']} {r['k_pre']}"
           for r in run.records if not r["bytes_ok"]]
    lines.append("\nall bytes identical to the reference (poisoned keys included)" if not bad
                 else "\nBYTES DIFFER: " + "; ".join(bad))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50, help="calls per CUDA graph (256K)")
    parser.add_argument("--formats", nargs="*", default=list(bench.FORMATS))
    args = parser.parse_args()
    t0 = time.time()
    run = Run(args.calls)
    try:
        best = ratio2_sweep(run, args.formats)
        float_keys(run, args.formats, best)
        other_sizes(run, args.formats)
    finally:
        use(None)
    lines = table(run, args.formats)
    for line in lines:
        run.say(line)
    run.say(f"({time.time() - t0:.0f} s) the three best compacted settings at {SIZES[-1]} tokens, "
            "as store_settings returns them:")
    for fmt, settings in best.items():
        run.say(f"  {fmt:6} " + "  ".join(str(tuple(s)) for s in settings))
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "store_ratio2.json"), "w") as f:
            json.dump(dict(copy_GBps=run.copy, records=run.records,
                           best={f: [list(s) for s in b] for f, b in best.items()}), f, indent=1)
        with open(os.path.join(out, "store_ratio2.txt"), "w") as f:
            f.write("\n".join(run.lines) + "\n")
    return 0 if all(r["bytes_ok"] for r in run.records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
