"""Launch on the tensors' own GPU: Triton launches on the *current* CUDA device, so a kernel given tensors on
another device (a DDP rank ≠ 0 that did not call `torch.cuda.set_device`) would read foreign pointers."""

from __future__ import annotations

import functools

import torch


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
