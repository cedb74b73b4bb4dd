"""The README's runnable examples run as written (under the interpreter on a CPU)."""

from __future__ import annotations

import pathlib
import re

import torch

import indexer_kcache as ik

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _block_starting(text: str) -> str:
    found = [b for b in _python_blocks() if b.lstrip().startswith(text)]
    assert len(found) == 1, f"one README block starting {text!r}, found {len(found)}"
    return found[0]


def test_the_scoring_and_top_k_examples_run_as_written():
    namespace: dict = {}
    exec(_block_starting("import torch\nimport indexer_kcache as ik"), namespace)  # noqa: S102
    exec(_block_starting("lengths = ik.lengths_from_context"), namespace)  # noqa: S102
    logits, picked = namespace["logits"], namespace["picked"]
    batch, context = namespace["B"], namespace["context"]
    assert logits.shape == (batch, context) and torch.isfinite(logits).all()
    assert torch.equal(picked, ik.top_k_indices(logits, 256, backend="reference"))
    # torch.topk's ties may order differently; its values may not.
    top = namespace["top"]
    assert torch.equal(logits.gather(1, top), logits.gather(1, picked.long()))
