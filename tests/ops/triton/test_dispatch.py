"""`hgrn2_triton` picks its kernel: decode for a few tokens without autograd, chunk-parallel for few long
sequences and for training on large inputs, fused-chunk otherwise; each choice gives the reference's result."""

import os

import pytest
import torch

import hgrn2.ops.triton as tri
from hgrn2.ops import hgrn2_reference

from .harness import DEV, needs_triton, override, rel_err

pytestmark = needs_triton


@pytest.mark.parametrize("B,T,grad,cu_seqlens,expected", [
    (2, 8, False, None, "recurrent"),
    (2, 8, True, None, "fused_chunk"),        # autograd needs a training kernel, even for a few tokens
    (3, 80, True, None, "fused_chunk"),       # 3 x 2 = 6 programs > parallel_max_programs (4 here), 480 token·heads
    (4, 80, True, None, "chunk_parallel"),    # training on 640 ≥ parallel_train_min_work (600 here) token·heads
    (4, 80, False, None, "fused_chunk"),      # the same in inference: 8 programs
    (1, 80, True, None, "chunk_parallel"),
    (1, 80, False, None, "chunk_parallel"),   # inference, 1 sequence x 2 heads, long: chunk-parallel
    (3, 80, False, None, "fused_chunk"),
    (1, 40, False, None, "fused_chunk"),      # shorter than parallel_min_t
    (1, 150, False, [0, 70, 150], "chunk_parallel"),  # packed: 2 sequences of 75 tokens on average
    (3, 150, False, None, "fused_chunk"),     # 6 programs
])
def test_dispatch_choice_and_result(monkeypatch, B, T, grad, cu_seqlens, expected):
    called = []
    for name in ("recurrent", "chunk_parallel", "fused_chunk"):
        attr = f"hgrn2_{name}_triton"
        real = getattr(tri, attr)
        monkeypatch.setattr(tri, attr, lambda *a, _real=real, _name=name, **k: called.append(_name) or _real(*a, **k))
    H, K = 2, 16
    o, g, i = (torch.randn(B, T, H, K, device=DEV, requires_grad=grad) for _ in range(3))
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, device=DEV, dtype=torch.int32)
    with override("dispatch", parallel_max_programs=4, parallel_min_t=64, parallel_train_min_work=600):
        y, _ = tri.hgrn2_triton(o, g, i, scale=0.25, o_act="silu", cu_seqlens=cu)
    y_ref, _ = hgrn2_reference(o.double(), g.double(), i.double(), scale=0.25, o_act="silu", cu_seqlens=cu)
    assert called == [expected]
    assert rel_err(y, y_ref) <= 1e-4


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_every_kernel_on_a_second_device():
    """Tensors on cuda:1 while cuda:0 is current (a DDP rank that never called set_device): every kernel family
    (decode, fused-chunk, chunk-parallel, HGRN1 scan, RMSNorm, SwiGLU, cross entropy) gives cuda:0's
    result, forward and backward."""
    from hgrn2.ops import hgrn1, hgrn2
    from hgrn2.ops.cross_entropy import linear_cross_entropy
    from hgrn2.ops.norm import rms_norm
    from hgrn2.ops.swiglu import swiglu_linear

    torch.cuda.set_device(0)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    cases = {  # name: (function of tensors on one device, CPU inputs)
        "decode": (lambda o, g, i: hgrn2(o, g, i, backend="triton")[0], [rand(2, 3, 2, 32) for _ in range(3)]),
        "fused_chunk": (lambda o, g, i: hgrn2(o, g, i, backend="triton")[0],
                        [rand(8, 64, 16, 32) for _ in range(3)]),
        "chunk_parallel": (lambda o, g, i: hgrn2(o, g, i, backend="triton")[0],
                           [rand(1, 2048, 2, 32) for _ in range(3)]),
        "hgrn1": (lambda x, g: hgrn1(x, g, backend="triton")[0], [rand(2, 50, 64) for _ in range(2)]),
        "rms_norm": (lambda x, w: rms_norm(x, w, 1e-6), [rand(5, 64), rand(64)]),
        "swiglu": (lambda g, u, w: swiglu_linear(g, u, w), [rand(5, 64), rand(5, 64), rand(16, 64)]),
        "cross_entropy": (lambda h, w: linear_cross_entropy(h, w, torch.arange(5, device=h.device)),
                          [rand(5, 32), rand(100, 32)]),
    }
    for name, (fn, xs) in cases.items():
        results = []
        for dev in ("cuda:0", "cuda:1"):
            leaves = [x.to(dev).requires_grad_() for x in xs]
            with torch.set_grad_enabled(name != "decode"):
                y = fn(*leaves)
            if name != "decode":
                y.float().sum().backward()
            results.append([y.cpu()] + [leaf.grad.cpu() for leaf in leaves if leaf.grad is not None])
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, msg=name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter plumbing test: Triton 3.6's interpreter (the "
                    "GPU machines' version) fails on the fused-chunk kernel's loop over tensor bounds; CI runs it")
@pytest.mark.slow
def test_dispatch_benchmark_script_runs(tmp_path):
    """benchmarks/gpu_dispatch.py (fused-chunk vs chunk-parallel timings) on the CPU interpreter: both kernels
    agree, and the 'picks' column is what `hgrn2_triton` does."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    out = tmp_path / "dispatch.json"
    subprocess.run([sys.executable, "benchmarks/gpu_dispatch.py", "--device", "cpu", "--shapes", "1x40x1,2x20x1",
                    "--head-dim", "16", "--out", str(out)], cwd=root, env=env, check=True, capture_output=True)
    rows = json.loads(out.read_text())
    assert [r["picks"] for r in rows] == ["fused", "fused"]  # shorter than parallel_min_t
    assert all(r["rel_diff"] <= 1e-2 and r["faster"] in ("fused", "parallel") for r in rows)
