"""`hgrn2 bench train --quick`: the benchmark's code path runs end to end and writes its JSON (no timing checks)."""

import json
import math
import statistics

import pytest
import torch


def test_bench_train_quick(tmp_path, capsys):
    from hgrn2.cli import main

    assert main(["bench", "train", "--quick", "--models", "llama,hgrn2,fla", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "train.json").read_text())
    rows = {r["model"]: r for r in report["rows"]}
    assert set(rows) == {"llama", "hgrn2", "fla"} and report["versions"]["torch"] == torch.__version__
    assert report["command"].startswith("hgrn2 bench train --quick")
    llama = rows["llama"]
    assert llama["status"] == "ok" and (llama["batch"], llama["seq_len"]) == (2, 64)
    assert llama["tok_per_s"] > 0 and math.isfinite(llama["loss"]) and llama["params"] > 0
    # --quick: two rounds, the median of which is the reported rate (and ms/step its inverse)
    assert len(llama["tok_per_s_rounds"]) == 2 and llama["tok_per_s"] == statistics.median(llama["tok_per_s_rounds"])
    assert llama["step_ms"] == pytest.approx(1e3 * 2 * 64 / llama["tok_per_s"])
    try:
        from hgrn2.models import HGRN2ForCausalLM  # noqa: F401

        assert rows["hgrn2"]["status"] == "ok"
    except ImportError:
        assert rows["hgrn2"]["status"].startswith("unavailable")
    if not torch.cuda.is_available():
        assert rows["fla"]["status"] == "unavailable: fla's Triton kernels need a GPU"
    out = capsys.readouterr().out
    assert "tok/s" in out and "median of 2 interleaved round(s)" in out
    if rows["hgrn2"]["status"] == "ok":
        ratio = rows["hgrn2"]["tok_per_s"] / llama["tok_per_s"]
        assert f"hgrn2 2x64: {ratio:.2f}x llama's tokens/s" in out


def test_bench_train_moves_model_and_optimizer_state_between_rounds():
    """Between rounds a model and its AdamW state wait off the GPU; the optimiser keeps the same parameters."""
    from hgrn2.bench.train import _place

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    _place(model, opt, torch.device("meta"))  # a move that makes new Parameter objects
    params = list(model.parameters())
    assert all(p.is_meta for p in params)
    assert [id(p) for g in opt.param_groups for p in g["params"]] == [id(p) for p in params]
    assert [id(p) for p in opt.state] == [id(p) for p in params]
    assert all(v.is_meta for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


def test_bench_train_rejects_zero_rounds():
    from hgrn2.cli import main

    with pytest.raises(ValueError, match="--rounds: expected at least 1, got 0"):
        main(["bench", "train", "--models", "hgrn2", "--rounds", "0"])


def test_bench_train_profile_prints_the_costliest_operators(capsys, tmp_path):
    from hgrn2.cli import main

    assert main(["bench", "train", "--quick", "--models", "hgrn2", "--profile", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Self CPU time total" in out and "aten::" in out  # which operators lead depends on the machine


def test_bench_train_model_modes(tmp_path):
    """`name+compile` / `hgrn2+graph` entries choose a model's mode; the CUDA-graph mode needs a GPU and our HGRN2,
    and --compile / --cuda-graph set the mode of the plainly named models."""
    import argparse

    from hgrn2.bench.train import model_mode
    from hgrn2.cli import main

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    flags = argparse.Namespace(compile=False, cuda_graph=False)
    assert [model_mode(n, flags, cuda) for n in ("hgrn2", "hgrn2+compile", "hgrn2+graph", "llama+compile")] == [
        "eager", "compile", "graph", "compile"]
    both = argparse.Namespace(compile=True, cuda_graph=True)
    assert [model_mode(n, both, cuda) for n in ("hgrn2", "fla", "llama", "hgrn2+compile")] == [
        "graph", "compile", "compile", "compile"]
    with pytest.raises(ValueError, match=r"--models: 'llama\+graph': a model takes \+compile, and only hgrn2"):
        model_mode("llama+graph", flags, cuda)
    with pytest.raises(ValueError, match="--models: unknown model 'gpt' in 'gpt'"):
        model_mode("gpt", flags, cuda)
    with pytest.raises(ValueError, match=r"--cuda-graph / hgrn2\+graph: needs a CUDA device, got cpu"):
        model_mode("hgrn2+graph", flags, cpu)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            main(["bench", "train", "--quick", "--cuda-graph", "--models", "hgrn2", "--out", str(tmp_path)])


@pytest.mark.slow  # Inductor builds the compiled blocks' C++ (about 15 s on 2 cores)
def test_bench_train_runs_modes_side_by_side(tmp_path, capsys):
    from hgrn2.cli import main

    # the graph needs a GPU
    models = "hgrn2,hgrn2+graph,llama+compile" if torch.cuda.is_available() else "hgrn2,llama+compile"
    assert main(["bench", "train", "--quick", "--models", models, "--out", str(tmp_path)]) == 0
    rows = {r["model"]: r for r in json.loads((tmp_path / "train.json").read_text())["rows"]}
    assert set(rows) == set(models.split(",")) and rows["llama+compile"]["mode"] == "compile"
    assert all(r["status"] == "ok" and math.isfinite(r["loss"]) for r in rows.values())
    out = capsys.readouterr().out
    assert "llama+compile" in out and "hgrn2 2x64: " in out and "x llama+compile's tokens/s" in out
