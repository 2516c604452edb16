"""benchmarks/gpu_ddp.py --fsdp-variants on the CPU: one process, then two gloo ranks reading its record as the
baseline: every variant trains on the same batches (the fp32 ones give the one-process losses), and the old and
the sharded checkpoint are timed."""

import importlib.util
import json
import sys

import pytest

from tests.train.helpers import ROOT, run_command, torchrun

ARGS = ["--device", "cpu", "--preset", "tiny", "--steps", "4", "--batch", "8", "--micro", "2",
        "--seq-len", "32", "--vocab", "96"]


@pytest.mark.slow
def test_fsdp_variants_on_two_gloo_ranks_against_one_process(tmp_path):
    script = f"{ROOT}/benchmarks/gpu_ddp.py"
    run_command([sys.executable, script, "--fsdp-variants", *ARGS, "--out", str(tmp_path / "one")], timeout=600)
    one = json.loads((tmp_path / "one" / "fsdp_variants.json").read_text())
    assert [r["run"] for r in one["rows"]] == ["1 GPU", "1 GPU fused"] and one["world_size"] == 1
    p = run_command([*torchrun(2), script, "--fsdp-variants", "fsdp", "fsdp-never", "fsdp-bf16", "ddp-fused",
                     "fsdp-bf16-never-whole", *ARGS,
                     "--out", str(tmp_path / "two"), "--baseline", str(tmp_path / "one" / "fsdp_variants.json"),
                     "--profile", str(tmp_path / "prof")], timeout=600)
    assert (tmp_path / "prof" / "fsdp.rank1.txt").read_text().count("aten::") > 3  # each rank's operator table
    two = json.loads((tmp_path / "two" / "fsdp_variants.json").read_text())
    rows = {r["run"]: r for r in two["rows"]}
    assert list(rows) == ["fsdp", "fsdp-never", "fsdp-bf16", "ddp-fused", "fsdp-bf16-never-whole"]
    assert two["world_size"] == 2
    for name in ("fsdp", "fsdp-never", "ddp-fused"):  # ddp-fused against the fused one-process run
        assert rows[name]["max_rel_loss_diff_vs_1gpu"] < 1e-5
    for name in ("fsdp-bf16", "fsdp-bf16-never-whole"):  # bf16 parameters: close, not equal
        assert 0 < rows[name]["max_rel_loss_diff_vs_1gpu"] < 1e-2
    assert all(r["speedup_vs_1gpu"] > 0 for r in rows.values())
    assert [c["checkpoint"].split()[0] for c in two["checkpoints"]] == ["full", "sharded"]
    assert all(c["save_s"] > 0 and c["load_s"] > 0 for c in two["checkpoints"])
    assert p.stdout.rstrip().endswith("|") and "| sharded (torch.distributed.checkpoint) |" in p.stdout


def test_profile_summary_splits_communication_by_what_runs_beside_it():
    spec = importlib.util.spec_from_file_location("gpu_ddp", f"{ROOT}/benchmarks/gpu_ddp.py")
    gpu_ddp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_ddp)
    # µs: a matmul, an all-gather half beside it, a lone reduce-scatter, another matmul, an all-reduce inside it
    iv = [(0, 1000, "gemm"), (500, 2000, "nccldevkernel_allgather_ring_ll"),
          (2500, 3000, "nccldevkernel_reducescatter"), (3000, 5000, "gemm2"),
          (3500, 4000, "nccldevkernel_allreduce_sum")]
    out = gpu_ddp._exposed(iv, 1)
    assert out["exposed_by_ms"] == {"allgather": 1.0, "reducescatter": 0.5, "allreduce": 0.0}
    top = out["exposed_top"][0]
    assert top == {"at_ms": 0.5, "ms": 1.0, "kind": "allgather", "after": ""}
    assert out["exposed_top"][1]["after"] == "gemm"  # the reduce-scatter follows the first matmul
    assert gpu_ddp._union([(0, 2), (1, 3), (5, 6)]) == 4
