"""Experiment: the scorer's few-long-rows shapes as one wave of long programs (at most one
an SM, released at once, with and without the L2 hints) against the default settings
(about four programs an SM, released as they exit). The variants are timed in
alternation, ``--rounds`` times each; each one's logits are checked bit for bit against
the default's first.

    python benchmarks/exp_scorer_one_wave.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps  # noqa: E402
from indexer_kcache.checks import PDL_EARLY  # noqa: E402

SHAPES = [("fp8", "e4m3", 1, 131072), ("fp8", "e4m3", 8, 32768), ("mxfp4", "e4m3", 1, 131072),
          ("mxfp4", "e4m3", 8, 32768)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    copy = copy_bandwidth_GBps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines, records = [], []
    for fmt, q_form, batch, context in SHAPES:
        calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, 1)
        _, default, _ = logits_gpu.ours(calls[0])
        splits = max(sms // batch, 1)  # one wave: at most one program an SM
        wave = default._replace(splits=splits, pdl=PDL_EARLY, hint_tiles=0)
        variants = {"default": default, "one wave": wave,
                    "one wave, hint 2": wave._replace(hint_tiles=2)}
        same, times, median = logits_gpu.time_variants(calls, variants, args.rounds)
        lines.append(
            f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} splits {default.splits}/{splits}  "
            + "  ".join(f"{name} {median[name]:.2f} us ({logits_gpu.pct(nbytes, median[name], copy):.0f} %"
                        f"{'' if same[name] else ', DIFFERS'})" for name in variants))
        print(lines[-1], flush=True)
        records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                            bytes=nbytes, default=default._asdict(), one_wave_splits=splits,
                            times_us=times, identical=same))
        del calls
    logits_gpu.report("exp_scorer_one_wave", copy, records, lines)


if __name__ == "__main__":
    main()
