"""Experiment: ``next_n`` 4 with fewer query rows a program. The default stacks a
sequence's four rows in one dot (each key read once, 256 columns, two programs an SM);
two or one rows a program read each page two or four times, from programs that run side
by side (the row groups of a sequence are neighbours in the grid), so that the L2 may
serve the repeats, with fewer registers and more programs an SM; with the default split
and with half as many programs ("x2"). Variants timed in alternation, ``--rounds`` times
each; each one's logits checked bit for bit against the default's.

    python benchmarks/exp_scorer_rows.py [--rounds 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import logits_gpu  # noqa: E402

SHAPES = {  # (cache, query form): [(batch, context, next_n)]
    ("fp8", "e4m3"): [(64, 8192, 4), (64, 32768, 4)],
    ("mxfp4", "e4m3"): [(64, 8192, 4), (64, 32768, 4)],
}


def variants(default, case):
    found = {"default": default}
    for rows in (2, 1):
        for longer in (1, 2):
            # One row of MXFP4 keys takes the register cap its settings would give it.
            cap = 128 if rows == 1 and default.relu_by_abs else 0
            found[f"rows {rows} x{longer}"] = default._replace(
                rows=rows, splits=max(default.splits // longer, 1), max_registers=cap)
    return found


if __name__ == "__main__":
    logits_gpu.variant_experiment("exp_scorer_rows", SHAPES, variants,
                                  logits_gpu.experiment_rounds(__doc__))
