"""A pytest plugin: `--shard I/N` runs the I-th of N parts of the collected tests, so that a GPU suite fits calls
of limited length. `hgrn2 bench tests` loads it; with plain pytest, `pytest -p hgrn2.bench.pytest_shard --shard 1/3`.
"""

import pytest


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N parts of the collected tests (1-based; a file's tests stay together, "
                          "files dealt to the parts in order of size), e.g. to fit a GPU suite into calls of limited "
                          "length")


def _shard(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard: expected I/N with 1 <= I <= N, got {value!r}") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--shard: expected I/N with 1 <= I <= N, got {value!r}")
    return i, n


def pytest_collection_modifyitems(config, items):
    value = config.getoption("--shard")
    if value is None:
        return
    i, n = _shard(value)
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.location[0], []).append(item)
    # largest files first, each to the part with the fewest tests so far: parts of about equal size, kernels that a
    # file compiles compiled in one part only
    load, part = [0] * n, {}
    for name in sorted(files, key=lambda f: (-len(files[f]), f)):
        k = min(range(n), key=lambda j: (load[j], j))
        part[name] = k
        load[k] += len(files[name])
    keep = [it for it in items if part[it.location[0]] == i - 1]
    config.hook.pytest_deselected(items=[it for it in items if part[it.location[0]] != i - 1])
    items[:] = keep
