"""Experiment: the scorer with programmatic dependent launch (the next call's programs
launched while this one runs: PDL_EARLY, PDL_AT_EXIT) and with ``relu(x) w`` computed as
``(x + |x|) (w / 2)`` (``relu_by_abs``), against its defaults, on the bench's shapes
(CUDA-graph replay of back-to-back calls over rotations larger than the L2; each variant
checked against the default's logits first).

    python benchmarks/exp_scorer_launch.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402
from indexer_kcache.bench.timing import copy_bandwidth_GBps, graph_time_us  # noqa: E402

SHAPES = {
    ("fp8", "e4m3"): [(1, 4096), (1, 131072), (8, 32768), (64, 8192), (64, 32768), (128, 65536)],
    ("mxfp4", "e4m3"): [(1, 4096), (8, 32768), (64, 32768), (128, 65536)],
    ("mxfp4", "mxfp4"): [(64, 32768)],
}
VARIANTS = {  # name: changes to the default settings
    "pdl early": dict(pdl=1),
    "pdl at exit": dict(pdl=2),
    "relu by abs": dict(relu_by_abs=True),
    "both (at exit)": dict(pdl=2, relu_by_abs=True),
}


def main():
    copy = copy_bandwidth_GBps()
    lines, records = [], []
    for (fmt, q_form), shapes in SHAPES.items():
        for batch, context in shapes:
            calls, nbytes = logits_gpu.make_calls(fmt, q_form, batch, context, 1)
            run, default, out = logits_gpu.ours(calls[0])
            run()
            want = out.clone()
            results = {"default": graph_time_us([logits_gpu.ours(c)[0] for c in calls], 40)}
            for name, changes in VARIANTS.items():
                settings = default._replace(**changes)
                run, _, out = logits_gpu.ours(calls[0], settings)
                run()
                if not torch.equal(out.view(torch.int32), want.view(torch.int32)):
                    results[name] = "differs"
                    continue
                results[name] = graph_time_us([logits_gpu.ours(c, settings)[0] for c in calls], 40)
            pct = {k: nbytes / (v * 1e-6) / 1e9 / copy * 100
                   for k, v in results.items() if isinstance(v, float)}
            lines.append(f"{fmt:5} {q_form:5} {batch:>3}x{context:<6} " + "  ".join(
                f"{k} {v:.1f} us ({pct[k]:.0f} %)" if isinstance(v, float) else f"{k} {v}"
                for k, v in results.items()))
            print(lines[-1], flush=True)
            records.append(dict(format=fmt, q_format=q_form, batch=batch, context=context,
                                bytes=nbytes, default=default._asdict(), results=results))
            del calls
    logits_gpu.report("exp_scorer_launch", copy, records, lines)


if __name__ == "__main__":
    main()
