"""Head dimensions below the kernels' 16-wide tile (the expand-ratio ablation's 1 to 8) are masked, not refused:
both training families match the fp64 reference there, outputs, final state and every gradient."""

import pytest

from hgrn2.ops.triton import hgrn2_chunk_parallel_triton, hgrn2_fused_chunk_triton

from .harness import check, make_inputs, needs_triton, run_both

pytestmark = needs_triton


@pytest.mark.parametrize("fn", [hgrn2_fused_chunk_triton, hgrn2_chunk_parallel_triton],
                         ids=["fused_chunk", "chunk_parallel"])
@pytest.mark.parametrize("K", [1, 4])
def test_head_dim_below_tile(fn, K):
    inputs = make_inputs(2, 70, 3, K, K, n_states=2)
    check(*run_both(inputs, fn, o_act="sigmoid", i_act="silu", output_final_state=True))
