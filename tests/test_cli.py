"""The command line: usage, the demo's building blocks and the CPU benchmark sweep."""

from __future__ import annotations

import json

import pytest
import torch

from indexer_kcache import __main__ as cli
from indexer_kcache import bench, demo, layout


def test_usage_without_a_command(capsys):
    assert cli.main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_usage_names_every_bench_section(capsys):
    cli.main([])
    out = capsys.readouterr().out
    assert all(section in out for section in ("store", "readers", "scorer", "top-k"))


def test_demo_help_prints_help_and_runs_nothing(capsys, monkeypatch):
    monkeypatch.setattr(demo, "run_case", lambda *a, **k: pytest.fail("the demo ran"))
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--help"])
    assert exit_.value.code == 0
    assert "usage: python -m indexer_kcache demo" in capsys.readouterr().out


def test_demo_batch_writes_one_key_per_group():
    for compress_ratio in (1, 2):
        batch = demo.make_batch(compress_ratio, "cpu", decode_seqs=4, prefill_tokens=64)
        pos, slots = batch["positions"], batch["kv_slot_mapping"]
        written = (pos + 1) % compress_ratio == 0
        assert pos.numel() == 4 + 64 and slots.shape == pos.shape
        assert slots[written].unique().numel() == int(written.sum())  # distinct slots


def test_cpu_bench_sweep_writes_json_and_table(tmp_path):
    result = bench.run_cpu(tokens=(1, 8), formats=("fp8", "mxfp4"), ratios=(1,))
    assert {r["impl"] for r in result["records"]} >= {"reference"}
    assert all(r["bytes"] > 0 and r["eager_us"] > 0 for r in result["records"])
    table = bench.format_table(result)
    assert "CPU ONLY" in table
    (tmp_path / "cpu.json").write_text(json.dumps(result))


def test_minimal_bytes_count():
    inputs = bench.make_inputs(64, "fp8", 2, "cpu")
    written = int(((inputs["positions"] + 1) % 2 == 0).sum())
    key_row, cos_sin_row = 2 * layout.HEAD_DIM, 4 * layout.ROPE_DIM  # bf16 keys, fp32 cos/sin
    assert bench.minimal_store_bytes(inputs) == 16 * 64 + written * (
        key_row + cos_sin_row + layout.cache_row_bytes(False))
    assert inputs["k_pre"].dtype == torch.bfloat16
    inputs = bench.make_inputs(64, "mxfp4", 1, "cpu", k_pre_dtype=torch.float32)
    assert inputs["k_pre"].dtype == torch.float32
    assert bench.minimal_store_bytes(inputs) == 16 * 64 + 64 * (
        2 * key_row + cos_sin_row + layout.cache_row_bytes(True))


def test_logits_and_topk_tables_and_plots(tmp_path):
    """The GPU sections' tables and plots from records of the committed format."""
    from indexer_kcache.bench import logits, topk

    result = {"gpu": "a GPU", "copy_GBps": 4000.0, "records": [
        dict(op="logits", impl="indexer_kcache", format="fp8", q_format="e4m3", batch=64,
             context=8192, next_n=1, heads=64, gpu_us=20.0, bytes=64 * 8192 * 132),
        dict(op="logits", impl="vllm-like-triton", format="fp8", q_format="e4m3", batch=64,
             context=8192, next_n=1, heads=64, gpu_us=30.0, bytes=64 * 8192 * 132),
        dict(op="topk", impl="indexer_kcache", rows=64, cols=8192, k=2048, gpu_us=10.0,
             bytes=64 * 8192 * 4),
        dict(op="topk", impl="torch-topk", rows=64, cols=8192, k=2048, gpu_us=70.0,
             bytes=64 * 8192 * 4),
    ]}
    assert "1.50x" in logits.format_table(result)
    assert "7.00x" in topk.format_table(result)
    for module in (logits, topk):
        path = tmp_path / f"{module.__name__}.png"
        assert module.plot(result, str(path)) in (True, False)  # False: no matplotlib
