"""benchmarks/engine_speed.py: the steps/s read from a run log, and the whole comparison on the CPU with this tree
standing in for the base (tiny shapes)."""

import importlib.util
import json
import sys

import pytest

from tests.train.helpers import ROOT, run_command


def _script():
    spec = importlib.util.spec_from_file_location("engine_speed", f"{ROOT}/benchmarks/engine_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_steps_per_s_reads_the_second_half_between_train_records_only(tmp_path):
    # 10 steps/s while training; an evaluation (val record) takes 5 s and must not count; the first half is slower
    records = [{"kind": "train", "step": s, "time": s / 2} for s in (10, 20, 30)]  # 20 steps/s, first half
    records += [{"kind": "val", "step": 30, "time": 15.5}]
    records += [{"kind": "train", "step": 30 + s, "time": 20.5 + s / 10} for s in (10, 20, 30, 40, 50, 60)]
    _write(tmp_path / "log.jsonl", records)
    assert _script().steps_per_s(tmp_path / "log.jsonl") == pytest.approx(10.0)


def test_steps_per_s_needs_two_train_records(tmp_path):
    _write(tmp_path / "log.jsonl", [{"kind": "train", "step": 10, "time": 1.0}, {"kind": "val", "step": 10,
                                                                                "time": 2.0}])
    with pytest.raises(ValueError, match="no two consecutive train records"):
        _script().steps_per_s(tmp_path / "log.jsonl")


def test_a_base_dir_without_the_package_is_refused(tmp_path):
    p = run_command([sys.executable, f"{ROOT}/benchmarks/engine_speed.py", "--base-dir", str(tmp_path),
                     "--device", "cpu"], timeout=120, returncode=2)
    assert p.returncode == 2 and "--base-dir" in p.stderr and "hgrn2/__init__.py" in p.stderr


@pytest.mark.slow
def test_language_model_and_listops_on_the_cpu(tmp_path):
    run_command([sys.executable, f"{ROOT}/benchmarks/engine_speed.py", "--base-dir", str(ROOT), "--device", "cpu",
                 "--quick", "--rounds", "1", "--tasks", "lm,lra", "--workers", "1", "--out", str(tmp_path)],
                timeout=900)
    rec = json.loads((tmp_path / "engine_speed.json").read_text())
    assert rec["quick"] and rec["benchmark"] == "engine_speed"
    assert [(r["task"].split()[0], r["step"]) for r in rec["rows"]] == [("language", "eager"), ("LRA", "eager")]
    for r in rec["rows"]:  # the base is this tree: both read a positive speed from their own log
        assert r["base"] > 0 and r["tree"] > 0 and r["ratio"] == pytest.approx(r["tree"] / r["base"])


@pytest.mark.slow
def test_images_read_a_fashion_mnist_folder_given_relative_to_the_caller(tmp_path):
    # the runs start in their own folder, so a relative --fashion-mnist must be resolved first
    run_command([sys.executable, f"{ROOT}/benchmarks/engine_speed.py", "--base-dir", str(ROOT), "--device", "cpu",
                 "--quick", "--rounds", "1", "--tasks", "vision", "--fashion-mnist", "tests/fixtures/lra/fashion-mnist",
                 "--out", str(tmp_path)], timeout=600)
    rec = json.loads((tmp_path / "engine_speed.json").read_text())
    assert [(r["task"].split()[0], r["step"]) for r in rec["rows"]] == [("image", "eager")]
    assert rec["rows"][0]["base"] > 0 and rec["rows"][0]["tree"] > 0


def test_add_keeps_the_other_tasks_rows_and_refuses_another_base(tmp_path):
    import argparse

    module = _script()
    rows = [{"task": module.TASKS["lm"][0], "step": "eager"}, {"task": module.TASKS["lra"][0], "step": "eager"}]
    (tmp_path / "engine_speed.json").write_text(json.dumps(
        {"base": "9f13181", "rounds": 2, "quick": False, "command": "first", "rows": rows}))
    args = argparse.Namespace(out=str(tmp_path), base_label="9f13181", base_dir="/b", rounds=2, quick=False)
    kept, command = module._kept_rows(args, ["lra"])
    assert kept == rows[:1] and command.startswith("first && ")
    with pytest.raises(SystemExit, match="another --base-dir"):
        module._kept_rows(argparse.Namespace(**{**vars(args), "rounds": 3}), ["lra"])
    with pytest.raises(SystemExit, match="no engine_speed.json"):
        module._kept_rows(argparse.Namespace(**{**vars(args), "out": str(tmp_path / "none")}), ["lra"])
