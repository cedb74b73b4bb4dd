"""The fast host path's private interfaces, in one place, behind one switch.

An eager call costs about what an empty Triton launch does because of three shortcuts,
each through an interface that torch or Triton does not promise to keep:

* **plan lookup**: a checked call's plan is found again by its tensors' metadata with
  torch's C++ ``TensorGuards`` (what torch.compile checks graph inputs with);
* **no dispatcher for plain eager calls**: ``torch._C`` queries tell whether anything
  traces, compiles or intercepts the call (modes, fake or functional tensors);
* **direct launch**: after Triton's first launch of a specialization has returned the
  compiled kernel, later launches call its ``run`` with the packed launch metadata and
  Triton's launch hooks, on the stream ``torch._C`` reports, with tensors passed as their
  addresses.

At import this module checks the torch and Triton versions these were written and tested
against (``KNOWN_TORCH``, ``KNOWN_TRITON``) and probes ``TensorGuards``' behaviour. Outside
them, or with ``INDEXER_KCACHE_FAST_PATH=0`` in the environment, every op takes the plain
path instead: the same checks with a pure-Python metadata guard, every call through the
``torch.library`` dispatcher, and Triton's own ``kernel[grid](...)`` launch. Results are
identical; only the host time per call differs. ``set_enabled`` switches at run time.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator

import torch
import triton
from triton import knobs

ENV_VAR = "INDEXER_KCACHE_FAST_PATH"
# (major, minor) ranges, inclusive, whose private interfaces this module was checked against.
KNOWN_TORCH = ((2, 6), (2, 14))
KNOWN_TRITON = ((3, 6), (3, 9))


def _version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


def known_version(version: str, known: tuple[tuple[int, int], tuple[int, int]]) -> bool:
    return known[0] <= _version(version) <= known[1]


class MetadataGuard:
    """``TensorGuards``' check in Python (same constructor, same ``check``): each tensor's
    type, dtype, device, ``requires_grad``, sizes (``None`` = any) and strides."""

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
    """torch's TensorGuards if it is there and behaves as ``MetadataGuard`` does, else None."""
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


NATIVE_GUARD = _native_guard_class()
AVAILABLE = (known_version(torch.__version__, KNOWN_TORCH)
             and known_version(triton.__version__, KNOWN_TRITON) and NATIVE_GUARD is not None)
_enabled = AVAILABLE and os.environ.get(ENV_VAR, "1") != "0"
_on_switch: list[Callable[[], None]] = []


def enabled() -> bool:
    """Whether ops take the fast path now."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Switch the fast path on (where ``AVAILABLE``) or off. Kept plans and compiled
    launches are dropped, so each call afterwards is checked and launched the new way."""
    global _enabled
    _enabled = bool(flag) and AVAILABLE
    for forget in _on_switch:
        forget()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """``with fast_path.disabled():`` runs its calls on the plain path."""
    before = _enabled
    set_enabled(False)
    try:
        yield
    finally:
        set_enabled(before)


def on_switch(forget: Callable[[], None]) -> None:
    """Register a cache to be cleared whenever the path switches."""
    _on_switch.append(forget)


def guard_class() -> type:
    return NATIVE_GUARD if _enabled else MetadataGuard


# torch's C queries behind ``plain_eager``: the depth of the dispatch-mode stack, and
# whether a torch-function mode is on.
dispatch_modes = torch._C._len_torch_dispatch_stack
function_mode = torch._C._is_torch_function_mode_enabled
# ``plain_eager``'s test as an expression of this module (named ``{fp}``), for generated code
# that runs it without a call of its own.
PLAIN_EAGER_SOURCE = "{fp}._enabled and not {fp}.dispatch_modes() and not {fp}.function_mode()"


def plain_eager() -> bool:
    """True when a call may skip the dispatcher: the fast path is on and no dispatch or
    torch-function mode intercepts (fake or functional tensors, tracing). The caller also
    makes sure its tensors are plain ``torch.Tensor``s (a kept plan's guard does, for the
    calls that find one) and that torch.compile is not tracing (see ``launcher``). Such a
    call may run the op's implementation without the dispatcher's argument boxing; anything
    else must go through the op."""
    return _enabled and not dispatch_modes() and not function_mode()


def plain_tensors(tensors: tuple) -> bool:
    """Whether every tensor is a plain ``torch.Tensor`` (or ``nn.Parameter``) with data that
    means its bytes: no subclass that would expect its own dispatch, no meta tensor (only
    the op's fake implementation takes those), no lazily negated or conjugated view (the
    dispatcher materialises those; a kernel would read the bytes as they are), no
    storage-less zero tensor (autograd's), no functional tensor, no tensor wrapped by a
    ``torch.func`` transform (vmap, grad, functionalize: their wrappers are ``torch.Tensor``
    to Python but hold no storage of their own)."""
    for t in tensors:
        kind = type(t)
        if (kind is not torch.Tensor and not _plain_kind(kind)
                or t.is_meta or t.is_neg() or t.is_conj() or t._is_zerotensor()
                or torch._is_functional_tensor(t)
                or (_functorch_wrapped is not None and _functorch_wrapped(t))):
            return False
    return True


def _plain_kind(kind: type) -> bool:
    """A subclass that dispatches as ``torch.Tensor`` does (``nn.Parameter``: torch-function
    and torch-dispatch handling both off) counts as plain; the answer is kept per type."""
    plain = _PLAIN_KINDS.get(kind)
    if plain is None:
        plain = _PLAIN_KINDS[kind] = bool(
            issubclass(kind, torch.Tensor)
            and kind.__torch_function__ is torch._C._disabled_torch_function_impl
            and kind.__torch_dispatch__ is torch.Tensor.__torch_dispatch__)
    return plain


_PLAIN_KINDS: dict[type, bool] = {}


# (Absent from a torch this module does not know, whose calls all take the plain path.)
_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None),
                             "is_functorch_wrapped_tensor", None)


def installed_hook(hook):
    """A launch hook, or None. Triton keeps hooks in a chain that is never None itself (and
    builds the launch metadata whenever it is not None): an empty chain counts as none."""
    if hook is None or (isinstance(hook, HOOK_CHAIN) and not hook.calls):
        return None
    return hook


HOOK_CHAIN = getattr(knobs, "HookChain", ())
# The current CUDA device and its current stream, as torch's C functions (CUDA builds).
current_device = getattr(torch._C, "_cuda_getDevice", None)
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def launch_compiled(compiled, device: int, grid: tuple[int, int, int], args: list) -> None:
    """What ``JITFunction.run`` does once it has found its compiled kernel (Triton 3.6 to
    3.9), minus the launch metadata and hook calls when no launch hook is installed. Runs
    on the current stream of ``device`` (a CUDA device index), whichever device is current.
    ``args`` are all the kernel's arguments in order, pointers as addresses."""
    if device != current_device():
        with torch.cuda.device(device):
            launch_compiled(compiled, device, grid, args)
        return
    stream = current_stream(device)
    enter_hook = installed_hook(knobs.runtime.launch_enter_hook)
    metadata = None if enter_hook is None else compiled.launch_metadata(grid, stream, *args)
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                 metadata, enter_hook, installed_hook(knobs.runtime.launch_exit_hook), *args)
