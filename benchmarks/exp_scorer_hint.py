"""Experiment: the scorer with its L2 hints (the pages of each program's first 2 or 4 tiles
asked for into L2 before the dependent-launch wait, ``LogitsSettings.hint_tiles``) against
none (the settings otherwise the defaults), on shapes the settings launch dependently (CUDA-graph replay of
back-to-back calls over rotations larger than the L2). The variants are timed in
alternation, ``--rounds`` times each; each one's logits are checked bit for bit against
the unhinted launch's first.

    python benchmarks/exp_scorer_hint.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                      (64, 32768, 1), (64, 8192, 4)],
    ("mxfp4", "e4m3"): [(1, 4096, 1), (1, 131072, 1), (8, 32768, 1), (64, 8192, 1),
                        (64, 32768, 1)],
    ("mxfp4", "mxfp4"): [(1, 131072, 1)],
}
HINTS = (2, 4)  # tiles hinted a program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    copy = copy_bandwidth_GBps()
    lines, records = [], []
    for (fmt, q_form), shapes in SHAPES.items():
        for batch, context, next_n in shapes:
            calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, next_n)
            _, default, _ = logits_gpu.ours(calls[0])
            if not default.pdl:
                print(f"{fmt} {q_form} {batch}x{context}: launched plainly, no hints", flush=True)
                continue
            variants = {"none": default._replace(hint_tiles=0),
                        **{f"hint {n}": default._replace(hint_tiles=n) for n in HINTS}}
            same, times, median = logits_gpu.time_variants(calls, variants, args.rounds)
            lines.append(
                f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} n{next_n} pdl {default.pdl}  " + "  ".join(
                    f"{name} {median[name]:.2f} us ({logits_gpu.pct(nbytes, median[name], copy):.0f} %"
                    f"{'' if same[name] else ', DIFFERS'}) [" + " ".join(f"{t:.2f}" for t in times[name])
                    + "]" for name in variants))
            print(lines[-1], flush=True)
            records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                                next_n=next_n, bytes=nbytes, default=default._asdict(),
                                times_us=times, identical=same))
            del calls
    logits_gpu.report("exp_scorer_hint", copy, records, lines)


if __name__ == "__main__":
    main()
