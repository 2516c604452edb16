"""Time the HGRN2 recurrence against fla and SDPA: `python benchmarks/bench_ops.py [--quick] [--out f.json]`.

A thin wrapper around `hgrn2 bench ops` (hgrn2/bench/ops.py), runnable from the repository root without
installing the package.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hgrn2.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "ops", *sys.argv[1:]]))
