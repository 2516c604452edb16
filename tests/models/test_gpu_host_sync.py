"""A whole training step of the paper's 374M model on a GPU makes no synchronizing CUDA call: forward, loss,
backward (every layer's lower bound takes a gradient, small ones included) and the AdamW step, under
`torch.cuda.set_sync_debug_mode("error")`, which raises on one."""

import pytest
import torch

from hgrn2.models import HGRN2Config, HGRN2ForCausalLM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("small_bounds", [False, True])
def test_training_step_without_host_sync(small_bounds):
    torch.manual_seed(0)
    model = HGRN2ForCausalLM(HGRN2Config.from_preset("paper-385m")).cuda()
    if small_bounds:  # layer 1's bounds near 0 in some channels: the exact small-gate dβ runs
        with torch.no_grad():
            model.model.lower_bounds[1:, :64] = -30.0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (2, 2048), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step()  # kernels compiled, optimiser state made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss)
