"""Set one GPU's committed bench records beside another's, case by case.

The H100 and the H200 have the same SMs at the same clocks and differ in memory bandwidth
(a device-to-device copy: about 3.0 against 4.2 TB/s). So a kernel that moves bytes as fast
as the memory takes them runs in about copy(H100) / copy(H200) of its H100 time on the H200,
and one held back by its instructions (or by launch latency) runs in the same time on both.
The last column, the second GPU's time over the first's, says which each case is:

    python benchmarks/compare_gpus.py                 # h100.json, then h200.json
    python benchmarks/compare_gpus.py --ops logits    # the scorer alone
    python benchmarks/compare_gpus.py --plot benchmarks/results/h100-vs-h200.png
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


def _pairs(first: tuple[dict, dict], second: tuple[dict, dict], ops: list[str] | None):
    """(op, impl, shape, first us, second us, copy ratio) of every case both GPUs timed,
    from two ``_records`` results."""
    (first_result, first_cases), (second_result, second_cases) = first, second
    for key, (first_us, first_copy) in first_cases.items():
        op, impl, shape = key
        if (ops and op not in ops) or key not in second_cases:
            continue
        second_us, second_copy = second_cases[key]
        copy_ratio = ((first_copy or first_result["copy_GBps"])
                      / (second_copy or second_result["copy_GBps"]))
        yield op, impl, shape, first_us, second_us, copy_ratio


def compare(first: str, second: str, ops: list[str] | None = None) -> str:
    first_records, second_records = _records(first), _records(second)
    first_result, second_result = first_records[0], second_records[0]
    lines = [f"{first}: {first_result['gpu']}, copy {first_result['copy_GBps']:.0f} GB/s;  "
             f"{second}: {second_result['gpu']}, copy {second_result['copy_GBps']:.0f} GB/s  "
             f"(store's run; the scorer's and top-k's records carry their own)",
             f"{'op':<10} {'impl':<18} {first + ' us':>9} {second + ' us':>9} "
             f"{'copy ratio':>10} {'time ratio':>10}  case"]
    for op, impl, shape, first_us, second_us, copy_ratio in _pairs(first_records,
                                                                   second_records, ops):
        lines.append(f"{op:<10} {impl:<18} {first_us:9.2f} {second_us:9.2f} {copy_ratio:10.2f} "
                     f"{second_us / first_us:10.2f}  {_shape_text(shape)}")
    return "\n".join(lines)


def plot(first: str, second: str, path: str) -> bool:
    """The library's cases, the second GPU's time over the first's against the first's time,
    one colour an op, the copy ratio drawn across: a PNG at ``path``. A ratio above 1.2
    is drawn on the top edge with its value."""
    from indexer_kcache.bench.timing import pyplot, save_plot

    plt = pyplot()
    if plt is None:
        return False
    pairs = [p for p in _pairs(_records(first), _records(second), None)
             if p[1] == "indexer_kcache"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    top = 1.2  # cases above it (records of two revisions) are drawn on the edge, as triangles
    for op in dict.fromkeys(p[0] for p in pairs):
        mine = [p for p in pairs if p[0] == op]
        ratios = [p[4] / p[3] for p in mine]
        dots = ax.scatter([p[3] for p in mine], [min(r, top) for r in ratios], label=op, s=18)
        over = [(p[3], r) for p, r in zip(mine, ratios, strict=True) if r > top]
        for time_us, ratio in over:
            ax.scatter([time_us], [top], marker="^", s=40, color=dots.get_facecolor()[0])
            ax.annotate(f"{ratio:.2f}", (time_us, top), textcoords="offset points",
                        xytext=(6, -10), fontsize=8)
    ax.set_ylim(0.3, top + 0.03)  # room below the cases for the legend
    copy_ratio = sorted(p[5] for p in pairs)[len(pairs) // 2]
    ax.axhline(copy_ratio, color="grey", linestyle="--", linewidth=1,
               label=f"bound by memory ({copy_ratio:.2f}: copy {first} / copy {second})")
    ax.axhline(1.0, color="black", linewidth=1, label="bound by instructions or latency (1.0)")
    ax.set_xscale("log")
    ax.set_xlabel(f"{first} time, us (CUDA graph)")
    ax.set_ylabel(f"{second} time / {first} time")
    ax.set_title(f"Each case of the bench, {second} against {first}")
    return save_plot(fig, ax, path, grid="both", legend_size=8, legend_loc="lower left")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", default="h100", help="results prefix of the first GPU")
    parser.add_argument("--second", default="h200", help="results prefix of the second GPU")
    parser.add_argument("--ops", nargs="*", help="only these ops (store, gather, logits, topk, ...)")
    parser.add_argument("--plot", metavar="PNG", help="also draw the library's cases to this file")
    args = parser.parse_args()
    print(compare(args.first, args.second, args.ops))
    if args.plot and not plot(args.first, args.second, args.plot):
        print("no plot: matplotlib is not installed")


if __name__ == "__main__":
    main()
