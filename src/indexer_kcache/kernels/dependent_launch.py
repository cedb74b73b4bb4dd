"""Programmatic dependent launch (NVIDIA sm_90+), shared by the kernels.

A kernel launched with Triton's ``launch_pdl`` option may start before the previous
kernel in the stream has finished; it must wait for it before touching memory that kernel
may have written. ``USE_PDL`` modes: ``PDL_NONE`` (launched plainly: nothing to wait
for); ``PDL_EARLY`` (wait, then release the next kernel: it launches once every program
of this one has done so, and its programs, waiting in turn, hold SM room while this
one's still run); ``PDL_AT_EXIT`` (wait; the next kernel is released as this one's
programs exit).
"""

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

PDL_NONE: tl.constexpr = tl.constexpr(0)
PDL_EARLY: tl.constexpr = tl.constexpr(1)
PDL_AT_EXIT: tl.constexpr = tl.constexpr(2)


@triton.jit
def wait_for_previous_kernel(USE_PDL: tl.constexpr):
    """The first statement of a kernel that may be launched dependently (``USE_PDL``: a
    mode above; ``True``/``False`` read as ``PDL_EARLY``/``PDL_NONE``)."""
    if USE_PDL != PDL_NONE:
        tl_cuda.gdc_wait()
    if USE_PDL == PDL_EARLY:
        tl_cuda.gdc_launch_dependents()
