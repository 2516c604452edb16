"""What a saved directory carries so that transformers loads it with `trust_remote_code=True` in an interpreter that
never imported hgrn2, as it loads the Hub's third-party architectures: config.json's `auto_map` names two small
modules written beside the weights, and they import the classes from the installed hgrn2 package, so the
recurrence, its kernels and the layers stay one copy (a machine without hgrn2 gets transformers' "pip install
hgrn2")."""

from __future__ import annotations

import os

AUTO_MAP = {
    "AutoConfig": "configuration_hgrn2.HGRN2Config",
    "AutoModel": "modeling_hgrn2.HGRN2Model",
    "AutoModelForCausalLM": "modeling_hgrn2.HGRN2ForCausalLM",
    "AutoModelForSequenceClassification": "modeling_hgrn2.HGRN2ForSequenceClassification",
}

_HEAD = '"""{what} for transformers\' remote-code loading (`trust_remote_code=True`): the classes live in the hgrn2 ' \
        'package (`pip install hgrn2`)."""\n\n'
MODULES = {
    "configuration_hgrn2.py": _HEAD.format(what="HGRN2's config")
    + "from hgrn2.models.configuration_hgrn2 import HGRN2Config\n\n__all__ = [\"HGRN2Config\"]\n",
    "modeling_hgrn2.py": _HEAD.format(what="HGRN2's models")
    + "from hgrn2.models.modeling_hgrn2 import HGRN2ForCausalLM, HGRN2ForSequenceClassification, HGRN2Model\n\n"
    + "__all__ = [\"HGRN2Model\", \"HGRN2ForCausalLM\", \"HGRN2ForSequenceClassification\"]\n",
}


def write_modules(directory: str | os.PathLike) -> None:
    """The modules `AUTO_MAP` names, into a save_pretrained directory."""
    for name, text in MODULES.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write(text)
