"""The store at ratio 2 and 256K tokens with L2 hints of the indices a program ahead
(``StoreSettings.hint_ahead``) at several distances, beside the same setting without
hints, in alternated rounds.

    python benchmarks/exp_store_hint.py [--calls 50] [--rounds 2]

Each program of the pairs path first hints into L2 the slots and positions of the program
``hint_ahead`` further on, so that program's first round trip (indices, then key rows)
starts from L2. Every setting's bytes are checked against the reference on a batch with
poisoned keys, then timed by CUDA-graph replay (``store_ratio2_gpu.Run``). The launcher
hints ``store.HINT_AHEAD`` programs ahead for FP8 and not for MXFP4 (BENCHMARKS.md).
"""

from __future__ import annotations

from store_ratio2_gpu import DEFAULT_SETTINGS, experiment, use

TOKENS = 262144
AHEAD = (660, 1320, 2640, 5280)  # about a half, one, two and four rounds of resident programs


def main() -> None:
    args, run = experiment(__doc__)
    for rnd in range(args.rounds):
        for fmt in ("fp8", "mxfp4", "fp8-mx"):
            fp4 = fmt == "mxfp4"
            plain = DEFAULT_SETTINGS(TOKENS, 2, fp4, False)._replace(hint_ahead=0)
            run.measure(fmt, 2, TOKENS, plain, f"no-hint{rnd}")
            for ahead in (AHEAD if fmt == "fp8" else AHEAD[1:3]):
                run.measure(fmt, 2, TOKENS, plain._replace(hint_ahead=ahead), f"hint{rnd}")
    use(None)
    run.save("store_hint")


if __name__ == "__main__":
    main()
