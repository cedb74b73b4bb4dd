"""Launching an already compiled Triton kernel without Triton's per-call argument binding.

A launcher keeps, per specialization (what Triton's compiled code assumes about pointer
alignment and integer widths), the kernel that Triton's first launch returned, and calls
it directly afterwards with the tensors' addresses as integers: Triton's launcher then
also skips its per-pointer driver query (is this a device address?), which the caller's
device checks have answered.
"""

from __future__ import annotations

import torch
from triton import knobs


def launch_compiled(compiled, device: int, grid: int, args: tuple) -> None:
    """What ``JITFunction.run`` does once it has found the kernel (Triton 3.6 to 3.9), minus
    the launch metadata and hook calls when no launch hook is installed. Runs on the
    current stream of ``device`` (a CUDA device index), whichever device is current."""
    if device != torch._C._cuda_getDevice():
        with torch.cuda.device(device):
            launch_compiled(compiled, device, grid, args)
        return
    stream = torch._C._cuda_getCurrentRawStream(device)
    enter_hook = _installed(knobs.runtime.launch_enter_hook)
    metadata = (None if enter_hook is None
                else compiled.launch_metadata((grid, 1, 1), stream, *args))
    compiled.run(grid, 1, 1, stream, compiled.function, compiled.packed_metadata, metadata,
                 enter_hook, _installed(knobs.runtime.launch_exit_hook), *args)


def _installed(hook):
    """A launch hook, or None. Triton keeps hooks in a chain that is never None itself (and
    builds the launch metadata whenever it is not None): an empty chain counts as none."""
    if hook is None or (isinstance(hook, _HOOK_CHAIN) and not hook.calls):
        return None
    return hook


_HOOK_CHAIN = getattr(knobs, "HookChain", ())


def plain_eager(a, b) -> bool:
    """True for a plain eager call: ``a`` and ``b`` (an op's main tensors) are plain
    tensors and nothing traces or compiles (no torch.compile, fake or functional tensors,
    dispatch or torch-function modes). Such a call may run the op's implementation
    directly, without the dispatcher's boxing (several microseconds per call); anything
    else must go through the op."""
    return (type(a) is torch.Tensor and type(b) is torch.Tensor
            and not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._is_torch_function_mode_enabled())
