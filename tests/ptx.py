"""What the CPU tier reads of a plan's compiled kernel: the binary and ptxas's report
(``compiled``), the PTX NVRTC makes of it (``ptx_of``), and the ptxas warning that says a
warpgroup MMA was serialized (``SERIALIZED``)."""

from specgen.compile import compile_source, options_for
from specgen.render import render

SERIALIZED = "C7514"  # ptxas: wgmma.mma_async instructions are serialized


def compiled(plan):
    """The plan's kernels compiled for sm_90 (sm_90a where the plan needs it)."""
    return compile_source(render(plan), plan.name, plan.target("sm_90"))


def ptx_of(plan) -> str:
    """The PTX of the plan's source for sm_90 (sm_90a where the plan needs it)."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(render(plan), f"{plan.name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, list(options_for(plan.target("sm_90"))))
        return nvrtc.getPTX(prog).decode()
    finally:
        nvrtc.destroyProgram(prog)
