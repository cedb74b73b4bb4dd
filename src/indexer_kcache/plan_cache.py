"""Plans of past calls, found again by a call's options and its tensors' metadata.

A checked call's plan holds for any later call with the same non-tensor options whose
tensors have the same Python type, dtype, device, ``requires_grad``, rank, sizes and
strides, except the sizes that only say how many tokens there are. Reading those in Python
costs about 25 attribute reads per call (two to three microseconds); torch's C++
``TensorGuards``, the check torch.compile runs on its graphs' inputs before each call,
compares them in well under one. Where a torch build has no usable ``TensorGuards``,
``MetadataGuard`` compares the same properties in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class MetadataGuard:
    """``TensorGuards``' check in Python: same constructor and ``check``."""

    def __init__(self, *tensors: torch.Tensor, dynamic_dims_sizes: list,
                 dynamic_dims_strides: list) -> None:
        self.expected = [
            (type(t), t.dtype, t.device, t.requires_grad, tuple(sizes), tuple(strides))
            for t, sizes, strides in zip(tensors, dynamic_dims_sizes, dynamic_dims_strides,
                                         strict=True)
        ]

    def check(self, *tensors) -> bool:
        for t, (cls, dtype, device, requires_grad, sizes, strides) in zip(
                tensors, self.expected, strict=True):
            if (type(t) is not cls or t.dtype != dtype or t.device != device
                    or t.requires_grad != requires_grad or t.stride() != strides
                    or any(want is not None and want != got
                           for want, got in zip(sizes, t.shape, strict=True))):
                return False
        return True


def _native_guard_class():
    """torch's TensorGuards if it is there and behaves as expected here, else None."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        t = torch.zeros(2, 3)
        guard = TensorGuards(t, dynamic_dims_sizes=[[None, 3]], dynamic_dims_strides=[[3, 1]])
        works = (guard.check(torch.zeros(5, 3)) and not guard.check(torch.zeros(5, 4))
                 and not guard.check(torch.zeros(5, 3, dtype=torch.float64))
                 and not guard.check(torch.zeros(3, 5).t()) and not guard.check(None))
    except Exception:  # absent, or its interface changed: the Python guard does the same
        return None
    return TensorGuards if works else None


GUARD_CLASS = _native_guard_class() or MetadataGuard


class PlanCache:
    """Plans by options (a hashable tuple), then by a guard on the tensors' metadata.

    ``token_dims[i]`` lists the dimensions of tensor ``i`` whose sizes a plan does not fix.
    """

    def __init__(self, token_dims: Sequence[Sequence[int]], max_per_options: int = 32) -> None:
        self.token_dims = token_dims
        self.max_per_options = max_per_options
        self.plans: dict[tuple, list] = {}

    def get(self, options: tuple, tensors: tuple):
        """The plan stored for these options and tensors, or None."""
        try:
            candidates = self.plans.get(options, ())
        except TypeError:  # an unhashable option: never stored
            return None
        for guard, plan in candidates:
            if guard.check(*tensors):
                return plan
        return None

    def add(self, options: tuple, tensors: tuple, plan) -> None:
        """Store ``plan`` (of a call that passed every check) for these options and tensors."""
        sizes = [list(t.shape) for t in tensors]
        for dims, t_sizes in zip(self.token_dims, sizes, strict=True):
            for d in dims:
                t_sizes[d] = None
        guard = GUARD_CLASS(*tensors, dynamic_dims_sizes=sizes,
                            dynamic_dims_strides=[list(t.stride()) for t in tensors])
        if not guard.check(*tensors):
            # Would never be found (the native guard compares dispatch keys under the
            # thread's current modes): leave such calls to the full checks.
            return
        candidates = self.plans.setdefault(options, [])
        if len(candidates) >= self.max_per_options:
            del candidates[0]  # the oldest
        candidates.append((guard, plan))

    def clear(self) -> None:
        self.plans.clear()
