"""How our Triton launchers are called: on the tensors' own GPU, and as torch custom ops only when compiling.

Triton launches on the *current* CUDA device, so a kernel given tensors on another device (a DDP rank ≠ 0 that
did not call `torch.cuda.set_device`) would read foreign pointers: `on_tensor_device` switches to it.

`triton_op` registers a launcher as a torch custom op, which torch.compile treats as one opaque node with a fake
(meta) implementation. In eager mode the launcher is called directly: the custom op's dispatch (schema checks,
alias checks, the dispatcher's Python round trip) costs tens of µs of CPU per call, and an eager training step
makes hundreds of such calls, at a size where the CPU that launches the kernels can be the bound.
"""

from __future__ import annotations

import functools

import torch

from ._interpret import INTERPRET


def on_tensor_device(fn):
    """Run `fn` with the CUDA device of its first tensor argument current (no switch when it already is)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if x is not None and x.is_cuda and x.device.index != torch.cuda.current_device():
            with torch.cuda.device(x.device):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


PDL = True  # programmatic dependent launch where the GPU has it; a module global so that benchmarks can compare


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def launch_pdl(x: torch.Tensor) -> bool:
    """Whether a decode kernel on x's device launches with programmatic dependent launch (sm_90 and later, not in
    the interpreter): it may then start while the kernel before it drains, and waits (`gdc_wait`) before its first
    read, which hides most of the gap between the short kernels of a decode step. The kernels do not release their
    successor early (`gdc_launch_dependents`): its waiting programs would hold the SM slots that the running
    kernel's programs need."""
    return PDL and x.is_cuda and not INTERPRET and _hopper_or_later(x.device.index)


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for launch grids: `triton.cdiv` is a constexpr function in Triton 3.x, whose host-side calls go
    through argument unwrapping (µs each, a thousand calls per training step)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The least power of two ≥ n (1 for n ≤ 1), as `triton.next_power_of_2` without its host-side cost."""
    return 1 << max(0, n - 1).bit_length()


def triton_op(name: str, mutates_args=()):
    """Decorator: `fn` as the custom op `name` (see the module docstring) while torch.compile traces, a direct
    call (on the tensors' device) otherwise. The result has the op's `register_fake` and the op as `.op`. The
    schema is inferred from fn's annotations, resolved in this module: spell them `torch.Tensor`, not aliases."""

    def wrap(fn):
        impl = on_tensor_device(fn)
        op = torch.library.custom_op(name, mutates_args=mutates_args)(impl)

        @functools.wraps(fn)
        def call(*args):
            return op(*args) if torch.compiler.is_compiling() else impl(*args)

        call.op, call.register_fake = op, op.register_fake
        return call

    return wrap
