"""Collect every op's committed records of one GPU into ``benchmarks/results/<gpu>.json``.

The store and the readers are measured by one bench run (``python -m indexer_kcache bench
--sections store readers``), which writes ``<gpu>.json``; the scorer and the top-k by runs
of their own (``--sections logits`` -> ``<gpu>-scoring.json``, ``--sections topk`` ->
``<gpu>-topk.json``). This copies the latter two files' records into ``<gpu>.json`` (those of
an earlier collection replaced), each record with its own run's ``copy_GBps``,
``empty_launch_graph_us``, ``empty_launch_eager_us`` and ``source`` (the file it came from):
the file-level figures of ``<gpu>.json`` stay those of the store's run. Re-run it after
committing a new run of any of the three.

    python benchmarks/collect_results.py            # h200.json
    python benchmarks/collect_results.py --gpu h100 # h100.json
"""

from __future__ import annotations

import argparse
import json
import os

RESULTS = os.path.join(os.path.dirname(__file__), "results")
SOURCE_SUFFIXES = {"logits": "-scoring.json", "topk": "-topk.json"}
RUN_FIELDS = ("copy_GBps", "empty_launch_graph_us", "empty_launch_eager_us")


def _load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def collected(gpu: str) -> dict:
    """``<gpu>.json`` with the records of ``<gpu>-scoring.json`` and ``<gpu>-topk.json``."""
    sources = {op: gpu + suffix for op, suffix in SOURCE_SUFFIXES.items()}
    target = _load(f"{gpu}.json")
    records = [r for r in target["records"] if r.get("op") not in sources]
    mismatches = [m for m in target["byte_mismatches"]
                  if not any(m.startswith(op) for op in sources)]
    for op, name in sources.items():
        source = _load(name)
        run = {field: source[field] for field in RUN_FIELDS}
        records += [dict(r, **run, source=name) for r in source["records"] if r["op"] == op]
        mismatches += source["byte_mismatches"]
    return dict(target, records=records, byte_mismatches=mismatches,
                collected_from=sorted(sources.values()))


def collect(gpu: str) -> str:
    result = collected(gpu)
    with open(os.path.join(RESULTS, f"{gpu}.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return f"{gpu}.json: {len(result['records'])} records (from {', '.join(result['collected_from'])})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200", help="the results' file prefix (default h200)")
    print(collect(parser.parse_args().gpu))


if __name__ == "__main__":
    main()
