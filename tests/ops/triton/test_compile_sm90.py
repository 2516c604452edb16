"""The interpreter accepts code Triton's compiler rejects (loop-carried type changes, returns inside runtime
branches, layouts): compile each kernel family's default variants for sm_90, without a GPU. With a GPU every
kernel test compiles and runs them for real. `python tests/ops/triton/compile_sm90.py GROUP` runs a group by hand
(fused-chunk, fused-chunk-grid, chunk-parallel and glue print registers and spills for every variant)."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch


@pytest.mark.slow
@pytest.mark.parametrize("group", ["recurrent", "hgrn1", "small-heads", "fused-chunk-default", "chunk-parallel-default",
                                   "glue"])
def test_kernels_compile_for_sm90(group):
    if torch.cuda.is_available():
        pytest.skip("covered by the GPU runs")
    pytest.importorskip("triton.backends.nvidia")
    root = pathlib.Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    script = root / "tests" / "ops" / "triton" / "compile_sm90.py"
    r = subprocess.run([sys.executable, str(script), group], env=env, cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
