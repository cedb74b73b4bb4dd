"""Collect every op's committed H200 records into ``benchmarks/results/h200.json``.

The store and the readers are measured by one bench run (``python -m indexer_kcache bench
--sections store readers``), which writes ``h200.json``; the scorer and the top-k by runs
of their own (``--sections logits`` -> ``h200-scoring.json``, ``--sections topk`` ->
``h200-topk.json``). This copies the latter two files' records into ``h200.json`` (those of
an earlier collection replaced), each record with its own run's ``copy_GBps``,
``empty_launch_graph_us``, ``empty_launch_eager_us`` and ``source`` (the file it came from):
the file-level figures of ``h200.json`` stay those of the store's run. Re-run it after
committing a new run of any of the three.

    python benchmarks/collect_results.py
"""

from __future__ import annotations

import json
import os

RESULTS = os.path.join(os.path.dirname(__file__), "results")
TARGET = "h200.json"
SOURCES = {"logits": "h200-scoring.json", "topk": "h200-topk.json"}
RUN_FIELDS = ("copy_GBps", "empty_launch_graph_us", "empty_launch_eager_us")


def _load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def main() -> None:
    target = _load(TARGET)
    records = [r for r in target["records"] if r.get("op") not in SOURCES]
    mismatches = [m for m in target["byte_mismatches"]
                  if not any(m.startswith(op) for op in SOURCES)]
    for op, name in SOURCES.items():
        source = _load(name)
        run = {field: source[field] for field in RUN_FIELDS}
        records += [dict(r, **run, source=name) for r in source["records"] if r["op"] == op]
        mismatches += source["byte_mismatches"]
    target.update(records=records, byte_mismatches=mismatches,
                  collected_from=sorted(SOURCES.values()))
    with open(os.path.join(RESULTS, TARGET), "w") as f:
        json.dump(target, f, indent=1)
        f.write("\n")
    copied = ", ".join(f"{op} from {name}" for op, name in SOURCES.items())
    print(f"{TARGET}: {len(records)} records ({copied})")


if __name__ == "__main__":
    main()
