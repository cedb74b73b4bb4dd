"""The store at ratio 2 and 256K tokens with L2 hints of a later program's key and cos/sin
rows (``StoreSettings.rows_ahead``) beside the launcher's setting, in alternated rounds.

    python benchmarks/exp_store_rows_ahead.py [--calls 50] [--rounds 2]   (at 39c5434)

Not kept (slower: BENCHMARKS.md, ratio 2): the kernel's ``ROWS_AHEAD`` and the
setting's ``rows_ahead`` exist at 39c5434 only, where this script runs.

The pairs path asks for a program's key rows once its slots and positions are in: two
round trips, of which the indices' is taken from L2 by ``hint_ahead``. With
``rows_ahead`` a program also reads the (hinted) indices of the program that many
further on and hints the rows that program will read, so both of its round trips can end
on chip. MXFP4 is also tried with 32 pairs a program (two threads a key instead of four:
fewer instructions a key, more registers), which hides less latency without the rows'
hints. Every setting's bytes are checked against the reference on a batch with poisoned
keys, then timed by CUDA-graph replay (``store_ratio2_gpu.Run``).
"""

from __future__ import annotations

from store_ratio2_gpu import DEFAULT_SETTINGS, experiment, use

TOKENS = 262144
# (format, changes to the launcher's setting)
VARIANTS = [
    ("fp8", {}),
    ("fp8", dict(hint_ahead=660, rows_ahead=330)),
    ("fp8", dict(hint_ahead=1320, rows_ahead=330)),
    ("fp8", dict(hint_ahead=1320, rows_ahead=660)),
    ("fp8", dict(hint_ahead=2640, rows_ahead=1320)),
    ("mxfp4", {}),
    ("mxfp4", dict(hint_ahead=660, rows_ahead=330)),
    ("mxfp4", dict(hint_ahead=1320, rows_ahead=660)),
    ("mxfp4", dict(tokens_per_program=32, max_registers=0)),
    ("mxfp4", dict(tokens_per_program=32, max_registers=0, hint_ahead=1320, rows_ahead=660)),
    ("mxfp4", dict(tokens_per_program=32, max_registers=128, hint_ahead=1320, rows_ahead=660)),
    ("fp8-mx", {}),
    ("fp8-mx", dict(hint_ahead=1320, rows_ahead=660)),
]


def main() -> None:
    args, run = experiment(__doc__)
    for rnd in range(args.rounds):
        for fmt, changes in VARIANTS:
            setting = DEFAULT_SETTINGS(TOKENS, 2, fmt == "mxfp4", False)._replace(**changes)
            run.measure(fmt, 2, TOKENS, setting, f"{'rows' if changes else 'default'}{rnd}")
    use(None)
    run.save("store_rows_ahead")


if __name__ == "__main__":
    main()
