import pytest
import torch
import torch.nn.functional as F

from hgrn2.bench.common import rel_err
from hgrn2.ops.cross_entropy import linear_cross_entropy


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
def test_matches_cross_entropy_with_grads(reduction, chunk_size):
    N, d, V = 23, 16, 37
    h = torch.randn(N, d, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, d, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, V, (N,))
    labels[::5] = -100
    loss = linear_cross_entropy(h, w, labels, chunk_size=chunk_size, reduction=reduction)
    ref = F.cross_entropy(h @ w.t(), labels, ignore_index=-100, reduction=reduction)
    assert rel_err(loss, ref) < 1e-6
    g = torch.randn(())
    dh, dw = torch.autograd.grad(loss * g, (h, w))
    rh, rw = torch.autograd.grad(ref * g, (h, w))
    assert rel_err(dh, rh) < 1e-6 and rel_err(dw, rw) < 1e-6


def test_fp32_and_all_ignored():
    h = torch.randn(9, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    labels = torch.randint(0, 11, (9,))
    assert rel_err(linear_cross_entropy(h, w, labels, chunk_size=4), F.cross_entropy(h @ w.t(), labels)) < 1e-5
    loss = linear_cross_entropy(h, w, torch.full((9,), -100))
    loss.backward()
    assert loss.item() == 0 and h.grad.abs().sum() == 0 and w.grad.abs().sum() == 0


def test_bad_input():
    h, w = torch.randn(4, 8), torch.randn(5, 8)
    with pytest.raises(ValueError, match="labels"):
        linear_cross_entropy(h, w, torch.tensor([0, 1, 5, 2]))
    with pytest.raises(ValueError, match="labels"):
        linear_cross_entropy(h, w, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="weight"):
        linear_cross_entropy(h, torch.randn(5, 7), torch.zeros(4, dtype=torch.long))


def test_autocast_uses_autocast_dtype_consistently():
    h = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(13, 8, requires_grad=True)
    labels = torch.randint(0, 13, (10,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, labels, chunk_size=3)
    gh, gw = torch.autograd.grad(loss, (h, w))
    ref = linear_cross_entropy(h.bfloat16(), w.bfloat16(), labels, chunk_size=3)
    rh, rw = torch.autograd.grad(ref, (h, w))
    assert loss.dtype == torch.float32 and torch.equal(loss, ref)
    assert gh.dtype == torch.float32 and torch.equal(gh, rh) and torch.equal(gw, rw)
    # and bf16 is close to the fp32 truth
    exact = F.cross_entropy(h @ w.t(), labels)
    assert rel_err(loss, exact) < 2e-2


# within one block of the vocabulary, a multiple of the rows' alignment (no padding), a full + a partial block
@pytest.mark.parametrize("V", [37, 128, 2500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_match(monkeypatch, V, dtype):
    """The CUDA path's kernels (forced here; on the CPU they run in Triton's interpreter): loss and gradients
    within fp32 rounding of the fp64 truth for fp32 inputs, and as accurate as the composite for bf16."""
    pytest.importorskip("triton")
    import hgrn2.ops.cross_entropy as ce

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    N, d = 19, 24
    h = (torch.randn(N, d) * 0.5).to(dev, dtype)
    w = torch.randn(V, d).to(dev, dtype)
    labels = torch.randint(0, V, (N,), device=dev)
    labels[::4] = -100

    def run(kernels, h, w):
        monkeypatch.setattr(ce, "_use_triton", lambda x: kernels)
        h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
        loss = linear_cross_entropy(h, w, labels, chunk_size=7)
        return [loss, *torch.autograd.grad(loss * 1.7, (h, w))]

    ours, comp = run(True, h, w), run(False, h, w)
    truth = run(False, h.double(), w.double())
    for a, c, t in zip(ours, comp, truth):
        assert a.dtype == c.dtype
        if dtype == torch.float32:
            assert rel_err(a, t) < 1e-5
        else:
            assert rel_err(a, t) <= max(1.05 * rel_err(c, t), 1e-3), (rel_err(a, t), rel_err(c, t))


def test_kernels_take_padded_rows_and_refuse_strided_columns():
    """The kernels read [C, V] views of wider rows (the padded logits) and refuse non-contiguous rows."""
    pytest.importorskip("triton")
    from hgrn2.ops.triton.cross_entropy import ce_bwd_, ce_fwd

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    wide = torch.randn(5, 64, device=dev)
    wide[:, 37:] = 1e4  # beyond the view: would dominate the log-sum-exp if read
    labels = torch.randint(0, 37, (5,), device=dev)
    lse, target = ce_fwd(wide[:, :37], labels)
    ref = wide[:, :37].double()
    assert rel_err(lse, ref.logsumexp(-1)) < 1e-6 and torch.equal(target, wide[:, :37].gather(1, labels[:, None])[:, 0])
    ce_bwd_(wide[:, :37], labels, lse, torch.ones(5, device=dev))
    expect = ref.softmax(-1) - F.one_hot(labels, 37).double()
    assert rel_err(wide[:, :37], expect) < 1e-5 and (wide[:, 37:] == 1e4).all()
    with pytest.raises(ValueError, match="logits"):
        ce_fwd(wide.t()[:37], labels)
