"""Programmatic dependent launch (NVIDIA sm_90+), shared by the kernels.

A kernel launched with Triton's ``launch_pdl`` option may start before the previous
kernel in the stream has finished; it must wait for it before touching memory that kernel
may have written. ``USE_PDL`` modes: ``PDL_NONE`` (launched plainly: nothing to wait
for); ``PDL_EARLY`` (wait, then release the next kernel: it launches once every program
of this one has done so, and its programs, waiting in turn, hold SM room while this
one's still run); ``PDL_AT_EXIT`` (wait; the next kernel is released as this one's
programs exit).

Before its wait a kernel may still ask for data into L2 (``hint_l2``): a prefetch moves no
value into the program and changes no memory, so it is right whatever the previous kernel
writes meanwhile (L2 is where every SM's writes meet), and the data the kernel reads after
its wait may then be on chip already.
"""

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

PDL_NONE: tl.constexpr = tl.constexpr(0)
PDL_EARLY: tl.constexpr = tl.constexpr(1)
PDL_AT_EXIT: tl.constexpr = tl.constexpr(2)


# A predicated L2 prefetch of the line holding one address (NVIDIA PTX); the result is a
# dummy, the asm not pure so that it is kept.
_PREFETCH_L2_PTX: tl.constexpr = tl.constexpr("""
{
.reg .pred p;
setp.ne.s32 p, $2, 0;
@p prefetch.global.L2 [$1];
mov.u32 $0, 0;
}
""")


@triton.jit
def hint_l2(pointers, wanted):
    """Prefetch into L2 the lines of ``pointers`` where ``wanted`` (same shapes). NVIDIA
    only (inline PTX): never under the interpreter."""
    tl.inline_asm_elementwise(_PREFETCH_L2_PTX, "=r,l,r",
                              [pointers.to(tl.int64, bitcast=True), wanted.to(tl.int32)],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_for_previous_kernel(USE_PDL: tl.constexpr):
    """The first statement of a kernel that may be launched dependently (``USE_PDL``: a
    mode above; ``True``/``False`` read as ``PDL_EARLY``/``PDL_NONE``)."""
    if USE_PDL != PDL_NONE:
        tl_cuda.gdc_wait()
    if USE_PDL == PDL_EARLY:
        tl_cuda.gdc_launch_dependents()
