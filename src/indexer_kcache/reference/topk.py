"""The top-k selection in pure torch: the ranking rule in code, on any device.

Row ``r`` of ``top_k_indices(logits, k, lengths)`` lists the columns ``c < lengths[r]`` of
the ``k`` largest values of the row, largest first; equal values come in column order;
NaN ranks below every number (``-inf`` included) and NaNs come in column order; ``-0.0``
equals ``+0.0``; a row with fewer than ``k`` eligible columns ends with ``-1``. bf16
logits rank as the float32 values they convert to exactly.

Written for clarity, not speed: one stable sort by value (of keys taken from the bits),
then one stable sort by rank class (number, NaN, ineligible column). Stable sorts keep
the order of what they find equal, so the columns of equal values stay in increasing
order through both.
"""

from __future__ import annotations

import torch

__all__ = ["NUMBER", "NOT_A_NUMBER", "INELIGIBLE", "kernel_keys", "order_keys", "rank_classes",
           "sample_threshold", "sample_threshold_from_prefix", "top_k_indices"]

# Rank classes, best first: every number ranks above every NaN, which ranks above every
# column past the row's length (never selected).
NUMBER = 0
NOT_A_NUMBER = 1
INELIGIBLE = 2


def rank_classes(logits: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """int64 ``[rows, cols]``: the rank class of every element (``NUMBER``, ``NOT_A_NUMBER``
    or ``INELIGIBLE``)."""
    rows, cols = logits.shape
    classes = torch.where(logits.isnan(), NOT_A_NUMBER, NUMBER)
    if lengths is not None:
        column = torch.arange(cols, device=logits.device)
        eligible = column[None, :] < lengths.to(device=logits.device, dtype=torch.int64)[:, None]
        classes = torch.where(eligible, classes, INELIGIBLE)
    return classes


def order_keys(logits: torch.Tensor) -> torch.Tensor:
    """int32 keys that order as the numbers of ``logits`` do, ``-0.0`` equal to ``+0.0``.

    Taken from the bits, not by float compares, which a CPU flushing subnormals
    (``torch.set_flush_denormal(True)``) would read as zeros: a float's bits order as
    integers as its magnitude does, so a negative one's are flipped below zero."""
    if logits.dtype == torch.bfloat16:  # a bf16 value's bits are its float32's top half
        bits = logits.view(torch.int16).to(torch.int32) << 16
    else:
        bits = logits.view(torch.int32)
    bits = torch.where(bits == torch.iinfo(torch.int32).min, 0, bits)  # -0.0 ties +0.0
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def kernel_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 holding the kernels' uint32 keys of ``logits``: ``order_keys`` shifted to
    unsigned, NaN 0 (below every number's key)."""
    return torch.where(logits.isnan(), 0, order_keys(logits).to(torch.int64) + 2**31)


def sample_threshold(keys: torch.Tensor, rank: int, bits: int = 16, digit_bits: int = 1) -> int:
    """The Triton sample kernel's threshold for its sampled ``keys`` (``kernel_keys`` of the
    eligible sampled columns): the ``rank``-th largest key, decided ``digit_bits`` a pass
    from the top until ``bits`` bits are decided past the first pass that splits the keys
    at or above it. It decides how much work the kernels do, never their result."""
    threshold, above, beyond, spent, split, shift = 0, len(keys), 0, 0, False, 32 - digit_bits
    while spent < bits and shift >= 0:
        counts = [above] + [int((keys >= threshold | d << shift).sum())
                            for d in range(1, 1 << digit_bits)]
        digit = max(d for d, count in enumerate(counts) if count >= rank)
        past = counts[digit + 1] if digit + 1 < len(counts) else beyond
        split = split or counts[digit] < above or past > beyond
        spent += digit_bits if split else 0
        threshold |= digit << shift
        above, beyond, shift = counts[digit], past, shift - digit_bits
    return threshold


def sample_threshold_from_prefix(keys: torch.Tensor, rank: int, bits: int = 16) -> int:
    """``sample_threshold`` of one-bit passes in closed form: no pass splits the keys before
    the first bit where the largest and the smallest of them differ, and every pass decides
    a bit of the ``rank``-th largest key, so the threshold is that key's top
    ``shared + bits`` bits (all 32 at most), ``shared`` the bits the largest and the
    smallest share."""
    largest, smallest = int(keys.max()), int(keys.min())
    kept = min(32 - (largest ^ smallest).bit_length() + bits, 32)
    target = int(keys.sort(descending=True).values[rank - 1])
    return target >> (32 - kept) << (32 - kept)


def top_k_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """int32 ``[rows, k]``: for each row, the eligible columns of the ``k`` largest values,
    ordered by value descending, then by column; ``-1`` past the eligible columns.

    ``logits``: float32 or bf16 ``[rows, cols]``; ``lengths``: ``[rows]`` (column ``c`` of
    row ``r`` is eligible iff ``c < lengths[r]``; default: every column).
    """
    rows, cols = logits.shape
    keys = order_keys(logits)
    classes = rank_classes(logits, lengths)
    # Within the NaN and ineligible classes only the column order matters: give them all
    # the same key so that the first sort keeps them in column order.
    keys = torch.where(classes == NUMBER, keys, torch.iinfo(torch.int32).min)
    by_value = torch.sort(keys, dim=1, descending=True, stable=True).indices
    by_class = torch.sort(classes.gather(1, by_value), dim=1, stable=True).indices
    order = by_value.gather(1, by_class)

    taken = min(k, cols)
    top = order[:, :taken]
    top = torch.where(classes.gather(1, top) == INELIGIBLE, -1, top)
    result = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    result[:, :taken] = top.to(torch.int32)
    return result
