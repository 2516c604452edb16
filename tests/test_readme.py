"""The README's Python quickstart runs as written (with its save directory moved to a temp dir)."""

import pathlib
import re

import torch

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs(tmp_path):
    code = re.search(r"## Quickstart\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    ns: dict = {}
    exec(code.replace('"my-hgrn2"', repr(str(tmp_path / "m"))), ns)
    assert ns["new"].shape == (2, 36) and torch.isfinite(ns["out"].loss)
    assert type(ns["model"]).__name__ == "HGRN2ForCausalLM"
