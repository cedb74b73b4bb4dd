"""The ratio-2 store at 256K tokens under several register caps, after the instruction cuts
(fewer registers a thread than the cap of 96 the pairs path was tuned with: 84 for FP8
uncapped, so 80 and 88 allow more programs an SM without spilling).

    python benchmarks/exp_store_caps.py [--calls 50] [--rounds 1]

Every setting's bytes are checked against the reference on a batch with poisoned keys, then
timed by CUDA-graph replay (``store_ratio2_gpu.Run``).
"""

from __future__ import annotations

from store_ratio2_gpu import DEFAULT_SETTINGS, experiment, use

TOKENS = 262144
CAPS = {"fp8": (96, 88, 80, 0), "mxfp4": (96, 88)}


def main() -> None:
    args, run = experiment(__doc__, rounds=1)
    for rnd in range(args.rounds):
        for fmt, caps in CAPS.items():
            default = DEFAULT_SETTINGS(TOKENS, 2, fmt == "mxfp4", False)
            for cap in caps:
                run.measure(fmt, 2, TOKENS, default._replace(max_registers=cap), f"cap{rnd}")
    use(None)
    run.save("store_caps")


if __name__ == "__main__":
    main()
