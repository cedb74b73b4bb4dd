"""Set one GPU's committed bench records beside another's, case by case.

The H100 and the H200 have the same SMs at the same clocks and differ in memory bandwidth
(a device-to-device copy: about 3.0 against 4.2 TB/s). So a kernel that moves bytes as fast
as the memory takes them runs in about copy(H100) / copy(H200) of its H100 time on the H200,
and one held back by its instructions (or by launch latency) runs in the same time on both.
The last column, the second GPU's time over the first's, says which each case is:

    python benchmarks/compare_gpus.py                 # h100.json, then h200.json
    python benchmarks/compare_gpus.py --ops logits    # the scorer alone
"""

from __future__ import annotations

import argparse
import json
import os

RESULTS = os.path.join(os.path.dirname(__file__), "results")
SHAPE_FIELDS = ("format", "q_format", "compress_ratio", "tokens", "batch", "context", "next_n",
                "rows", "cols", "k")


def _records(gpu: str) -> tuple[dict, dict]:
    with open(os.path.join(RESULTS, f"{gpu}.json")) as f:
        result = json.load(f)
    by_case = {}
    for record in result["records"]:
        time_us = record.get("gpu_us", record.get("graph_us"))
        if time_us is None or time_us != time_us:  # no graph time, or NaN
            continue
        shape = tuple(record.get(field) for field in SHAPE_FIELDS)
        by_case[(record["op"], record["impl"], shape)] = (time_us, record.get("copy_GBps"))
    return result, by_case


def _shape_text(shape: tuple) -> str:
    return " ".join(f"{field}={value}" for field, value in zip(SHAPE_FIELDS, shape, strict=True)
                    if value is not None)


def compare(first: str, second: str, ops: list[str] | None = None) -> str:
    first_result, first_cases = _records(first)
    second_result, second_cases = _records(second)
    lines = [f"{first}: {first_result['gpu']}, copy {first_result['copy_GBps']:.0f} GB/s;  "
             f"{second}: {second_result['gpu']}, copy {second_result['copy_GBps']:.0f} GB/s  "
             f"(store's run; the scorer's and top-k's records carry their own)",
             f"{'op':<10} {'impl':<18} {first + ' us':>9} {second + ' us':>9} "
             f"{'copy ratio':>10} {'time ratio':>10}  case"]
    for key, (first_us, first_copy) in first_cases.items():
        op, impl, shape = key
        if (ops and op not in ops) or key not in second_cases:
            continue
        second_us, second_copy = second_cases[key]
        copy_ratio = ((first_copy or first_result["copy_GBps"])
                      / (second_copy or second_result["copy_GBps"]))
        lines.append(f"{op:<10} {impl:<18} {first_us:9.2f} {second_us:9.2f} {copy_ratio:10.2f} "
                     f"{second_us / first_us:10.2f}  {_shape_text(shape)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", default="h100", help="results prefix of the first GPU")
    parser.add_argument("--second", default="h200", help="results prefix of the second GPU")
    parser.add_argument("--ops", nargs="*", help="only these ops (store, gather, logits, topk, ...)")
    args = parser.parse_args()
    print(compare(args.first, args.second, args.ops))


if __name__ == "__main__":
    main()
