"""The committed bench results: each GPU's collection holds its sections' latest runs, and
the comparison of two GPUs covers every case both measured."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_a_collection_holds_its_sections_latest_runs(gpu):
    with open(os.path.join(BENCHMARKS, "results", f"{gpu}.json")) as f:
        committed = json.load(f)
    assert committed == _script("collect_results").collected(gpu), (
        f"re-run: python benchmarks/collect_results.py --gpu {gpu}")
    assert committed["byte_mismatches"] == []


def test_two_gpus_compared_case_by_case():
    table = _script("compare_gpus").compare("h100", "h200", ops=["logits"]).splitlines()
    with open(os.path.join(BENCHMARKS, "results", "h100-scoring.json")) as f:
        timed = [r for r in json.load(f)["records"] if r["gpu_us"] == r["gpu_us"]]
    rows = table[2:]
    assert len(rows) == len(timed) and all(row.startswith("logits ") for row in rows)
    time_ratios = [float(row.split()[5]) for row in rows]
    assert all(0.3 < ratio < 5 for ratio in time_ratios)
