"""hgrn2: gated linear RNNs with state expansion (HGRN2, COLM 2024) — ops, kernels, models, training."""

__version__ = "0.1.0"

from . import models  # noqa: E402,F401  registers the Auto classes (model_type "hgrn2_lm")
