"""A pytest plugin: `--shard I/N` runs the I-th of N parts of the collected tests, so that a GPU suite fits calls
of limited length. `hgrn2 bench tests` loads it; with plain pytest, `pytest -p hgrn2.bench.pytest_shard --shard 1/3`.

The tests are dealt to the parts one by one in the order of their ids: a file's tests (a kernel's parametrised
cases, whose costs are alike) spread evenly over the parts, so no part gets a whole slow file. The split does not
depend on the order pytest runs them in, nor on earlier runs.
"""

import pytest


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N parts of the collected tests (1-based; the tests dealt to the parts in "
                          "turn, in order of their ids), e.g. to fit a GPU suite into calls of limited length")


def _shard(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard: expected I/N with 1 <= I <= N, got {value!r}") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--shard: expected I/N with 1 <= I <= N, got {value!r}")
    return i, n


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected: the parts share out what would run
def pytest_collection_modifyitems(config, items):
    value = config.getoption("--shard")
    if value is None:
        return
    i, n = _shard(value)
    mine = {item.nodeid for item in sorted(items, key=lambda it: it.nodeid)[i - 1::n]}
    config.hook.pytest_deselected(items=[it for it in items if it.nodeid not in mine])
    items[:] = [it for it in items if it.nodeid in mine]
