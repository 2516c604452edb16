"""MQAR model and sweep: zoology's block order, the gathered head, learning on CPU, resume, budget, CLI."""

import json
import math
import re
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hgrn2.cli import main as cli_main
from hgrn2.experiments import mqar as sweep_mod
from hgrn2.models.zoology import ZoologyLM
from hgrn2.train.mqar import RunSpec, train_run

STAND_IN = "tests.train.test_mqar:ShiftedKeyAttention"


class ShiftedKeyAttention(nn.Module):
    """Stand-in token mixer for the plumbing tests (the library's mixers live in hgrn2.layers): one-head causal
    softmax attention whose key at t is read from token t−1, so one layer can look up "the token after k"."""

    def __init__(self, hidden_size, *, layer_idx=0):
        super().__init__()
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x, lower_bound=None, state=None, use_cache=False, attention_mask=None, cu_seqlens=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        k = F.pad(k, (0, 0, 1, 0))[:, :-1]
        y = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=True)[:, 0]
        return self.out_proj(y), None


class Broken(ShiftedKeyAttention):
    def forward(self, x, **kwargs):
        raise RuntimeError("broken mixer")


def tiny_spec(**kw):
    base = dict(mixer=STAND_IN, d_model=32, seq_len=16, kv_pairs=2, lr=3e-3, batch_size=32, epochs=12,
                train_examples=512, test_examples=128, vocab_size=64)
    return RunSpec(**{**base, **kw})


def zoology_forward(model: ZoologyLM, ids):
    """Oracle: zoology's LMBackbone + LanguageModel forward (model.py), transcribed over our modules."""
    hidden = model.embed(ids)
    residual = None
    for blk in model.blocks:
        dropped = blk.dropout(hidden)
        residual = dropped + residual if residual is not None else dropped
        hidden = blk.norm1(residual)
        hidden = blk.mixer(hidden)[0]
        residual = hidden + residual
        hidden = blk.norm2(residual)  # state_mixer = Identity
    residual = hidden + residual
    return model.norm_f(residual) @ model.embed.weight.T


def test_model_matches_zoology_and_gathers():
    model = ZoologyLM(ShiftedKeyAttention, 16, vocab_size=50).eval()
    ids = torch.randint(0, 50, (3, 10))
    full = model(ids)
    torch.testing.assert_close(full, zoology_forward(model, ids))
    pos = torch.tensor([[1, 4], [0, 9], [7, 7]])
    torch.testing.assert_close(model(ids, pos), full.gather(1, pos[..., None].expand(-1, -1, 50)))


def test_model_init_and_positions():
    model = ZoologyLM(ShiftedKeyAttention, 64, vocab_size=4096, max_position_embeddings=32)
    assert abs(model.embed.weight.std().item() - 0.02) < 2e-3
    out_std = torch.cat([b.mixer.out_proj.weight.flatten() for b in model.blocks]).std().item()
    assert abs(out_std - 0.02 / math.sqrt(4)) < 2e-3
    assert all((b.mixer.qkv.bias == 0).all() for b in model.blocks)
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.1 for m in model.modules()) == 1
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_learns_easy_recall_on_cpu(tmp_path):
    result = train_run(tiny_spec(), "cpu", data_dir=tmp_path)
    # chance is 1/32 (any value) or 1/2 (a value of this example); recall is needed to pass 0.9
    assert result["best_accuracy"] > 0.9, result["history"]
    assert result["complete"] and not result["diverged"]
    first = result["history"][0]
    assert first["train_loss"] > result["history"][-1]["train_loss"]
    assert result["early_stopped"] == (result["final_accuracy"] > 0.99)


def test_budget_cuts_a_run(tmp_path):
    result = train_run(tiny_spec(epochs=3), "cpu", data_dir=tmp_path, deadline=time.time() - 1)
    assert not result["complete"] and result["epochs_run"] == 1 and result["steps"] == 1
    # the cut epoch's train loss is its one batch's loss (≈ ln 64 at init), not that spread over the epoch
    assert result["history"][0]["train_loss"] > 0.8 * math.log(64)


class Killed(Exception):
    pass


def test_killed_run_resumes_exactly_from_its_last_epoch(tmp_path):
    """A run killed after epoch 3 (its checkpoint written) continues from there: the same per-epoch losses and
    accuracies as the uninterrupted run, bit for bit (fixed batch order, RNG restored: embedding dropout)."""
    spec = tiny_spec(epochs=6, early_stop_accuracy=2.0)  # never stops early: all six epochs
    whole = train_run(spec, "cpu", data_dir=tmp_path)

    def kill_after_third(record):
        if record["epoch"] == 2:
            raise Killed

    ckpt = tmp_path / "ckpt"
    with pytest.raises(Killed):
        train_run(spec, "cpu", data_dir=tmp_path, on_epoch=kill_after_third, checkpoint_dir=ckpt)
    resumed = train_run(spec, "cpu", data_dir=tmp_path, checkpoint_dir=ckpt)
    keys = ("epoch", "lr", "train_loss", "test_loss", "accuracy")
    assert [{k: h[k] for k in keys} for h in resumed["history"]] == [{k: h[k] for k in keys} for h in whole["history"]]
    assert resumed["steps"] == whole["steps"] and resumed["complete"]
    with pytest.raises(ValueError, match="`checkpoint_dir`: holds run"):
        train_run(tiny_spec(lr=1e-3), "cpu", data_dir=tmp_path, checkpoint_dir=ckpt)


def sweep_build(argv: list[str]) -> tuple[list[RunSpec], dict]:
    """The runs and grid `hgrn2 mqar ARGV` would make."""
    parser = __import__("argparse").ArgumentParser()
    sweep_mod.add_arguments(parser)
    return sweep_mod.build_runs(parser.parse_args(argv), sweep_mod.load_config())


def test_laptop_preset_is_small_and_the_default_on_a_cpu(capsys):
    runs, grid = sweep_build(["--preset", "laptop"])
    assert {r.mixer for r in runs} == {"hgrn2", "hgrn1_complex", "attention"} and len(runs) == 3
    assert sum(r.total_steps for r in runs) <= 8000 and {r.seq_len for r in runs} == {64}
    # `per_mixer` replaces fields for one mixer; the command line overrides both
    assert {r.mixer: r.batch_size for r in runs} == {"hgrn2": 32, "hgrn1_complex": 32, "attention": 128}
    runs, _ = sweep_build(["--preset", "laptop", "--batch-size", "64", "--lrs", "1e-3"])
    assert {(r.batch_size, r.lr) for r in runs} == {(64, 1e-3)}
    assert cli_main(["mqar", "--list", "--device", "cpu"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(runs)


def test_build_runs_presets_and_overrides():
    runs, grid = sweep_build([])
    # quick keeps the protocol's data (fewer examples are memorised, not learned) and has no time budget
    assert len(runs) == 24 and {r.epochs for r in runs} == {64} and grid["max_minutes"] is None
    assert grid["dims"] == [64, 128] and grid["lrs"] == [5e-4, 1e-3, 5e-3, 1e-2]
    assert {r.train_examples for r in runs} == {100_000}
    hgrn2 = [r for r in runs if r.mixer == "hgrn2" and r.d_model == 64][0]
    assert hgrn2.mixer_options == dict(expand_ratio=64, o_act="sigmoid", i_act="silu", scale=1.0, norm="layernorm",
                                       bias=True)
    assert {(r.seq_len, r.kv_pairs, r.batch_size) for r in runs} == {(256, 16, 256)}
    full, _ = sweep_build(["--preset", "full"])
    assert len(full) == 3 * 4 * 4 * 7 and {r.train_examples for r in full} == {100_000}
    runs, _ = sweep_build(["--preset", "full", "--mixers", "hgrn2", "--dims", "64,128", "--lrs", "1e-3",
                           "--seq-lens", "64", "32:2", "--epochs", "2"])
    assert [(r.d_model, r.seq_len, r.kv_pairs, r.epochs) for r in runs] == \
        [(64, 64, 4, 2), (128, 64, 4, 2), (64, 32, 2, 2), (128, 32, 2, 2)]
    assert len({r.run_id for r in runs}) == 4
    with pytest.raises(ValueError, match="seq-lens"):
        sweep_build(["--seq-lens", "100"])


def _cli(tmp_path, *extra):
    return cli_main(["mqar", "--mixers", STAND_IN, "--dims", "16", "--lrs", "3e-3", "--seq-lens", "16:2",
                     "--epochs", "2", "--train-examples", "64", "--test-examples", "32", "--vocab-size", "64",
                     "--batch-size", "32", "--device", "cpu", "--out", str(tmp_path / "out"),
                     "--data-dir", str(tmp_path / "data"), *extra])


def test_cli_sweep_resumes(tmp_path, capsys):
    assert _cli(tmp_path, "--dims", "16,32") == 0
    printed = capsys.readouterr()
    # the bar names the run in training; each epoch's test accuracy is printed above it
    ids = sorted(p.stem for p in (tmp_path / "out" / "runs").glob("*.json"))
    assert all(f": {i}" in printed.err for i in ids) and "run 2/2: " in printed.err
    assert re.search(r": epoch 1/2, test accuracy \d\.\d{3}\n", printed.out)
    # progress counts optimiser steps: 2 runs × 2 epochs × 2 batches of 32 (early stops count their remainder)
    assert "MQAR steps" in printed.err and RunSpec(**{**asdict(tiny_spec()), "epochs": 2,
                                                                  "train_examples": 64}).total_steps == 4
    out = tmp_path / "out"
    files = sorted((out / "runs").glob("*.json"))
    assert len(files) == 2 and (out / "mqar.png").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    assert all(r["complete"] and r["epochs_run"] <= 2 for r in results)
    assert not any((out / "checkpoints").glob("*/step_*"))  # a complete run's per-epoch checkpoints are deleted
    assert "MQAR test accuracy" in (out / "table.txt").read_text()
    mtimes = [f.stat().st_mtime_ns for f in files]
    capsys.readouterr()
    assert _cli(tmp_path, "--dims", "16,32") == 0
    assert "2 already done, 0 to train" in capsys.readouterr().out
    assert [f.stat().st_mtime_ns for f in files] == mtimes


def test_a_second_sweep_into_one_folder_is_refused(tmp_path, capsys):
    """Its lock on the output folder: nothing trained, no table, figure or results.json written, one line."""
    from hgrn2.train.guard import RunError, RunLock

    lock = RunLock(str(tmp_path / "out"))
    try:
        with pytest.raises(RunError, match="is in use by another process"):  # `hgrn2` prints it, exit 1
            _cli(tmp_path)
    finally:
        lock.release()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".lock"]


def test_cli_report_trains_nothing(tmp_path, capsys):
    assert _cli(tmp_path) == 0
    out = tmp_path / "out"
    capsys.readouterr()
    assert _cli(tmp_path, "--dims", "16,32", "--report") == 0  # d=32 was never run: reported missing, not trained
    printed = capsys.readouterr().out
    assert "1 of 2 runs are not complete: run the same command without --report" in printed
    assert len(list((out / "runs").glob("*.json"))) == 1 and "MQAR epochs" not in printed
    rows = (out / "table.txt").read_text().splitlines()[-2:]
    assert rows[0].split()[1:3] != ["16", "-"] and rows[1].split()[1:] == ["32", "-"]
    assert len(json.loads((out / "results.json").read_text())) == 1


def test_cli_record_is_a_benchmark_record(tmp_path, capsys):
    from hgrn2.bench.common import REQUIRED_KEYS
    from hgrn2.bench.report import mqar_table

    assert _cli(tmp_path, "--record", str(tmp_path / "rec")) == 0
    rec = json.loads((tmp_path / "rec" / "mqar.json").read_text())
    assert [k for k in REQUIRED_KEYS if k not in rec] == [] and rec["benchmark"] == "mqar"
    assert rec["command"].startswith("hgrn2 mqar ") and rec["wall_seconds"] > 0 and rec["threads"] >= 1
    assert (tmp_path / "rec" / rec["figure"]).stat().st_size > 0
    (row,) = rec["rows"]
    assert row["mixer"] == STAND_IN and row["complete"] and row["spec"]["seq_len"] == 16
    assert "the whole command took" in mqar_table(rec)
    # a rerun trains nothing, so its time is not the sweep's: the record leaves the wall time out
    assert _cli(tmp_path, "--record", str(tmp_path / "rec")) == 0
    assert "wall_seconds" not in json.loads((tmp_path / "rec" / "mqar.json").read_text())
    # an incomplete sweep is not recorded
    assert _cli(tmp_path, "--dims", "16,32", "--report", "--record", str(tmp_path / "rec2")) == 0
    assert not (tmp_path / "rec2").exists()


def _strict_json(path: Path):
    """The JSON at `path`, refused if it holds NaN or Infinity (not JSON, though Python's json writes them)."""
    def refuse(constant):
        raise ValueError(f"{path} holds {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_diverged_run_is_written_as_strict_json(tmp_path, capsys):
    assert _cli(tmp_path, "--lrs", "1e4", "--record", str(tmp_path / "rec")) == 0
    out = tmp_path / "out"
    (result,) = _strict_json(out / "results.json")
    assert result["diverged"] and result["history"][-1]["train_loss"] is None  # NaN written as null
    assert _strict_json(next((out / "runs").glob("*.json")))["diverged"]
    assert _strict_json(tmp_path / "rec" / "mqar.json")["rows"][0]["complete"]
    assert re.search(r"\d\.\d{3}!", (out / "table.txt").read_text())  # the cell still says it diverged
    capsys.readouterr()
    assert _cli(tmp_path, "--lrs", "1e4", "--report") == 0  # the nulls read back
    assert "train/test loss nan/nan" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_concurrent_workers(tmp_path):
    assert _cli(tmp_path, "--lrs", "1e-3,3e-3", "--concurrent", "2") == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(results) == 2 and all(r["complete"] for r in results)


def test_cli_reports_failing_runs(tmp_path, capsys):
    assert _cli(tmp_path, "--mixers", STAND_IN, "tests.train.test_mqar:Broken") == 1
    out = capsys.readouterr().out
    assert "broken mixer" in out and "1 run(s) failed" in out
    assert len(json.loads((tmp_path / "out" / "results.json").read_text())) == 1


def test_table_takes_max_over_lrs():
    def res(lr, acc, complete=True):
        spec = dict(mixer="hgrn2", d_model=64, seq_len=256, kv_pairs=16, lr=lr)
        return dict(spec=spec, final_accuracy=acc, complete=complete)

    text = sweep_mod.table([res(1e-3, 0.5), res(5e-3, 0.75, complete=False)], ["hgrn2", "attention"], [64], [256])
    assert "0.750*" in text and "0.500" not in text
    assert text.splitlines()[-1].split()[-1] == "-"
    diverged = {**res(1e-2, 0.0), "diverged": True}  # the best of its learning rates here: marked, not a plain 0
    assert "0.000!" in sweep_mod.table([diverged], ["hgrn2"], [64], [256])


@pytest.mark.parametrize("mixer", ["hgrn2", "hgrn1_complex", "attention"])
def test_real_mixers_train(tmp_path, mixer):
    cfg = sweep_mod.load_config()
    opts = dict(cfg["mixers"][mixer])
    if "expand_ratio" in opts:
        opts["expand_ratio"] = 16
    result = train_run(tiny_spec(mixer=mixer, mixer_options=opts, epochs=2, train_examples=128, d_model=32),
                       "cpu", data_dir=tmp_path)
    assert result["complete"] and all(math.isfinite(h["train_loss"]) for h in result["history"])
    assert 0.0 <= result["final_accuracy"] <= 1.0


def test_profile_script_runs_on_cpu():
    """benchmarks/profile_mqar_step.py (the GPU suite's `profile` step) on a tiny CPU model: a step time and the
    profiler's table."""
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "benchmarks/profile_mqar_step.py", "--device", "cpu", "--d", "16", "--L",
                          "32", "--batch", "2", "--queries", "4", "--steps", "2"], cwd=root, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert "hgrn2 d=16 L=32 B=2: " in out.stdout and "ms/step" in out.stdout and "Self CPU" in out.stdout


def test_padded_batch_gives_the_smaller_batch_loss_and_gradients():
    """`hgrn2.train.graphed.pad_into`: an epoch's last, smaller batch padded to the captured shape with
    ignored targets gives the smaller batch's loss and gradients (dropout off)."""
    from hgrn2.train.graphed import pad_into

    torch.manual_seed(0)
    model = ZoologyLM(ShiftedKeyAttention, 16, vocab_size=32, embed_dropout=0.0)
    ids = torch.randint(0, 32, (3, 12), dtype=torch.int32)
    pos = torch.sort(torch.rand(3, 12).argsort(-1)[:, :4], -1).values
    tgt = torch.randint(0, 32, (3, 4))
    static = [torch.full((5, 12), 7, dtype=torch.int32), torch.zeros(5, 4, dtype=torch.long),
              torch.ones(5, 4, dtype=torch.long)]
    pad_into(static, (ids, pos, tgt), (0, 0, -100))
    assert torch.equal(static[0][:3], ids) and (static[0][3:] == 0).all() and (static[2][3:] == -100).all()
    grads = []
    for batch in ((ids, pos, tgt), static):
        model.zero_grad()
        loss = F.cross_entropy(model(*batch[:2]).flatten(0, 1), batch[2].flatten())
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_a, ga), (loss_b, gb) = grads
    torch.testing.assert_close(loss_b, loss_a)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(b, a)
    with pytest.raises(ValueError, match="batch: expected at most"):
        pad_into(static, (torch.zeros(6, 12, dtype=torch.int32), pos, tgt), (0, 0, -100))
    absent = [static[0], None]  # an input absent from every batch (LRA's lengths of the pixel tasks)
    pad_into(absent, (ids, None), (0, 0))
    assert absent[1] is None and torch.equal(absent[0][:3], ids)
    with pytest.raises(ValueError, match="batch: expected at most None"):
        pad_into(absent, (ids, tgt), (0, 0))


def test_cuda_graph_needs_cuda_and_a_capturable_optimizer(tmp_path):
    from hgrn2.train.graphed import GraphedStep

    with pytest.raises(ValueError, match="`cuda_graph`: needs a CUDA device"):
        train_run(tiny_spec(), "cpu", data_dir=tmp_path, cuda_graph=True)
    opt = torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="`optimizer`: expected capturable=True"):
        GraphedStep(lambda *b: None, opt, pad_values=(0,))
    with pytest.raises(ValueError, match="--cuda-graph: needs a CUDA device"):
        cli_main(["mqar", "--device", "cpu", "--cuda-graph", "--out", str(tmp_path)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mixer", [STAND_IN, "hgrn2", "attention", "hgrn1_complex"])
def test_cuda_graph_training_learns_like_eager(tmp_path, mixer):
    """On a GPU: the graphed run (warm-up, capture, replays, padded last batches, the scheduler's in-place
    learning rate) trains as the eager one does, with every mixer of the sweep (a host sync in a forward breaks
    the capture); the stand-in learns the easy recall both ways."""
    # the mixer as the sweep builds it (HGRU2's default head dim 128 does not divide d = 32)
    options = {} if mixer == STAND_IN else sweep_build(["--mixers", mixer, "--dims", "32"])[0][0].mixer_options
    # 500 = 15 batches of 32 + one of 20: padded every epoch
    spec = tiny_spec(train_examples=500, mixer=mixer, mixer_options=options)
    eager = train_run(spec, "cuda", data_dir=tmp_path)
    graphed = train_run(spec, "cuda", data_dir=tmp_path, cuda_graph=True)
    if mixer == STAND_IN:
        assert graphed["best_accuracy"] > 0.9 and eager["best_accuracy"] > 0.9
    for run in (eager, graphed):  # the real mixers at this size: the loss falls
        assert run["history"][-1]["train_loss"] < 0.9 * run["history"][0]["train_loss"]
    first = [h["train_loss"] for h in (eager["history"][0], graphed["history"][0])]
    assert abs(first[0] - first[1]) <= 0.05 * first[0]  # dropout masks differ, the data and init do not
    # the graphed schedule steps a float32 tensor in place: the eager floats to float32 rounding
    lrs = [h["lr"] for h in eager["history"]][: len(graphed["history"])]
    assert [h["lr"] for h in graphed["history"]] == pytest.approx(lrs, rel=1e-6)


def test_recorded_quick_runs_are_the_presets_runs():
    """README's MQAR table comes from benchmarks/results/h200/mqar.json: each of the quick preset's runs (ids hash
    the whole spec) has a complete result there, so a change of protocol or preset that makes those results stale
    fails here."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200" / "mqar.json"
    recorded = {r["run_id"]: r for r in json.loads(path.read_text())["rows"]}
    runs, _ = sweep_build(["--preset", "quick"])
    missing = [r.run_id for r in runs if r.run_id not in recorded]
    assert not missing, f"quick-preset runs without a recorded result: {missing}"
    assert all(recorded[r.run_id]["complete"] and recorded[r.run_id]["spec"] == asdict(r) for r in runs)
