"""benchmarks/gpu_ddp.py --fsdp-variants on the CPU: one process, then two gloo ranks reading its record as the
baseline: every variant trains on the same batches (the fp32 ones give the one-process losses), and the old and
the sharded checkpoint are timed."""

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
    p = run_command([*torchrun(2), script, "--fsdp-variants", "fsdp", "fsdp-never", "fsdp-bf16", "ddp-fused", *ARGS,
                     "--out", str(tmp_path / "two"), "--baseline", str(tmp_path / "one" / "fsdp_variants.json")],
                    timeout=600)
    two = json.loads((tmp_path / "two" / "fsdp_variants.json").read_text())
    rows = {r["run"]: r for r in two["rows"]}
    assert list(rows) == ["fsdp", "fsdp-never", "fsdp-bf16", "ddp-fused"] and two["world_size"] == 2
    for name in ("fsdp", "fsdp-never", "ddp-fused"):  # ddp-fused against the fused one-process run
        assert rows[name]["max_rel_loss_diff_vs_1gpu"] < 1e-5
    assert 0 < rows["fsdp-bf16"]["max_rel_loss_diff_vs_1gpu"] < 1e-2  # bf16 parameters: close, not equal
    assert all(r["speedup_vs_1gpu"] > 0 for r in rows.values())
    assert [c["checkpoint"].split()[0] for c in two["checkpoints"]] == ["full", "sharded"]
    assert all(c["save_s"] > 0 and c["load_s"] > 0 for c in two["checkpoints"])
    assert p.stdout.rstrip().endswith("|") and "| sharded (torch.distributed.checkpoint) |" in p.stdout
