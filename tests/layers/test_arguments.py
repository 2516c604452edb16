"""Bad arguments to the layers: a one-line ValueError naming the argument."""

import pytest
import torch

from hgrn2.layers.hgru2 import HGRU2
from hgrn2.layers.norm import RMSNorm


def test_hgru2_rejects_2d_input():
    layer = HGRU2(16, expand_ratio=8)
    with pytest.raises(ValueError, match=r"`x`: expected a \[batch, seq_len, 16\] tensor, got \(5, 16\)"):
        layer(torch.randn(5, 16))


def test_hgru2_rejects_lower_bound_of_wrong_shape():
    layer = HGRU2(16, expand_ratio=8)
    with pytest.raises(ValueError, match=r"`lower_bound`: expected shape \(16,\), got \(2, 8\)"):
        layer(torch.randn(1, 5, 16), lower_bound=torch.zeros(2, 8))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), None, True])
def test_hgru2_rejects_non_finite_scale(scale):
    with pytest.raises(ValueError, match="`scale`: expected 'auto' or a finite number"):
        HGRU2(16, expand_ratio=8, scale=scale)


@pytest.mark.parametrize("eps", [-1, 0, float("nan"), float("inf"), None])
def test_norm_eps_must_be_positive(eps):
    with pytest.raises(ValueError, match="`norm_eps`: expected a positive finite number"):
        HGRU2(16, expand_ratio=8, norm_eps=eps)
    with pytest.raises(ValueError, match="`eps`: expected a positive finite number"):
        RMSNorm(16, eps=eps)
