"""Training throughput of HGRN2 vs fla HGRN2 vs Llama/SDPA; same as `hgrn2 bench train` (see hgrn2/bench/train.py).

    PYTHONPATH=. python benchmarks/bench_train.py --out bench_train.json
"""

import argparse
import sys

from hgrn2.bench import train

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_arguments(parser)
    sys.exit(train.run(parser.parse_args()))
