"""`hgrn2 bench generate --quick`: the benchmark's code path runs end to end and writes its JSON (no timing checks)."""

import json

import pytest
import torch

from hgrn2.cli import main


def run_quick(tmp_path, models: str, *extra: str) -> dict:
    assert main(["bench", "generate", "--quick", "--models", models, "--out", str(tmp_path), *extra]) == 0
    return json.loads((tmp_path / "generate.json").read_text())


def check_ok_row(r: dict) -> None:
    """A measured row. Its times are not compared with each other: on a busy CPU the difference of two tiny
    timings can vanish, which the benchmark reports as the row's status rather than a decode speed."""
    assert r["prompt"] == 32 and r["new_tokens"] == 8 and r["params"] > 0
    if r["status"].startswith("timer noise") and not torch.cuda.is_available():
        return
    assert r["status"] == "ok"
    assert r["prefill_tok_per_s"] == pytest.approx(1e3 * r["batch"] * r["prompt"] / r["prefill_ms"])
    assert r["decode_tok_per_s"] == pytest.approx(1e3 * r["batch"] / r["decode_ms_per_step"])
    assert r["total_ms"] > 0 and r["prefill_ms"] > 0 and r["floor_ms"] > 0
    assert (r["peak_gib"] is not None) == torch.cuda.is_available()
    assert (r["forward_ms_per_step"] > 0) if r["model"].startswith("hgrn2") else r["forward_ms_per_step"] is None


def test_bench_generate_quick(tmp_path, capsys):
    report = run_quick(tmp_path, "hgrn2,hgrn2-static,fla")
    rows = {(r["model"], r["batch"]): r for r in report["rows"]}
    assert set(rows) == {(m, b) for m in ("hgrn2", "hgrn2-static", "fla") for b in (1, 3)}
    assert report["quick"] and report["command"].startswith("hgrn2 bench generate --quick")
    assert report["copy_gb_per_s"] > 0
    for b in (1, 3):
        check_ok_row(rows["hgrn2", b])
        check_ok_row(rows["hgrn2-static", b])
        assert rows["hgrn2-static", b]["same_tokens_as_hgrn2"] is True
        if not torch.cuda.is_available():
            assert rows["fla", b]["status"] == "unavailable: fla's Triton kernels need a GPU"
    out = capsys.readouterr().out
    table = out[out.index("| model |"):]
    assert "| hgrn2-static | tiny B3 |" in table
    if rows["hgrn2-static", 3]["status"] == rows["hgrn2", 3]["status"] == "ok":
        assert "hgrn2-static tiny B3 decode tokens/s:" in table
    if not torch.cuda.is_available():
        assert out.startswith("no GPU: fla (Triton only), peak memory and the CUDA-graph replay are skipped")


def test_bench_generate_budget_skips_rows(tmp_path):
    report = run_quick(tmp_path, "hgrn2,llama", "--budget-s", "1e-9")
    assert [r["status"] for r in report["rows"]] == ["skipped: --budget-s reached"] * 4


@pytest.mark.parametrize("flag, value", [("--models", "gpt"), ("--sizes", "7b"), ("--batches", "0"),
                                         ("--batches", "x")])
def test_bench_generate_bad_arguments(flag, value, tmp_path):
    with pytest.raises(ValueError, match=flag):
        main(["bench", "generate", flag, value, "--out", str(tmp_path)])


def test_bench_generate_quick_llama(tmp_path):
    report = run_quick(tmp_path, "llama,llama-static")
    assert len(report["rows"]) == 4
    for r in report["rows"]:
        check_ok_row(r)


def test_bench_generate_resumes(tmp_path, capsys):
    first = run_quick(tmp_path, "hgrn2")
    second = run_quick(tmp_path, "hgrn2,hgrn2-static")
    assert "hgrn2 tiny: kept from the earlier run" in capsys.readouterr().out
    assert second["rows"][:2] == first["rows"] and [r["model"] for r in second["rows"]] == ["hgrn2"] * 2 + [
        "hgrn2-static"] * 2
    assert all(r["status"] == "ok" for r in second["rows"])
    run_quick(tmp_path, "hgrn2", "--fresh")
    assert "kept from the earlier run" not in capsys.readouterr().out
