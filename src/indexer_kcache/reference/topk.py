"""The top-k selection in pure torch: the ranking rule in code, on any device.

Row ``r`` of ``top_k_indices(logits, k, lengths)`` lists the columns ``c < lengths[r]`` of
the ``k`` largest values of the row, largest first; equal values come in column order;
NaN ranks below every number (``-inf`` included) and NaNs come in column order; ``-0.0``
equals ``+0.0``; a row with fewer than ``k`` eligible columns ends with ``-1``. bf16
logits rank as the float32 values they convert to exactly.

Written for clarity, not speed: one stable sort by value, then one stable sort by rank
class (number, NaN, ineligible column). Stable sorts keep the order of what they find
equal, so the columns of equal values stay in increasing order through both.
"""

from __future__ import annotations

import torch

__all__ = ["NUMBER", "NOT_A_NUMBER", "INELIGIBLE", "rank_classes", "top_k_indices"]

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


def top_k_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """int32 ``[rows, k]``: for each row, the eligible columns of the ``k`` largest values,
    ordered by value descending, then by column; ``-1`` past the eligible columns.

    ``logits``: float32 or bf16 ``[rows, cols]``; ``lengths``: ``[rows]`` (column ``c`` of
    row ``r`` is eligible iff ``c < lengths[r]``; default: every column).
    """
    rows, cols = logits.shape
    values = logits.float()
    values = torch.where(values == 0, torch.zeros_like(values), values)  # -0.0 ties +0.0
    classes = rank_classes(values, lengths)
    # Within the NaN and ineligible classes only the column order matters: give them all
    # the same value so that the first sort keeps them in column order.
    values = torch.where(classes == NUMBER, values, torch.full_like(values, float("-inf")))
    by_value = torch.sort(values, dim=1, descending=True, stable=True).indices
    by_class = torch.sort(classes.gather(1, by_value), dim=1, stable=True).indices
    order = by_value.gather(1, by_class)

    taken = min(k, cols)
    top = order[:, :taken]
    top = torch.where(classes.gather(1, top) == INELIGIBLE, -1, top)
    result = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    result[:, :taken] = top.to(torch.int32)
    return result
