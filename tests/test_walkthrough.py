"""The README's walkthrough: its commands parse (fast tier) and run as written in an empty folder (slow tier)."""

import importlib
import json
import os
import pathlib
import re
import shlex
import stat
import subprocess
import sys

import pytest

from hgrn2.cli import COMMANDS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = re.search(r"\n## Walkthrough[^\n]*\n(.*?)\n## ", text, re.S).group(1)
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 2 and "hgrn2 eval ppl" in blocks[1]
    return blocks


def _has_eval() -> bool:
    return importlib.util.find_spec("hgrn2.eval") is not None


def test_walkthrough_commands_parse():
    import argparse

    lines = [line for block in _blocks() for line in block.strip().splitlines()]
    assert [line.split()[:3] for line in lines][:3] == [["hgrn2", "data", "corpus"], ["hgrn2", "data", "prepare"],
                                                         ["hgrn2", "train", "--config"]]
    assert {"ppl", "needle", "lm-eval"} <= {line.split()[2] for line in lines if line.startswith("hgrn2 eval ")}
    for line in lines:
        argv = shlex.split(line)[1:]
        words = next((w for w in sorted(COMMANDS, key=len, reverse=True) if tuple(argv[: len(w)]) == w), None)
        assert words is not None, line
        if words[0] == "eval" and not _has_eval():
            continue
        parser = argparse.ArgumentParser()
        importlib.import_module(COMMANDS[words][0]).add_arguments(parser)
        args = parser.parse_args(argv[len(words):])  # argparse exits on an unknown option
        if words == ("train",):
            from hgrn2.train.config import make_config

            assert make_config(args.config, args.set).max_steps == 300


@pytest.mark.slow
def test_walkthrough_runs_as_written(tmp_path):
    """`hgrn2` here is this checkout (a shim on PATH), one thread per process as on a shared 2-core machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "hgrn2"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hgrn2.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    work = tmp_path / "work"
    work.mkdir()
    outputs = []
    for block in _blocks():
        if "hgrn2 eval" in block and not _has_eval():
            continue
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, capture_output=True,
                           text=True, timeout=1200)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        outputs.append(p.stdout)

    manifest = json.loads((work / "corpus" / "manifest.json").read_text())
    assert manifest["splits"]["valid"]["documents"] >= 1 and manifest["left_out"]["documents"] == 0
    vals = [r for r in map(json.loads, (work / "runs/tiny/log.jsonl").read_text().splitlines()) if r["kind"] == "val"]
    assert vals[-1]["step"] == 300 and vals[-1]["val_ppl"] < 500  # README: from ~2000 to a few hundred
    assert (work / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    final = work / "runs/tiny/final"
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "configuration_hgrn2.py",
            "modeling_hgrn2.py"} <= set(os.listdir(final))
    assert "AutoModelForCausalLM" in json.loads((final / "config.json").read_text())["auto_map"]
    generated = outputs[0].split("wrote loss.png\n", 1)[1]
    assert len(generated.strip()) > 0
    if _has_eval():
        ppl = json.loads((work / "eval" / "ppl.json").read_text())
        assert ppl["ppl"] < 500
        needle = json.loads((work / "eval" / "needle" / "needle.json").read_text())
        assert needle["lengths"] == [256, 512] and len(needle["cells"]) == 6
        assert (work / "eval" / "needle" / "needle.png").stat().st_size > 0
        acc = json.loads((work / "eval" / "lm_eval.json").read_text())["results"]["hgrn2_tiny_mc"]["acc,none"]
        assert 0 <= acc <= 1
