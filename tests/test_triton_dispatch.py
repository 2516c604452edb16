"""`hgrn2_triton` picks its kernel: decode for a few tokens without autograd, chunk-parallel for few long
sequences, the sequential chunk kernel otherwise; each choice gives the reference's result."""

import os

import pytest
import torch
from conftest import rel_err

import hgrn2.ops.triton as tri
from hgrn2.ops import hgrn2_reference

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
                                reason="needs CUDA or TRITON_INTERPRET=1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("B,T,grad,cu_seqlens,expected", [
    (2, 8, False, None, "recurrent"),
    (2, 8, True, None, "chunk"),          # autograd needs a chunk kernel, even for a few tokens
    (3, 80, True, None, "chunk"),         # 3 x 2 = 6 programs > CP_MAX_PROGRAMS (4 here)
    (1, 80, True, None, "cp"),
    (1, 80, False, None, "cp"),           # inference, 1 sequence x 2 heads, long: chunk-parallel
    (3, 80, False, None, "chunk"),
    (1, 40, False, None, "chunk"),        # shorter than CP_MIN_T
    (1, 150, False, [0, 70, 150], "cp"),  # packed: 2 sequences of 75 tokens on average
    (3, 150, False, None, "chunk"),       # 6 programs
])
def test_dispatch_choice_and_result(monkeypatch, B, T, grad, cu_seqlens, expected):
    monkeypatch.setattr(tri, "CP_MAX_PROGRAMS", 4)
    monkeypatch.setattr(tri, "CP_MIN_T", 64)
    called = []
    for name in ("recurrent", "cp", "chunk"):
        attr = f"hgrn2_{name}_triton"
        real = getattr(tri, attr)
        monkeypatch.setattr(tri, attr, lambda *a, _real=real, _name=name, **k: called.append(_name) or _real(*a, **k))
    H, K = 2, 16
    o, g, i = (torch.randn(B, T, H, K, device=DEV, requires_grad=grad) for _ in range(3))
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, device=DEV, dtype=torch.int32)
    y, _ = tri.hgrn2_triton(o, g, i, scale=0.25, o_act="silu", cu_seqlens=cu)
    y_ref, _ = hgrn2_reference(o.double(), g.double(), i.double(), scale=0.25, o_act="silu", cu_seqlens=cu)
    assert called == [expected]
    assert rel_err(y, y_ref) <= 1e-4
