"""Experiment: what a reader's output allocation costs from Python on a CUDA device, two
tensors (what ``gather_indexer_k`` returns) against one allocation viewed as both.

    python benchmarks/exp_output_alloc.py
"""

from __future__ import annotations

import statistics
import timeit

import torch

ROWS, VALUE_BYTES, SCALE_BYTES = 64, 128, 4
DEVICE = torch.device("cuda", 0)
U8 = torch.uint8


def two_tensors():
    return (torch.empty(ROWS, VALUE_BYTES, dtype=U8, device=DEVICE),
            torch.empty(ROWS, SCALE_BYTES, dtype=U8, device=DEVICE))


def one_tensor():
    return torch.empty(ROWS, VALUE_BYTES, dtype=U8, device=DEVICE)


def one_buffer_as_strided():
    buf = torch.empty(ROWS * (VALUE_BYTES + SCALE_BYTES), dtype=U8, device=DEVICE)
    return (buf.as_strided((ROWS, VALUE_BYTES), (VALUE_BYTES, 1)),
            buf.as_strided((ROWS, SCALE_BYTES), (SCALE_BYTES, 1), ROWS * VALUE_BYTES))


def one_buffer_split():
    buf = torch.empty(ROWS, VALUE_BYTES + SCALE_BYTES, dtype=U8, device=DEVICE)
    return buf.split([VALUE_BYTES, SCALE_BYTES], 1)


def one_buffer_sliced():
    buf = torch.empty(ROWS * (VALUE_BYTES + SCALE_BYTES), dtype=U8, device=DEVICE)
    return (buf[:ROWS * VALUE_BYTES].view(ROWS, VALUE_BYTES),
            buf[ROWS * VALUE_BYTES:].view(ROWS, SCALE_BYTES))


def main() -> None:
    forms = (two_tensors, one_tensor, one_buffer_as_strided, one_buffer_split, one_buffer_sliced)
    for form in forms:
        form()
    times = {form.__name__: [] for form in forms}
    for _ in range(7):  # interleaved rounds: the host's speed drifts
        for form in forms:
            times[form.__name__].append(
                min(timeit.repeat(form, number=5000, repeat=3)) / 5000 * 1e6)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  (median of 7 rounds)")
    for name, values in times.items():
        print(f"  {name:22} {statistics.median(values):6.2f} us")


if __name__ == "__main__":
    main()
