"""Test set-up. Without a GPU, Triton kernels run in the interpreter (must be set before triton.jit runs)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64 (0 when both are 0)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    den = ref.norm().item()
    return (x - ref).norm().item() / den if den > 0 else (x - ref).norm().item()
