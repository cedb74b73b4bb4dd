"""Top-k A/B across revisions: the default settings of whichever ``indexer_kcache`` is
imported, at the issue's shapes, beside ``torch.topk`` (or, with ``--variants``,
``topk_gpu.py``'s candidate settings instead of ``torch.topk``).

    PYTHONPATH=<a revision's src> python benchmarks/topk_revisions.py LABEL [--offset 50]
        [--variants [--only ...]] [--shapes 16x65536 ...]

Run it alternately on two revisions on one GPU: each row checks the result of two inputs
against the reference, then prints the median and all three of three CUDA-graph timings
(40 calls rotating over logits buffers that exceed the L2, as the bench does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from indexer_kcache import topk  # noqa: E402
from indexer_kcache.bench import graph_time_us  # noqa: E402
from indexer_kcache.bench.topk import SHAPES, make_logits  # noqa: E402
from indexer_kcache.reference import topk as reference  # noqa: E402
from topk_gpu import candidate_settings  # noqa: E402

K = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("label")
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--offset", type=float, default=0.0,
                        help="added to every logit (the sample's threshold with an offset)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="with --variants: these labels (and the default) only")
    parser.add_argument("--shapes", nargs="+", default=None, metavar="ROWSxCOLS",
                        help="only these shapes (default: the issue's five)")
    args = parser.parse_args()
    device = torch.device("cuda")
    shapes = ([tuple(int(n) for n in shape.split("x")) for shape in args.shapes]
              if args.shapes else SHAPES)
    for rows, cols in shapes:
        logits = [x + args.offset for x in make_logits(rows, cols, device, seed=rows + cols)]
        outs = [torch.empty(rows, K, dtype=torch.int32, device=device) for _ in logits]
        settings = (candidate_settings(rows, cols, K, quick=False) if args.variants
                    else {"default": topk.topk_settings(rows, cols, K)})
        if args.only is not None:
            settings = {name: s for name, s in settings.items()
                        if name == "default" or name in args.only}
        for name, setting in settings.items():
            with topk.topk_settings.override(setting):
                calls = [lambda x=x, o=o: topk.top_k_indices(x, K, out=o)
                         for x, o in zip(logits, outs, strict=True)]
                exact = True
                for i in {0, 1 % len(calls)}:
                    calls[i]()
                    exact &= torch.equal(outs[i], reference.top_k_indices(logits[i], K))
                times = [graph_time_us(calls, 40) for _ in range(3)]
            print(f"{args.label:5} {rows:4}x{cols:<7} {name:14} {'ok ' if exact else 'BAD'} "
                  f"median {statistics.median(times):7.2f} us  all "
                  + " ".join(f"{t:.2f}" for t in times), flush=True)
        if not args.variants:
            theirs = [lambda x=x: torch.topk(x, K, dim=1, sorted=True) for x in logits]
            print(f"{args.label:5} {rows:4}x{cols:<7} torch.topk          "
                  f"{graph_time_us(theirs, 40):7.2f} us", flush=True)
        del logits, outs


if __name__ == "__main__":
    main()
