"""Experiment: the stacked form with each tile's dot in two halves of the rows
(``LogitsSettings.split_dot``: half the float32 result live at a time), with and without a
register cap of 168 (three 4-warp programs an SM), against the defaults, at ``next_n``
2 and 4 (CUDA-graph replay of back-to-back calls over rotations larger than the L2). The
variants are timed in alternation, ``--rounds`` times each; each one's logits are compared
with the default's (largest difference relative to the largest logit; the contract's bound
is checked by the tests).

    python benchmarks/exp_scorer_split_dot.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache import bench  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps  # noqa: E402

SHAPES = [("fp8", "e4m3", 64, 8192, 4), ("fp8", "e4m3", 64, 32768, 4),
          ("fp8", "e4m3", 64, 32768, 2), ("mxfp4", "e4m3", 64, 8192, 4),
          ("mxfp4", "e4m3", 64, 32768, 4), ("fp8", "bf16", 64, 32768, 2)]
CAP = 168  # registers a thread for three 4-warp programs an SM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    copy = copy_bandwidth_GBps()
    lines, records = [], []
    for fmt, q_form, batch, context, next_n in SHAPES:
        calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, next_n)
        _, default, _ = logits_gpu.ours(calls[0])
        if default.rows < 2:
            print(f"{fmt} {q_form} {batch}x{context} n{next_n}: one row a program", flush=True)
            continue
        variants = {"default": default, "split": default._replace(split_dot=True),
                    f"cap{CAP}": default._replace(max_registers=CAP),
                    f"split cap{CAP}": default._replace(split_dot=True, max_registers=CAP),
                    f"split cap{CAP} s4": default._replace(split_dot=True, max_registers=CAP,
                                                           num_stages=4)}
        outs = {}
        for name, settings in variants.items():
            run, _, out = logits_gpu.ours(calls[0], settings)
            run()
            outs[name] = out.clone()
        want = outs["default"]
        finite = torch.isfinite(want)
        scale = want[finite].abs().max().item()
        diff = {name: ((o - want)[finite].abs().max().item() / scale,
                       torch.equal(torch.isfinite(o), finite)) for name, o in outs.items()}
        runs = {name: [logits_gpu.ours(c, s)[0] for c in calls] for name, s in variants.items()}
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name in variants:
                times[name].append(bench.graph_time_us(runs[name], 40))
        median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
        lines.append(f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} n{next_n}  " + "  ".join(
            f"{name} {median[name]:.1f} us ({logits_gpu.pct(nbytes, median[name], copy):.0f} %, "
            f"rel diff {diff[name][0]:.1e}{'' if diff[name][1] else ', INF DIFFERS'})"
            for name in variants))
        print(lines[-1], flush=True)
        records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                            next_n=next_n, bytes=nbytes, default=default._asdict(),
                            times_us=times, rel_diff={n: d[0] for n, d in diff.items()}))
        del calls, runs, outs
    logits_gpu.report("exp_scorer_split_dot", copy, records, lines)


if __name__ == "__main__":
    main()
