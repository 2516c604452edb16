"""hgrn2: gated linear RNNs with state expansion (HGRN2, COLM 2024) — ops, kernels, models, training."""

import sys

__version__ = "0.1.0"

# `import hgrn2` registers the model classes with transformers' Auto factories. The `hgrn2` command (module
# `hgrn2_cli`) skips that here, so that its help starts at once, and imports the models before a command runs.
if "hgrn2_cli" not in sys.modules:
    from . import models  # noqa: F401
