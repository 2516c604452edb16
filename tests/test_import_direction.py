"""The package's layering: a module imports only from its own folder or from folders to its left in
ops → layers → models → data → train / eval / bench → experiments → the top-level modules (cli.py, info.py)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hgrn2"
# train, eval and bench share a rank: none of them may import another.
RANK = {"ops": 0, "layers": 1, "models": 2, "data": 3, "train": 4, "eval": 4, "bench": 4, "experiments": 5}
TOP = max(RANK.values()) + 1  # modules directly in hgrn2/ (the CLI and its commands)
# the sideways imports: evaluation and training results are written as benchmark records, in the format
# bench/common.py owns; the training benchmark times the trainer's CUDA-graph step itself, and the LRA sharing
# benchmark the LRA trainer's preset step under its MPS daemon
SHARED = {"hgrn2.bench.common": {"eval", "train"}, "hgrn2.train.graphed": {"bench"}, "hgrn2.train.lra": {"bench"},
          "hgrn2.train.mps": {"bench"}}


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rank(module: str) -> int | None:
    """The layer of a module of the package; None for the package root `hgrn2` (its version and registration)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return RANK.get(parts[1], TOP)


def _imported(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) for every hgrn2 module that `path` imports, at module level or inside functions."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            names = [f"{base}.{node.module}" if node.module else f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, n) for n in names if n == "hgrn2" or n.startswith("hgrn2.")]
    return found


def violations(root: Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        src = _rank(module)
        if src is None:
            continue
        src_folder = module.split(".")[1]
        for line, target in _imported(path, root):
            dst = _rank(target)
            same_folder = target.split(".")[1:2] == [src_folder] and src < TOP
            if same_folder or (dst is not None and dst < src) or (dst == TOP and src == TOP):
                continue
            if dst is None and target == "hgrn2" and src == TOP:
                continue  # the CLI reads `hgrn2.__version__`
            if src_folder in SHARED.get(target, ()):
                continue
            bad.append(f"{path.relative_to(root.parent)}:{line} imports {target}")
    return bad


def test_a_wrong_way_import_is_reported(tmp_path):
    pkg = tmp_path / "hgrn2"
    files = {
        "ops/fine.py": "import torch\n",
        "layers/fine.py": "from ..ops import hgrn2\nfrom . import norm\n",
        "ops/up.py": "def f():\n    from hgrn2.layers import HGRU2\n",
        "eval/side.py": "from ..train.trainer import Trainer\n",
        "models/root.py": "import hgrn2\n",
        "cli.py": "from hgrn2 import __version__\nfrom hgrn2.bench import report\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    assert violations(pkg) == [
        "hgrn2/eval/side.py:1 imports hgrn2.train.trainer",
        "hgrn2/models/root.py:1 imports hgrn2",
        "hgrn2/ops/up.py:2 imports hgrn2.layers",
    ]


def test_the_scan_sees_the_package():
    imports = {t for p in PACKAGE.rglob("*.py") for _, t in _imported(p)}
    assert {"hgrn2.ops", "hgrn2.layers", "hgrn2.models"} <= imports


def test_imports_point_left_only():
    assert violations() == []
