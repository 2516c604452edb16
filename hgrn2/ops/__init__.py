"""HGRN2 and HGRN1 recurrences as pure functions on tensors, with one dispatch point each.

Backends (one file each):
  reference — `reference.py`, the step loop; the fp64 oracle, and the torch path for decoding a few tokens
  chunk     — `chunk.py`, chunkwise-parallel PyTorch (HGRN2) / `scan.py`, chunked scan (HGRN1); CPU and GPU
  triton    — `triton/`, fused kernels for CUDA tensors
`hgrn2_small_heads` (heads of K, V ≤ 8, no state in or out): HGRN1's element-wise scan on the expanded state
(`small_heads.py`, backends "reference" / "scan" of `hgrn1`), or `triton/small_heads.py`.

`backend=None` picks Triton for CUDA tensors when Triton is importable, else the torch paths; pass a name to
override. Every backend takes the same arguments and returns `(output, final_state_or_None)`.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from .checks import _fail, check_cu_seqlens, check_float, check_lower_bound_range, check_same, check_scale, check_state
from .flip import run_scan
from .gates import ACTIVATIONS, activate, clamp_forget_logits, log_forget, lower_bounds_from_logits, one_minus_forget
from .reference import hgrn1_reference, hgrn2_reference

__all__ = [
    "hgrn2", "hgrn1", "hgrn2_small_heads", "available_backends", "hgrn2_reference", "hgrn1_reference", "activate",
    "log_forget", "one_minus_forget", "lower_bounds_from_logits", "clamp_forget_logits", "ACTIVATIONS",
]

HGRN2_BACKENDS = ("reference", "chunk", "triton")
HGRN1_BACKENDS = ("reference", "scan", "triton")
SMALL_HEADS_MAX = 8  # the largest K and V of `hgrn2_small_heads`: its Triton tile holds whole heads
DECODE_MAX_T = 16  # at or below this many tokens the step loop beats the chunked torch path for inference


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def use_glue_kernels(x: torch.Tensor) -> bool:
    """Whether the Triton kernels of the model's glue (norm, SwiGLU, cross entropy) take x: a CUDA fp16 / bf16 /
    fp32 tensor, with Triton importable; the PyTorch composites take everything else (fp64 included)."""
    return x.is_cuda and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and triton_available()


def available_backends() -> dict[str, list[str]]:
    extra = ["triton"] if triton_available() else []
    return {"hgrn2": ["reference", "chunk", *extra], "hgrn1": ["reference", "scan", *extra]}


def _pick(backend: str | None, names: tuple[str, ...], x: torch.Tensor, fast_torch: str, *inputs) -> str:
    if backend is not None:
        if backend not in names:
            _fail("backend", f"one of {names} or None", repr(backend))
        return backend
    if x.is_cuda and triton_available():
        return "triton"
    return "reference" if x.shape[1] <= DECODE_MAX_T and not _training(*inputs) else fast_torch


def _training(*inputs) -> bool:
    """Whether autograd will record the op: the step loop's per-token graph makes its backward slow."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)


def _check_common(name, x, lower_bound, lb_shape, initial_state, state_shape, cu_seqlens):
    B, T = x.shape[:2]
    if T == 0:
        _fail(name, "at least one token (T >= 1)", f"shape {tuple(x.shape)}")
    n = B if cu_seqlens is None else check_cu_seqlens(cu_seqlens, B, T)
    if lower_bound is not None:
        check_float("lower_bound", lower_bound, len(lb_shape), complex_ok=False)
        check_state("lower_bound", lower_bound, lb_shape, x.device)
        check_lower_bound_range(lower_bound)
    if initial_state is not None:
        check_float("initial_state", initial_state, 1 + len(state_shape), complex_ok=x.is_complex())
        check_state("initial_state", initial_state, (n, *state_shape), x.device)
    return n


def _empty(y: torch.Tensor, final_shape: tuple, final_dtype: torch.dtype, output_final_state: bool, *inputs):
    """The result for inputs without elements (B, H or a channel count of 0), the same on every backend; linked
    to the inputs by empty sums so that autograd gives them zero gradients."""
    y = y + sum(x.flatten()[:0].sum() for x in inputs if x is not None and x.requires_grad)
    return y, (y.new_zeros(final_shape, dtype=final_dtype) if output_final_state else None)


def _check_ogi(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, scale: float) -> None:
    """The checks `hgrn2` and `hgrn2_small_heads` share: real float [B, T, H, *] inputs of one batch and length."""
    for name, x in (("o", o), ("g", g), ("i", i)):
        check_float(name, x, 4, complex_ok=False)
    check_same("g", g, "o", o)
    check_same("i", i, "o", o, slice(0, 3))
    check_scale(scale)


def hgrn2(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
          scale: float = 1.0, o_act: str | None = None, i_act: str | None = None,
          initial_state: torch.Tensor | None = None, output_final_state: bool = False,
          cu_seqlens: torch.Tensor | None = None, backend: str | None = None, reverse: bool = False
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The HGRN2 recurrence (GLA with q = o, k = 1 − f, v = i, α = f), per head:

        f_t = β + (1 − β)·σ(g_t),   h_t = h_{t-1}·Diag(f_t) + i_t ⊗ (1 − f_t),   y_t = scale · h_t·o_t

    Args:
        o: [B, T, H, K] output gate (pre-activation if `o_act` is set).
        g: [B, T, H, K] forget-gate logits.
        i: [B, T, H, V] input (pre-activation if `i_act` is set).
        lower_bound: [H, K] β in [0, 1), or None for β = 0.
        scale: multiplies the output (fla's checkpoints use K ** -0.5).
        o_act, i_act: None, "silu" or "sigmoid", applied to `o` / `i` inside the op (fused on Triton).
        initial_state: [N, H, V, K] with N = B, or the number of packed sequences with `cu_seqlens`.
        output_final_state: also return the state after the last token, [N, H, V, K] float32.
        cu_seqlens: [N + 1] int offsets of packed sequences in a batch of size 1, each with its own state.
        backend: None (auto) or one of "reference", "chunk", "triton".
        reverse: scan from the last token to the first, h_t = h_{t+1}·Diag(f_t) + i_t ⊗ (1 − f_t) (each packed
            sequence on its own); initial_state then comes before the last token and the final state is the one
            after the first. The fused-chunk Triton kernels walk backwards in place; the other paths flip time.

    Returns:
        (y [B, T, H, V] in i's dtype, final state or None)
    """
    _check_ogi(o, g, i, scale)
    B, T, H, K = o.shape
    V = i.shape[-1]
    n = _check_common("o", o, lower_bound, (H, K), initial_state, (H, V, K), cu_seqlens)
    for name, act in (("o_act", o_act), ("i_act", i_act)):
        if act not in ACTIVATIONS:
            _fail(name, f"one of {ACTIVATIONS}", repr(act))
    if not isinstance(reverse, bool):
        _fail("reverse", "a bool", repr(reverse))
    name = _pick(backend, HGRN2_BACKENDS, o, "chunk", o, g, i, lower_bound, initial_state)
    if o.numel() == 0 or i.numel() == 0:
        dt = torch.float64 if o.dtype == torch.float64 else torch.float32
        return _empty(i.new_zeros(B, T, H, V), (n, H, V, K), dt, output_final_state, o, g, i, lower_bound,
                      initial_state)
    kw = dict(scale=scale, o_act=o_act, i_act=i_act, initial_state=initial_state,
              output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if name == "triton":
        _require_cuda("o", o)
        from .triton import hgrn2_triton
        return hgrn2_triton(o, g, i, lower_bound, reverse=reverse, **kw)
    if name == "reference":
        fn = hgrn2_reference
    else:
        from .chunk import hgrn2_chunk as fn
    return run_scan(fn, o, g, i, lower_bound, reverse=reverse, **kw)


def hgrn1(i: torch.Tensor, g: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
          theta: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
          output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None, backend: str | None = None
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN1's element-wise recurrence, h_t = f_t ⊙ e^{iθ} ⊙ h_{t-1} + (1 − f_t) ⊙ i_t, f_t = β + (1−β)σ(g_t).

    Args:
        i: [B, T, D] input; complex when `theta` is given (the complex HGRU of the HGRN paper).
        g: [B, T, D] forget-gate logits (real).
        lower_bound: [D] β in [0, 1), or None.
        theta: [D] rotation angles, or None for the real recurrence.
        initial_state: [N, D]; cu_seqlens, output_final_state, backend as in `hgrn2`.

    Returns:
        (h [B, T, D] in i's dtype, final state [N, D] or None)
    """
    check_float("i", i, 3)
    check_float("g", g, 3)
    check_same("g", g, "i", i)
    if g.is_complex():
        _fail("g", "real forget-gate logits", g.dtype)
    if (theta is not None) != i.is_complex():
        _fail("theta", "a tensor exactly when `i` is complex", f"theta={'set' if theta is not None else None}, "
              f"i.dtype={i.dtype}")
    D = i.shape[-1]
    if theta is not None:
        check_float("theta", theta, 1)
        check_state("theta", theta, (D,), i.device)
    n = _check_common("i", i, lower_bound, (D,), initial_state, (D,), cu_seqlens)
    name = _pick(backend, HGRN1_BACKENDS, i, "scan", i, g, lower_bound, theta, initial_state)
    if i.numel() == 0:
        dt = torch.promote_types(torch.promote_types(g.dtype, torch.float32), i.dtype)
        return _empty(i.new_zeros(i.shape), (n, D), dt, output_final_state, i, g, lower_bound, initial_state, theta)
    kw = dict(theta=theta, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if name == "reference":
        return hgrn1_reference(i, g, lower_bound, **kw)
    if name == "scan":
        from .scan import hgrn1_scan
        return hgrn1_scan(i, g, lower_bound, **kw)
    _require_cuda("i", i)
    from .triton import hgrn1_triton
    return hgrn1_triton(i, g, lower_bound, **kw)


def hgrn2_small_heads(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
                      scale: float = 1.0, o_act: str | None = None, reverse: bool = False, bidirectional: bool = False,
                      backend: str | None = None) -> torch.Tensor:
    """`hgrn2`'s output for heads of K, V ≤ 8 from a zero state, each head's [V, K] state kept whole in one program.

    Args:
        o, g: [B, T, H, K]; i: [B, T, H, V] (already activated); lower_bound: [H, K] β or None; scale, o_act,
            reverse as in `hgrn2`.
        bidirectional: the forward and the reverse scans' outputs summed (one launch on Triton); `reverse` must
            then be False.
        backend: None (auto), "triton", or "reference" / "scan": HGRN1's backend on the state expanded to
            [B, T, H·V·K].

    Returns:
        y [B, T, H, V] in i's dtype.
    """
    _check_ogi(o, g, i, scale)
    B, T, H, K = o.shape
    V = i.shape[-1]
    if K > SMALL_HEADS_MAX or V > SMALL_HEADS_MAX:
        _fail("o", f"heads of K and V at most {SMALL_HEADS_MAX} (use `hgrn2`)", f"K={K}, V={V}")
    _check_common("o", o, lower_bound, (H, K), None, (H, V, K), None)
    if o_act not in ACTIVATIONS:
        _fail("o_act", f"one of {ACTIVATIONS}", repr(o_act))
    for name, flag in (("reverse", reverse), ("bidirectional", bidirectional)):
        if not isinstance(flag, bool):
            _fail(name, "a bool", repr(flag))
    if reverse and bidirectional:
        _fail("reverse", "False with bidirectional=True (both directions are summed)", reverse)
    name = _pick(backend, HGRN1_BACKENDS, o, "scan", o, g, i, lower_bound)
    if o.numel() == 0 or i.numel() == 0:
        return _empty(i.new_zeros(B, T, H, V), (0,), torch.float32, False, o, g, i, lower_bound)[0]
    kw = dict(scale=scale, o_act=o_act, reverse=reverse, bidirectional=bidirectional)
    if name == "triton":
        _require_cuda("o", o)
        from .triton.small_heads import hgrn2_small_heads_triton
        return hgrn2_small_heads_triton(o, g, i, lower_bound, **kw)
    from .small_heads import hgrn2_elementwise
    return hgrn2_elementwise(hgrn1, o, g, i, lower_bound, backend=name, **kw)


def _require_cuda(name: str, x: torch.Tensor) -> None:
    if not x.is_cuda and not _interpreting():
        _fail(name, "a CUDA tensor for backend='triton' (or set TRITON_INTERPRET=1)", x.device)


def _interpreting() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
