"""`hgrn2 ablate`: the recipes' runs against the paper's settings, and CPU smoke runs that train, evaluate, report,
plot, stop on a budget and resume."""

import json
import shutil
import time

import pytest
import yaml

from hgrn2.cli import main as cli_main
from hgrn2.experiments import ablate
from hgrn2.models.presets import PRESETS
from hgrn2.train.config import PRESET_DIR
from tests.train.helpers import make_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


def test_paper_scale_runs_are_the_papers():
    cfg = ablate.load_config()
    by_recipe, runs = ablate.build_runs(list(cfg["recipes"]), "paper", "data/wt103", cfg)
    variants = {recipe: {v: run for v, run in rows} for recipe, rows in by_recipe.items()}
    assert [run.model["expand_ratio"] for run in variants["expand"].values()] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert {v: (r.model.get("token_mixer", "hgrn2"), r.model.get("mixer_options", {}).get("expand"))
            for v, r in variants["pese"].items()} == {
        "hgrn1": ("hgrn1", None), "naive": ("naive", 4), "lr": ("lr", 4), "lr-n8": ("lr", 8), "glt": ("glt", 4),
        "glti": ("glti", 4), "krp": ("krp", 4), "kp": ("kp", 4), "hgrn2": ("hgrn2", None)}
    for v in ("hgrn1-complex", "hgrn1-real", "hgrn1-real-2d"):  # the HGRN1 table's presets (its parameter counts)
        assert variants["hgrn1"][v].model == PRESETS[f"paper-wt103-{v}"]
    assert variants["hgrn1"]["hgrn2"].model == PRESETS["paper-wt103-44m"]
    assert variants["lower-bound"]["bound-off"].model["use_lower_bound"] is False
    # the HGRN2 baseline of pese, hgrn1 and lower-bound is one run, expand's e128
    assert variants["pese"]["hgrn2"] is variants["hgrn1"]["hgrn2"] is variants["lower-bound"]["bound-on"] \
        is variants["expand"]["e128"]
    assert len(runs) == len({r.run_id for r in runs}) == 8 + 8 + 3 + 1
    with open(f"{PRESET_DIR}/wikitext103.yaml") as f:
        lm = yaml.safe_load(f)
    assert all(run.train[k] == lm[k] for run in runs for k in ("seq_len", "batch_size", "max_steps", "warmup_steps",
                                                                "lr", "schedule", "betas", "eps", "weight_decay"))


def test_bad_input():
    cfg = ablate.load_config()
    with pytest.raises(ValueError, match="recipe"):
        ablate.build_runs(["depth"], "small", "d", cfg)
    with pytest.raises(ValueError, match="--scale"):
        ablate.build_runs(["pese"], "huge", "d", cfg)
    with pytest.raises(ValueError, match="--data"):
        cli_main(["ablate", "pese", "--scale", "paper", "--out", "unused"])


def test_bad_recipe_fails_before_the_corpus_is_assembled(tmp_path):
    with pytest.raises(ValueError, match="recipe"):
        cli_main(["ablate", "depth", "--scale", "smoke", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def _ablate(corpus, out, *extra):
    return cli_main(["ablate", *extra, "--scale", "smoke", "--data", corpus, "--device", "cpu", "--out", str(out)])


def test_lower_bound_recipe_trains_reports_and_resumes(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert _ablate(corpus, out, "lower-bound") == 0
    rows = json.loads((out / "results.json").read_text())["recipes"]["lower-bound"]
    assert [r["variant"] for r in rows] == ["bound-on", "bound-off"]
    assert all(r["complete"] and r["steps"] == 2 and r["val_ppl"] > 1 for r in rows)
    assert rows[0]["val_ppl"] != rows[1]["val_ppl"]  # two layers: the second layer's bound changes the model
    assert (out / "lower-bound.png").stat().st_size > 0 and "bound-off" in (out / "lower-bound.txt").read_text()
    assert not list((out / "checkpoints").glob("*/checkpoints/*"))  # a complete run's checkpoints are deleted
    capsys.readouterr()
    assert _ablate(corpus, out, "lower-bound") == 0
    assert "2 already done, 0 to train" in capsys.readouterr().out


def test_budget_cut_run_resumes_to_the_end(corpus, tmp_path):
    cfg = ablate.load_config()
    _, runs = ablate.build_runs(["lower-bound"], "smoke", corpus, cfg, steps=3)
    run = runs[0]
    cut = ablate.train_lm(run, "cpu", deadline=time.time() - 1, checkpoint_dir=tmp_path / "ckpt")
    assert not cut["complete"] and cut["steps"] == 1
    steps = []
    whole = ablate.train_lm(run, "cpu", on_step=lambda: steps.append(1), checkpoint_dir=tmp_path / "ckpt")
    assert whole["complete"] and whole["steps"] == 3 and len(steps) == 2 and whole["val_ppl"] > 1


def test_report_trains_nothing(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert _ablate(corpus, out, "lower-bound", "--report") == 0
    printed = capsys.readouterr().out
    assert "2 of 2 runs are not complete: run the same command without --report" in printed
    assert not (out / "runs").exists()


@pytest.mark.slow
def test_every_recipe_runs_on_cpu(corpus, tmp_path):
    out = tmp_path / "out"
    assert _ablate(corpus, out, "all") == 0
    report = json.loads((out / "results.json").read_text())["recipes"]
    assert set(report) == {"expand", "pese", "hgrn1", "lower-bound"}
    assert all(r["complete"] and r["val_ppl"] > 1 for rows in report.values() for r in rows)
    assert [r["expand_ratio"] for r in report["expand"]] == [1, 2, 4, 8, 16, 32, 64, 128]
    for recipe in report:
        assert (out / f"{recipe}.png").stat().st_size > 0 and (out / f"{recipe}.txt").is_file()


@pytest.mark.slow
def test_small_corpus_from_python_docs(tmp_path):
    data = ablate.assemble_corpus("python-docs", tmp_path / "data", max_bytes=150_000, vocab_size=400)
    meta = json.loads((data / "meta.json").read_text())
    assert meta["vocab_size"] == 400 and meta["splits"]["val"]["tokens"] > 0
    assert meta["splits"]["train"]["tokens"] > 10 * meta["splits"]["val"]["tokens"]
    assert ablate.assemble_corpus("python-docs", data, max_bytes=1, vocab_size=400) == data  # reused


H100 = {"device": "NVIDIA H100 80GB HBM3", "device_slug": "h100", "versions": {"torch": "2.11.0", "triton": "3.6.0"},
        "commit": "abc1234", "date": "2026-11-20"}


def test_record_per_recipe_in_the_runs_environment(corpus, tmp_path, capsys):
    out, rec_dir = tmp_path / "out", tmp_path / "rec"
    assert _ablate(corpus, out, "lower-bound", "--record", str(rec_dir)) == 0
    rec = json.loads((rec_dir / "ablate_smoke_lower-bound.json").read_text())
    rows = [{k: v for k, v in r.items() if k != "run_id"}
            for r in json.loads((out / "results.json").read_text())["recipes"]["lower-bound"]]
    assert rec["rows"] == rows and rec["quick"] and (rec["recipe"], rec["scale"]) == ("lower-bound", "smoke")
    assert rec["device_slug"] == "cpu" and rec["train"]["max_steps"] == 2 and "6,000 training" in rec["data"]
    assert (rec_dir / rec["figure"]).read_bytes() == (out / "lower-bound.png").read_bytes()
    assert rec["command"].startswith("hgrn2 ablate lower-bound --record ") and "--scale smoke" in rec["command"]

    # the folder copied elsewhere (the run ids hold the corpus path), trained on another machine: recorded as that
    # machine's, with no --data
    moved = tmp_path / "copied"
    shutil.copytree(out, moved)
    for path in (moved / "runs").glob("*.json"):
        run = json.loads(path.read_text())
        path.write_text(json.dumps(dict(run, environment=H100, spec=dict(run["spec"], data="/gpu/box/corpus"))))
    assert cli_main(["ablate", "lower-bound", "--scale", "smoke", "--report", "--out", str(moved), "--record",
                     str(rec_dir)]) == 0
    moved_rec = json.loads((rec_dir / "ablate_smoke_lower-bound.json").read_text())
    assert moved_rec["rows"] == rows and {k: moved_rec[k] for k in H100} == H100


def test_record_needs_the_runs_environment(corpus, tmp_path):
    out = tmp_path / "out"
    assert _ablate(corpus, out, "lower-bound") == 0
    for path in (out / "runs").glob("*.json"):
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "environment"}))
    with pytest.raises(ValueError, match="record no environment.*environment.json"):
        _ablate(corpus, out, "lower-bound", "--report", "--record", str(tmp_path / "rec"))
    (out / "environment.json").write_text(json.dumps(H100))
    assert _ablate(corpus, out, "lower-bound", "--report", "--record", str(tmp_path / "rec")) == 0
    assert json.loads((tmp_path / "rec" / "ablate_smoke_lower-bound.json").read_text())["device"] == H100["device"]
