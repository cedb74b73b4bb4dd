"""The scorer at a few of the bench's shapes, for A/B runs of two revisions on one host
(run it once per revision's package, e.g. with ``PYTHONPATH`` set to the other's ``src``):

    python benchmarks/scorer_cases.py [--copy-GBps 4250]

Each shape is checked against the contract's bound (``mismatches``), then timed as the
bench times it (CUDA-graph replay over calls that rotate over more keys than the L2 holds).
"""

from __future__ import annotations

import argparse

import indexer_kcache
from indexer_kcache.bench import logits as bench_logits

CASES = [("mxfp4", "bf16", 64, 32768, 1), ("mxfp4", "bf16", 128, 65536, 1),
         ("mxfp4", "bf16", 8, 32768, 1), ("mxfp4", "bf16", 64, 8192, 1),
         ("mxfp4", "bf16", 64, 8192, 4), ("mxfp4", "e4m3", 64, 32768, 1),
         ("fp8", "bf16", 64, 32768, 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copy-GBps", type=float, default=4250.0,
                        help="the copy bandwidth the % column divides by")
    copy = parser.parse_args().copy_GBps
    result = {"records": [], "byte_mismatches": []}
    bench_logits.run_gpu(result, cases=CASES, peers=False)
    package = indexer_kcache.__file__
    for r in result["records"]:
        share = 100 * r["bytes"] / r["gpu_us"] / 1e3 / copy
        print(f"{r['format']:6} {r['q_format']:5} {r['batch']:4}x{r['context']:<6} "
              f"n{r['next_n']} {r['gpu_us']:8.1f} us {share:5.1f} %")
    print(f"{package}: mismatches {result['byte_mismatches']}")


if __name__ == "__main__":
    main()
