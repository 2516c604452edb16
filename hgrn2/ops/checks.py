"""Argument validation shared by every backend: clear errors, nothing silently broadcast or truncated."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fail(name: str, expected: str, got) -> None:
    raise ValueError(f"`{name}`: expected {expected}, got {got}")


def check_tensor(name: str, x: object) -> None:
    if not isinstance(x, torch.Tensor):
        _fail(name, "a torch.Tensor", type(x).__name__)


def check_float(name: str, x: torch.Tensor, ndim: int, complex_ok: bool = True) -> None:
    check_tensor(name, x)
    if x.ndim != ndim:
        _fail(name, f"a {ndim}-D tensor", f"shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES and not (complex_ok and x.is_complex()):
        _fail(name, f"a {'floating or complex' if complex_ok else 'real floating'} dtype {FLOAT_DTYPES}", x.dtype)


def check_scale(scale: float) -> None:
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        _fail("scale", "a finite number", repr(scale))


def reads_on_host(x: torch.Tensor) -> bool:
    """Whether a value check may read `x` on the host: CPU tensors only, since reading a GPU tensor waits for
    every kernel queued before it (a host sync)."""
    return x.device.type == "cpu"


def check_values(ok: torch.Tensor, name: str, expected: str, got: Callable[[], str]) -> None:
    """The one-line error for `name` unless the boolean scalar tensor `ok` holds.

    Read on the host for CPU tensors (`got()` describes the bad values); on a GPU an asynchronous device-side
    assertion, so that no check in a training step stalls the CPU. Skipped while torch.compile traces or a CUDA
    graph is captured: the eager warm-up before a capture has checked the same computation, and a graph replaying
    the check would add its kernels to every step.
    """
    if torch.compiler.is_compiling():
        return
    if reads_on_host(ok):
        if not bool(ok):
            _fail(name, expected, got())
    elif not capturing(ok):
        torch._assert_async(ok, f"`{name}`: expected {expected}")


def capturing(x: torch.Tensor) -> bool:
    """Whether x's CUDA stream is being captured into a graph."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def check_lower_bound_range(lower_bound: torch.Tensor) -> None:
    """β in [0, 1) (see `check_values`): ⌊β⌋ = 0, which NaN fails too (one kernel fewer than two comparisons)."""
    check_values(lower_bound.floor().eq(0).all(), "lower_bound", "values in [0, 1)",
                 lambda: f"values in [{lower_bound.min().item()}, {lower_bound.max().item()}]")


def check_same(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor, dims: slice | None = None) -> None:
    """`x` must sit on `ref`'s device and match its shape (or the `dims` slice of it)."""
    if x.device != ref.device:
        _fail(name, f"a tensor on {ref.device} like `{ref_name}`", x.device)
    a = tuple(x.shape) if dims is None else tuple(x.shape[dims])
    b = tuple(ref.shape) if dims is None else tuple(ref.shape[dims])
    if a != b:
        what = "shape" if dims is None else f"dims {dims.start}:{dims.stop}"
        _fail(name, f"{what} {b} matching `{ref_name}`", f"{a} (full shape {tuple(x.shape)})")


def check_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> int:
    """Validate packed-sequence offsets [N + 1] and return N. Packed input must have batch size 1."""
    check_tensor("cu_seqlens", cu_seqlens)
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        _fail("cu_seqlens", "a 1-D tensor of N + 1 offsets (N >= 1)", f"shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        _fail("cu_seqlens", "an int32 or int64 tensor", cu_seqlens.dtype)
    if batch != 1:
        _fail("cu_seqlens", "packed input with batch size 1", f"batch size {batch}")
    c = cu_seqlens.tolist()
    if c[0] != 0 or c[-1] != seq_len:
        _fail("cu_seqlens", f"offsets starting at 0 and ending at T={seq_len}", c if len(c) <= 8 else c[:4] + ["…"])
    if any(b <= a for a, b in zip(c[:-1], c[1:])):
        _fail("cu_seqlens", "strictly increasing offsets (no empty sequences)", c if len(c) <= 8 else "non-increasing")
    return len(c) - 1


def check_state(name: str, s: torch.Tensor, shape: tuple, device: torch.device) -> None:
    check_tensor(name, s)
    if s.device != device:
        _fail(name, f"a tensor on {device}", s.device)
    if tuple(s.shape) != tuple(shape):
        _fail(name, f"shape {tuple(shape)}", tuple(s.shape))
