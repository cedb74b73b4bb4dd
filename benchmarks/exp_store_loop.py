"""The store at 256K tokens with persistent programs whose loop over token blocks is
software-pipelined (``StoreSettings.loop_stages``), beside the launcher's own settings.

    python benchmarks/exp_store_loop.py [--calls 50]

Each setting's bytes are checked against the reference on a batch with poisoned keys,
then timed by CUDA-graph replay (``store_ratio2_gpu.Run``). Settings: (tokens or pairs a
block, warps, eager, register cap, compact, ranges, loop stages, programs per SM).
"""

from __future__ import annotations

import argparse
import json
import os

from store_ratio2_gpu import DEFAULT_SETTINGS, Run, use

TOKENS = 262144


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    run = Run(args.calls)
    candidates = {  # (format, ratio) -> loop settings
        ("fp8", 2): [(16, 2, False, 0, False, 1, stages, per_sm)
                     for stages in (2, 3) for per_sm in (4, 8)]
        + [(16, 4, False, 0, False, 1, 3, 8), (32, 4, False, 0, False, 1, 3, 4)],
        ("mxfp4", 2): [(16, 2, False, 0, False, 1, 2, 8), (16, 2, False, 0, False, 1, 3, 4),
                       (16, 2, False, 0, False, 1, 3, 8)],
        ("fp8", 1): [(16, 2, False, 0, False, 1, 3, 8)],
        ("mxfp4", 1): [(32, 2, False, 0, False, 1, 3, 4), (16, 2, False, 0, False, 1, 3, 8)],
    }
    best = {}
    for (fmt, ratio), settings in candidates.items():
        fp4 = fmt == "mxfp4"
        default = run.measure(fmt, ratio, TOKENS, DEFAULT_SETTINGS(TOKENS, ratio, fp4, False), "default")
        results = [run.measure(fmt, ratio, TOKENS, s, "loop") for s in settings]
        ok = [r for r in results if r["us"] and r["bytes_ok"]]
        if ok:
            best[(fmt, ratio)] = min(ok, key=lambda r: r["us"])
            run.say(f"  -> {fmt} cr{ratio}: default {default['us']:.2f} us ({default['pct']:.1f} %), "
                    f"best loop {best[(fmt, ratio)]['us']:.2f} us ({best[(fmt, ratio)]['pct']:.1f} %) "
                    f"{best[(fmt, ratio)]['label']}")
    if ("fp8", 2) in best:  # fp8-mx: the same kernel but its scale bytes
        run.measure("fp8-mx", 2, TOKENS, DEFAULT_SETTINGS(TOKENS, 2, False, False), "default")
        run.measure("fp8-mx", 2, TOKENS, tuple(best[("fp8", 2)]["setting"]), "loop")
    use(None)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "store_loop.json"), "w") as f:
            json.dump({"copy_GBps": run.copy, "records": run.records}, f, indent=1)
        with open(os.path.join(out, "store_loop.txt"), "w") as f:
            f.write("\n".join(run.lines) + "\n")


if __name__ == "__main__":
    main()
