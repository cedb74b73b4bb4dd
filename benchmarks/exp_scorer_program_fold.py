"""The scorer with the program-wide MXFP4 fold forced on and off (``LogitsSettings.program_fold``,
every other setting the default), at the shapes where the settings leave it off: several
rows a program (``next_n`` 2 and 4) and short programs (one long row, one short one).
Each variant is checked against the contract's bound, then timed as the bench times it;
the variants alternate for ``--rounds`` rounds:

    python benchmarks/exp_scorer_program_fold.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from indexer_kcache import logits
from indexer_kcache.bench import logits as bench_logits
from indexer_kcache.bench.timing import graph_time_us

CASES = [("mxfp4", q, b, ctx, n) for q in ("e4m3", "mxfp4") for b, ctx, n in (
    (64, 8192, 4), (64, 32768, 4), (64, 32768, 2), (1, 131072, 1), (1, 4096, 1))]


@contextlib.contextmanager
def program_fold(on: bool):
    """The default settings with ``program_fold`` set to ``on``."""
    default = logits.logits_settings
    with default.override(lambda *args, **kwargs: default(*args, **kwargs)._replace(
            program_fold=on)):
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=40, help="calls per CUDA graph")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(torch.cuda.get_device_name())
    for fmt, q_form, batch, context, next_n in CASES:
        calls, _ = bench_logits.make_calls(fmt, q_form, batch, context, next_n, device)
        times = {False: [], True: []}
        checks = []
        for on in (False, True):
            with program_fold(on):
                checks.append(bench_logits.within_bound(calls[0], True, False))
        for _ in range(args.rounds):
            for on in (False, True):
                with program_fold(on):
                    times[on].append(graph_time_us([bench_logits.scorer_call(c) for c in calls],
                                                   args.calls))
        off, on = min(times[False]), min(times[True])
        print(f"{q_form:5} {batch:3} x {context:<6} next_n {next_n}: per key "
              f"{' '.join(f'{t:7.2f}' for t in times[False])}  per program "
              f"{' '.join(f'{t:7.2f}' for t in times[True])} us  best {off / on:.3f}x  "
              f"{'ok' if all(checks) else 'MISMATCH'}", flush=True)
        del calls


if __name__ == "__main__":
    main()
