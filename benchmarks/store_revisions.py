"""Store A/B across revisions: the launcher's own settings of whichever ``indexer_kcache``
is imported, graph-timed at a few sizes, every format and both ratios.

    python benchmarks/store_revisions.py --old <a revision's src> [--rounds 3] [--tokens ...]

Runs this checkout's ``src`` and the ``--old`` tree alternately, each in its own process
(round after round, so that drift on the host hits both alike). Each process checks the
bytes of every case against the reference (poisoned keys included, as
``store_ratio2_gpu.poisoned`` makes them) and prints one line per case; the table last
gives each revision's median over the rounds, its % of the copy bandwidth and new / old.
``$OUT`` (if set) receives ``store_revisions.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FORMATS = ("fp8", "fp8-mx", "mxfp4")

# One revision's measurements: JSON lines (format, ratio, tokens, us, bytes, bytes_ok).
_ONE_PROCESS = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from indexer_kcache import bench
from store_ratio2_gpu import poisoned
calls = int(sys.argv[2])
for fmt in sys.argv[4].split(","):
    fp4, mx = bench.FORMATS[fmt]
    for ratio in (1, 2):
        for tokens in map(int, sys.argv[3].split(",")):
            inputs = bench.make_inputs(tokens, fmt, ratio, "cuda")
            ok = bench.check_store_bytes(inputs, mx) and bench.check_store_bytes(poisoned(inputs), mx)
            us = bench.graph_time_us(bench.store_call(inputs, mx), calls if tokens >= 32768 else 4 * calls)
            print(json.dumps(dict(format=fmt, ratio=ratio, tokens=tokens, us=us, ok=ok,
                                  bytes=bench.minimal_store_bytes(inputs))), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the other revision's src directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 4096, 32768, 262144])
    parser.add_argument("--formats", nargs="*", default=list(FORMATS))
    args = parser.parse_args()
    trees = {"new": os.path.join(os.path.dirname(HERE), "src"), "old": os.path.abspath(args.old)}
    env = dict(os.environ, PYTHONPATH=HERE)
    times: dict[tuple, dict[str, list[float]]] = {}
    sizes: dict[tuple, int] = {}
    lines = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    for rnd in range(args.rounds):
        for name, src in trees.items():
            out = subprocess.run(
                [sys.executable, "-c", _ONE_PROCESS, src, str(args.calls),
                 ",".join(map(str, args.tokens)), ",".join(args.formats)],
                env=env, capture_output=True, text=True)
            if out.returncode:
                say(f"{name} round {rnd} failed: {out.stderr[-2000:]}")
                continue
            for row in map(json.loads, out.stdout.splitlines()):
                key = (row["format"], row["ratio"], row["tokens"])
                times.setdefault(key, {}).setdefault(name, []).append(row["us"])
                sizes[key] = row["bytes"]
                say(f"round {rnd} {name:3} {row['format']:6} cr{row['ratio']} {row['tokens']:>7} "
                    f"{row['us']:8.2f} us{'' if row['ok'] else '  BYTES DIFFER'}")
    sys.path.insert(0, trees["new"])
    from indexer_kcache import bench
    copy = bench.copy_bandwidth_GBps()
    say(f"median of {args.rounds} rounds; copy {copy:.0f} GB/s")
    say(f"{'format':6} {'cr':>2} {'tokens':>7} {'old us':>8} {'new us':>8} {'old %':>6} {'new %':>6} "
        f"{'new/old':>7}")
    for key, by in times.items():
        old, new = (statistics.median(by.get(n, [float("nan")])) for n in ("old", "new"))
        pct = [100 * sizes[key] / us / 1e3 / copy for us in (old, new)]
        say(f"{key[0]:6} {key[1]:>2} {key[2]:>7} {old:8.2f} {new:8.2f} {pct[0]:6.1f} {pct[1]:6.1f} "
            f"{new / old:7.3f}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "store_revisions.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
