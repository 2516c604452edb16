"""`hgrn2 bench train --quick`: the benchmark's code path runs end to end and writes its JSON (no timing checks)."""

import json
import math

import torch


def test_bench_train_quick(tmp_path, capsys):
    from hgrn2.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "train", "--quick", "--models", "llama,hgrn2,fla", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {r["model"]: r for r in report["results"]}
    assert set(rows) == {"llama", "hgrn2", "fla"} and report["env"]["torch"] == torch.__version__
    llama = rows["llama"]
    assert llama["status"] == "ok" and (llama["batch"], llama["seq_len"]) == (2, 64)
    assert llama["tok_per_s"] > 0 and math.isfinite(llama["loss"]) and llama["params"] > 0
    try:
        from hgrn2.models import HGRN2ForCausalLM  # noqa: F401

        assert rows["hgrn2"]["status"] == "ok"
    except ImportError:
        assert rows["hgrn2"]["status"].startswith("unavailable")
    if not torch.cuda.is_available():
        assert rows["fla"]["status"] == "unavailable: fla's Triton kernels need a GPU"
    assert "tok/s" in capsys.readouterr().out


def test_bench_train_profile_prints_the_costliest_operators(capsys):
    from hgrn2.cli import main

    assert main(["bench", "train", "--quick", "--models", "hgrn2", "--profile", "4"]) == 0
    out = capsys.readouterr().out
    assert "Self CPU time total" in out and "aten::mm" in out
