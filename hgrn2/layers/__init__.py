"""nn.Modules: the HGRU2 token mixer and its relatives, the SwiGLU MLP, norms and the short convolution.

Every token mixer is built as `Mixer(hidden_size, *, layer_idx=0, **options)` and called as
`y, state = mixer(x, lower_bound=None, state=None, use_cache=False, attention_mask=None, cu_seqlens=None)`
(see DEVELOPING.md). `TOKEN_MIXERS` maps config names to "module:Class", imported on first use.
"""

from __future__ import annotations

import importlib
import inspect

from .glu import GLU, glu_intermediate_size
from .hgru2 import HGRU2
from .norm import LayerNorm, RMSNorm, build_norm

TOKEN_MIXERS: dict[str, str] = {
    "hgrn2": "hgru2:HGRU2",
    "hgrn1": "hgru1:HGRU1",
    "hgrn1_complex": "hgru1:HGRU1Complex",
    "naive": "pese:NaivePESE",
    "lr": "pese:LRPESE",
    "glt": "pese:GLTPESE",
    "glti": "pese:GLTIPESE",
    "krp": "pese:KRPPESE",
    "kp": "pese:KPPESE",
    "attention": "attention:Attention",
}


def get_token_mixer(name: str) -> type:
    """The token-mixer class registered under `name` in `TOKEN_MIXERS`."""
    if name not in TOKEN_MIXERS:
        raise ValueError(f"`token_mixer`: expected one of {sorted(TOKEN_MIXERS)}, got {name!r}")
    module, cls = TOKEN_MIXERS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def check_mixer_options(name: str, options: dict) -> None:
    """A one-line error naming `mixer_options` for an option the token mixer `name` does not take."""
    params = inspect.signature(get_token_mixer(name).__init__).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    takes = sorted(k for k in params if k not in ("self", "hidden_size", "layer_idx"))
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise ValueError(f"`mixer_options`: the {name!r} token mixer takes no option {unknown[0]!r}; its options: "
                         f"{', '.join(takes)}")


__all__ = ["HGRU2", "GLU", "glu_intermediate_size", "RMSNorm", "LayerNorm", "build_norm", "TOKEN_MIXERS",
           "get_token_mixer", "check_mixer_options"]
