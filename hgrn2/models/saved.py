"""Loading a saved model directory where a damaged file is a one-line error naming it, not a library traceback."""

from __future__ import annotations

import glob
import os
from typing import Any


def load_causal_lm(path: str, **kwargs: Any):
    """`AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)`; unreadable weights raise a
    ValueError naming the file (transformers already names a broken config.json)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
    except SafetensorError as e:
        files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) or [os.path.join(path, "model.safetensors")]
        raise ValueError(f"{', '.join(files)}: not a readable safetensors file ({e}); copy or save the model "
                         f"again") from None
