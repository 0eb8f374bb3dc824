"""Programmatic Dependent Launch (PDL) for the project's Triton kernels: the two grid-dependency
instructions as Triton functions (pdl_support.py says whether this triton has them and can launch
with them).

A kernel launched with PDL (`kernel[grid](..., launch_pdl=True)`) may start while the kernel
before it on the stream still runs. It must execute `pdl_wait()` (`griddepcontrol.wait`: block
until the earlier grid has completed and its writes are visible) in every program before it
reads anything an earlier kernel wrote, and before it writes anything an earlier kernel may still
read; it may call `pdl_launch_dependents()` (`griddepcontrol.launch_dependents`) to let the next
PDL kernel be scheduled early. Every PDL kernel here waits unconditionally, so the waits chain: a
kernel that waited for its predecessor also saw everything that one waited for. Kernels not
launched with PDL (cuBLAS, torch's, inductor's unless its own option is on) start only after the
previous kernel completes, as usual.

Importing this module imports triton. Where triton lacks the intrinsics the two functions are
empty, so the kernels still compile with USE_PDL off.
"""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401  (the interpreter wants it visible to every jit function)

try:
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait
except ImportError:  # an older triton: pdl_support.pdl_missing() names what is absent
    _gdc_wait = _gdc_launch_dependents = None

if _gdc_wait is not None:
    @triton.jit
    def pdl_wait():
        _gdc_wait()

    @triton.jit
    def pdl_launch_dependents():
        _gdc_launch_dependents()
else:
    @triton.jit
    def pdl_wait():
        pass

    @triton.jit
    def pdl_launch_dependents():
        pass


@triton.jit
def prefetch_rows_to_l2(row_ptrs, row_ok, nbytes):
    """Starts copying `nbytes` (a multiple of 16) from each 16-byte-aligned address of `row_ptrs`
    where `row_ok` into L2 and returns at once (`cp.async.bulk.prefetch.L2`, sm_90): what a PDL
    kernel can do with memory no earlier kernel writes while that kernel still runs. Compiled
    code only: the interpreter runs no PTX."""
    tl.inline_asm_elementwise(
        asm="""{
        .reg .pred ok;
        setp.ne.b32 ok, $3, 0;
        @ok cp.async.bulk.prefetch.L2.global [$1], $2;
        mov.u32 $0, 0;
        }""",
        constraints="=r,l,r,r", args=[row_ptrs, nbytes, row_ok.to(tl.int32)], dtype=tl.int32,
        is_pure=False, pack=1)
