import json

import pytest

from hgrn2.data.files import write_json


def test_write_json_is_whole_or_not_at_all(tmp_path):
    path = tmp_path / "new" / "result.json"
    assert write_json(path, {"acc": 0.5}) == path  # makes the folder
    assert json.loads(path.read_text()) == {"acc": 0.5} and path.read_text().endswith("\n")
    with pytest.raises(TypeError):  # fails half-way through: the previous version stays, no temporary file
        write_json(path, {"acc": 0.75, "model": object()})
    assert json.loads(path.read_text()) == {"acc": 0.5} and sorted(p.name for p in path.parent.iterdir()) == [
        "result.json"]
    write_json(path, {"path": tmp_path}, default=str)
    assert json.loads(path.read_text()) == {"path": str(tmp_path)}


def test_write_json_writes_non_finite_numbers_as_null(tmp_path):
    path = write_json(tmp_path / "r.json", {"loss": float("nan"), "curve": [1.0, float("inf"), (float("-inf"),)]})

    def refuse(constant):
        raise ValueError(constant)

    assert json.loads(path.read_text(), parse_constant=refuse) == {"loss": None, "curve": [1.0, None, [None]]}
