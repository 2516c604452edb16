"""Result records: every committed JSON under benchmarks/results has the required keys, BENCHMARKS.md is their
rendering, and the bench commands write such records (tiny CPU runs; no timings checked)."""

import json
import pathlib

import pytest

from hgrn2.bench import report
from hgrn2.bench.common import REQUIRED_KEYS, device_slug, time_ms
from hgrn2.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*/*.json"))


def check_record(path: pathlib.Path, stem: str | None = None) -> dict:
    rec = json.loads(path.read_text())
    assert [k for k in REQUIRED_KEYS if k not in rec] == [], path
    assert rec["rows"] and isinstance(rec["rows"], list), path
    assert rec["command"].split()[0] in ("hgrn2", "python", "python3"), rec["command"]
    assert rec["versions"]["torch"] and rec["date"].count("-") == 2, path
    # GPU test and gate records may come in parts (`bench tests --shard`, a subset of the suite, `bench gate --rows`):
    # tests_<part>.json, gate_<part>.json
    assert path.stem == rec["benchmark"] or (rec["benchmark"] in ("tests", "gate")
                                             and path.stem.startswith(rec["benchmark"] + "_")), path
    assert rec["benchmark"] == (stem or rec["benchmark"])
    return rec


def test_results_folder_holds_only_records_and_their_figures():
    files = [p for p in (ROOT / "benchmarks" / "results").rglob("*") if p.is_file()]
    assert RESULTS and {p.suffix for p in files if p.suffix != ".json"} == {".png"}
    for path in RESULTS:
        rec = check_record(path)
        assert path.parent.name == rec["device_slug"] and not rec.get("quick")
        if rec.get("figure"):
            assert (path.parent / rec["figure"]).is_file()


def test_benchmarks_md_is_the_rendering_of_the_results(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert (ROOT / "BENCHMARKS.md").read_text() == report.render(), "run `hgrn2 bench report`"
    assert main(["bench", "report", "--check"]) == 0


def test_report_rejects_a_record_without_its_keys(tmp_path):
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "ops.json").write_text(json.dumps({"benchmark": "ops", "rows": []}))
    with pytest.raises(ValueError, match="missing keys"):
        report.render(tmp_path)


@pytest.mark.parametrize("argv, stem", [
    (["bench", "ops", "--quick", "--device", "cpu", "--skip", "seq,glue,hgrn1"], "ops"),
    (["bench", "layer", "--quick", "--device", "cpu"], "layer"),
    (["bench", "accuracy", "--quick", "--device", "cpu", "--impls", "chunk"], "accuracy"),
    (["bench", "profile", "--quick", "--target", "layer"], "profile_layer"),
    (["bench", "profile", "--quick", "--target", "train", "--models", "hgrn2"], "profile_train"),
    (["bench", "profile", "--quick", "--target", "rows", "--rows", "small,fast"], "profile_rows"),
    (["bench", "memory", "--device", "cpu", "--hidden", "128", "--seq", "16"], "memory"),
    pytest.param(["bench", "lra-share", "--quick", "--device", "cpu"], "lra_share", marks=pytest.mark.slow),
])
def test_bench_commands_write_their_record(tmp_path, capsys, argv, stem):
    assert main([*argv, "--out", str(tmp_path)]) == 0
    rec = check_record(tmp_path / f"{stem}.json", stem)
    assert rec["quick"] == ("--quick" in argv)
    assert rec["command"] == "hgrn2 " + " ".join([*argv, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("|")  # the short table comes last
    assert "Error" not in out and "active drivers" not in out


def test_report_leaves_quick_runs_out(tmp_path):
    assert main(["bench", "layer", "--quick", "--device", "cpu", "--out", str(tmp_path / "cpu")]) == 0
    assert "## Layer" not in report.render(tmp_path)
    assert main(["bench", "layer", "--shape", "1x16", "--hidden", "64", "--expand", "32", "--device", "cpu",
                 "--out", str(tmp_path / "cpu")]) == 0
    assert "## Layer" in report.render(tmp_path) and "`hgrn2 bench layer --shape 1x16" in report.render(tmp_path)


def test_layer_on_cpu_skips_fla_with_one_line(tmp_path, capsys):
    assert main(["bench", "layer", "--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert "skipped: fla's HGRN2Attention: needs CUDA" in capsys.readouterr().out
    assert [r["layer"] for r in json.loads((tmp_path / "layer.json").read_text())["rows"]] == ["ours"]


def test_timer_refuses_all_zero_inputs():
    import torch

    x = torch.zeros(4)
    with pytest.raises(ValueError, match="inputs: a tensor of shape \\(4,\\) is all zeros"):
        time_ms(lambda: x + 1, inputs=[x], device="cpu")
    assert time_ms(lambda: x + 1, inputs=[x + 1], device="cpu", rep=60) > 0


def test_device_slugs():
    assert [device_slug(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GeForce RTX 4090")] == \
        ["h100", "h200", "rtx4090"]
    assert device_slug("NVIDIA H200", 2) == "h200x2"
