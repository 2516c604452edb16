"""`hgrn2 bench gate`: the verdict per row, the base tree imported beside the working tree, and a whole quick run."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hgrn2.bench.gate import rows_spec, time_row, verdicts

ROOT = Path(__file__).resolve().parents[2]


def test_verdicts_fail_a_row_past_the_tolerance():
    times = {"a": {"base": [1.0, 1.1, 0.9], "tree": [1.04, 1.05, 1.0]},
             "b": {"base": [1.0, 1.0, 1.0], "tree": [1.2, 1.06, 1.07]},
             "c": {"base": [2.0], "tree": [1.0], "fla": [4.0]}}
    rows = {r["row"]: r for r in verdicts(times, 0.05)}
    assert rows["a"]["passed"] and rows["a"]["ratio"] == pytest.approx(1.04)
    assert not rows["b"]["passed"] and rows["b"]["ratio"] == pytest.approx(1.07)
    assert rows["c"]["passed"] and rows["c"]["tree_vs_fla"] == pytest.approx(0.25)


def fake_timer(times: dict[str, list[float]]):
    """A time function handing out each call's next time from `times`, and the calls that read them."""
    left = {name: iter(v) for name, v in times.items()}
    return {name: name for name in times}, lambda name: next(left[name])


def test_a_row_past_the_tolerance_is_timed_again_and_judged_on_all_rounds():
    # one slow round pair of identical code: confirmed as within the tolerance over 5 + 10 rounds
    calls, fn = fake_timer({"base": [1.0] * 15, "tree": [1.2, 1.2, 1.2, 1.0, 1.0] + [1.0] * 10, "fla": [3.0] * 5})
    t = time_row(calls, 5, 10, 0.05, fn)
    assert [len(t[n]) for n in ("base", "tree", "fla")] == [15, 15, 5]
    assert verdicts({"r": t}, 0.05)[0]["passed"] and verdicts({"r": t}, 0.05)[0]["rounds"] == 15
    # a tree slower in every round stays failed; a passing row gets no more rounds; 0 confirms nothing
    calls, fn = fake_timer({"base": [1.0] * 15, "tree": [1.1] * 15})
    assert not verdicts({"r": time_row(calls, 5, 10, 0.05, fn)}, 0.05)[0]["passed"]
    calls, fn = fake_timer({"base": [1.0] * 5, "tree": [1.04] * 5})
    assert len(time_row(calls, 5, 10, 0.05, fn)["tree"]) == 5
    calls, fn = fake_timer({"base": [1.0] * 5, "tree": [1.2] * 5})
    assert len(time_row(calls, 5, 0, 0.05, fn)["tree"]) == 5


def run_gate(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hgrn2.cli", "bench", "gate", "--quick", "--base-dir", str(ROOT),
                           "--out", str(tmp_path), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_quick_run_against_the_same_tree(tmp_path):
    """The tree against a copy of itself: both import side by side, agree exactly, and the record holds each row."""
    proc = run_gate(tmp_path, "--rows", "fwd,small,cross", "--rounds", "1", "--tolerance", "1000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads((tmp_path / "gate.json").read_text())
    names = [r["row"] for r in rec["rows"]]
    assert names == ["small β B2 T64", "fwd B2 T64", "fwd B1 T128", "fwd B1 T256", "fwd fast forgetting B2 T64",
                     "cross entropy V50265 N64", "cross entropy V32000 N64"]
    assert all(r["max_rel_diff"] == 0 and r["passed"] for r in rec["rows"])
    assert "gate: passed" in proc.stdout


@pytest.mark.slow
def test_argument_errors(tmp_path):
    for args, msg in ((["--rows", "nothing"], "--rows"), (["--rounds", "0"], "--rounds"),
                      (["--confirm-rounds", "-1"], "--confirm-rounds"),
                      (["--base-dir", str(tmp_path)], "--base-dir")):
        proc = run_gate(tmp_path, *args)
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-500:]


def test_half_precision_runs_add_the_fp32_training_rows():
    """On a GPU (bf16) the gate also times fwd+bwd and the small-β case in fp32, on fp32 inputs; the CPU's quick run,
    fp32 throughout, has no second copy of them. fla is not timed on them (its fp32 autotuning takes minutes)."""
    cpu = torch.device("cpu")
    half = {s["name"]: s for s in rows_spec(True, cpu, torch.bfloat16)}
    assert [n for n in half if "fp32" in n] == ["fwd+bwd fp32 B2 T64", "small β fp32 B2 T64"]
    assert all(t.dtype == torch.float32 for n in ("fwd+bwd fp32 B2 T64", "small β fp32 B2 T64")
               for t in half[n]["inputs"])
    assert half["small β fp32 B2 T64"]["inputs"][3].min() == 0  # the small-β bounds
    assert [n for n, s in half.items() if s.get("fla", True) is False and "fused" not in n] == [
        "fwd+bwd fp32 B2 T64", "small β fp32 B2 T64"]
    assert not [s for s in rows_spec(True, cpu, torch.float32) if "fp32" in s["name"]]


@pytest.mark.slow  # builds the full-size inputs of every row (tens of seconds on a CPU)
def test_fused_chunk_rows_take_the_fused_chunk_kernels():
    """The rows named "fused chunk" time the fused-chunk kernels at the gate's full size: their bound takes no
    gradient and their inputs are below the chunk-parallel kernels' thresholds; every other training row's bound is
    learnable (the chunk-parallel kernels)."""
    from hgrn2.ops.triton import takes_chunk_parallel

    rows = rows_spec(False, torch.device("cpu"), torch.bfloat16)
    fused = [s for s in rows if s["name"].startswith("fused chunk")]
    assert [s["name"] for s in fused] == ["fused chunk B8 T512", "fused chunk B4 T512",
                                          "fused chunk fast forgetting B4 T512"]
    for s in fused:
        o, lb = s["inputs"][0], s["inputs"][3]
        B, T, H = o.shape[:3]
        assert not lb.requires_grad and not takes_chunk_parallel(B, H, B * T, True)
        assert s["fla"] is False  # fla would autotune again at these shapes
    fixed = [s["name"] for s in rows if s["grad"] and "inputs" in s and not s["inputs"][3].requires_grad]
    assert fixed == ["fast forgetting fixed bound B8 T2048"] + [s["name"] for s in fused]


def test_closed_gates_row_puts_most_gates_of_a_quarter_of_the_heads_below_small_f():
    """The small-gates kernel's worst case: a learnable bound at 0 across the first quarter of the heads, most of
    whose gates lie below SMALL_F; the other heads hold the fast-forgetting channels only."""
    rows = {s["name"]: s for s in rows_spec(True, torch.device("cpu"), torch.float32)}
    o, g, i, lb = rows["closed gates B2 T64"]["inputs"]
    assert lb.requires_grad and bool((lb[:1] == 0).all())
    f = lb + (1 - lb) * torch.sigmoid(g.float())  # H 2 in the quick run: head 0 is the closed quarter
    assert (f[:, :, 0] < 2.0 ** -8).float().mean() > 0.5
    assert (f[:, :, 1, 3:] < 2.0 ** -8).float().mean() < 0.01


def test_small_bound_rows_have_a_twin_without_small_bounds():
    """Fast forgetting and closed gates each beside the same inputs with every β raised to 0.01: the time that a
    small bound's exact dβ is measured against."""
    rows = {s["name"]: s for s in rows_spec(True, torch.device("cpu"), torch.float32)}
    for label in ("fast forgetting", "closed gates"):
        small, floor = rows[f"{label} B2 T64"]["inputs"], rows[f"{label} β ≥ 0.01 B2 T64"]["inputs"]
        for a, b in zip(small[:3], floor[:3]):
            assert torch.equal(a, b)
        assert small[3].min() == 0 and floor[3].min() == 0.01 and floor[3].requires_grad
        assert torch.equal(floor[3], small[3].clamp(min=0.01))


def test_a_run_cut_short_leaves_the_rows_it_finished(tmp_path, monkeypatch):
    """gate.json is written after every row: a gate stopped by a time limit keeps its finished rows, marked
    incomplete, and BENCHMARKS.md says how many of how many."""
    from hgrn2.bench import gate, report

    real, done = gate.time_row, []

    def time_row(*a, **kw):
        if len(done) == 2:
            raise KeyboardInterrupt  # the time limit
        done.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(gate, "time_row", time_row)
    args = argparse.Namespace(base=None, base_dir=str(ROOT), rounds=1, confirm_rounds=0, tolerance=1000.0,
                              rows="fwd", fla=False, quick=True, out=str(tmp_path), command_line="hgrn2 bench gate")
    with pytest.raises(KeyboardInterrupt):
        gate.run(args)
    rec = json.loads((tmp_path / "gate.json").read_text())
    assert [r["row"] for r in rec["rows"]] == ["fwd B2 T64", "fwd B1 T128"]
    assert rec["complete"] is False and rec["rows_total"] == 4
    assert "The run stopped after 2 of its 4 rows." in report.gate_table(rec)
    assert "stopped" not in report.gate_table({**rec, "complete": True})
