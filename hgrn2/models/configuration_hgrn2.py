"""HGRN2Config: one config for the HGRN2 language model and every paper ablation (token mixer as a switch).

model_type is "hgrn2_lm", distinct from fla's "hgrn2" (which fla registers with AutoConfig on import), so both
libraries can be imported together; fla checkpoints are converted with `hgrn2 convert-fla`. The defaults are
fla's defaults (its public checkpoints' convention): o_act="silu", i_act=None, scale = e^{-1/2}, RMSNorm g_norm
with eps 1e-5 (fla 0.6.0 calls `rms_norm_linear` without an eps, so `norm_eps` never reaches g_norm).
"""

from __future__ import annotations

import math
import os
from typing import Any

from transformers import PretrainedConfig

from ..layers import TOKEN_MIXERS
from ..layers.norm import NORMS, check_eps
from ..ops.gates import ACTIVATIONS


class HGRN2Config(PretrainedConfig):
    """Architecture of `HGRN2Model` / `HGRN2ForCausalLM`.

    Args (beyond the usual vocab/hidden/layers/ids):
        expand_ratio: head dimension e (state e×e per head); heads = hidden_size / e. `num_heads` may be given
            instead (or as well, if consistent).
        token_mixer: a key of `hgrn2.layers.TOKEN_MIXERS` ("hgrn2", "hgrn1", PESE variants, "attention").
        mixer_options: extra keyword options for the mixer. For "hgrn2" they override the fields below; other
            mixers receive only these (plus `layer_idx`).
        use_lower_bound: learn Γ [L, hidden] and give layer l the bound β_l (layer 0 gets 0).
        o_act, i_act, attn_scale ("auto" = e^{-1/2}, or a number), g_norm ("rmsnorm" / "layernorm" / None),
        g_norm_eps, use_short_conv, conv_size: the HGRN2 mixer's convention (see `hgrn2.layers.HGRU2`).
        hidden_ratio, intermediate_size, hidden_act: the SwiGLU MLP (fla's sizing rule when intermediate is None).
        use_mlp: False drops the MLP (and mlp_norm), as in the MQAR runs.
        backend: ops backend for the recurrence (None = automatic).
    """

    model_type = "hgrn2_lm"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(self, vocab_size: int = 32000, hidden_size: int = 2048, num_hidden_layers: int = 24,
                 expand_ratio: int | None = 128, num_heads: int | None = None, token_mixer: str = "hgrn2",
                 mixer_options: dict | None = None, use_lower_bound: bool = True, hidden_ratio: float | None = 4,
                 intermediate_size: int | None = None, hidden_act: str = "swish", use_mlp: bool = True,
                 norm_eps: float = 1e-6, g_norm: str | None = "rmsnorm", g_norm_eps: float = 1e-5,
                 o_act: str | None = "silu", i_act: str | None = None, attn_scale: float | str = "auto",
                 use_short_conv: bool = False, conv_size: int = 4, backend: str | None = None,
                 max_position_embeddings: int = 2048, initializer_range: float = 0.02, use_cache: bool = True,
                 pad_token_id: int | None = None, bos_token_id: int = 1, eos_token_id: int = 2,
                 tie_word_embeddings: bool = False, **kwargs: Any) -> None:
        expand_ratio, num_heads = _resolve_heads(hidden_size, expand_ratio, num_heads)
        if token_mixer not in TOKEN_MIXERS:
            raise ValueError(f"`token_mixer`: expected one of {sorted(TOKEN_MIXERS)}, got {token_mixer!r}")
        for name, act in (("o_act", o_act), ("i_act", i_act)):
            if act not in ACTIVATIONS:
                raise ValueError(f"`{name}`: expected one of {ACTIVATIONS}, got {act!r}")
        if g_norm not in NORMS:
            raise ValueError(f"`g_norm`: expected one of {NORMS}, got {g_norm!r}")
        if attn_scale != "auto" and (isinstance(attn_scale, bool) or not isinstance(attn_scale, int | float)
                                     or not math.isfinite(attn_scale)):
            raise ValueError(f"`attn_scale`: expected 'auto' or a finite number, got {attn_scale!r}")
        check_eps("norm_eps", norm_eps)
        check_eps("g_norm_eps", g_norm_eps)
        if hidden_act not in ("swish", "silu"):
            raise ValueError(f"`hidden_act`: expected 'swish', got {hidden_act!r}")
        if mixer_options is not None and not isinstance(mixer_options, dict):
            raise ValueError(f"`mixer_options`: expected a dict or None, got {type(mixer_options).__name__}")
        for name, v in (("vocab_size", vocab_size), ("num_hidden_layers", num_hidden_layers)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"`{name}`: expected a positive int, got {v!r}")
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.expand_ratio, self.num_heads = expand_ratio, num_heads
        self.token_mixer, self.mixer_options = token_mixer, dict(mixer_options or {})
        self.use_lower_bound = use_lower_bound
        self.hidden_ratio, self.intermediate_size, self.hidden_act = hidden_ratio, intermediate_size, hidden_act
        self.use_mlp = use_mlp
        self.norm_eps, self.g_norm, self.g_norm_eps = norm_eps, g_norm, g_norm_eps
        self.o_act, self.i_act, self.attn_scale = o_act, i_act, attn_scale
        self.use_short_conv, self.conv_size, self.backend = use_short_conv, conv_size, backend
        self.max_position_embeddings, self.initializer_range = max_position_embeddings, initializer_range
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    def mixer_kwargs(self) -> dict:
        """Keyword options for the token mixer's constructor (besides hidden_size and layer_idx)."""
        if self.token_mixer != "hgrn2":
            return dict(self.mixer_options)
        kw = dict(expand_ratio=self.expand_ratio, o_act=self.o_act, i_act=self.i_act, scale=self.attn_scale,
                  norm=self.g_norm, norm_eps=self.g_norm_eps, use_short_conv=self.use_short_conv,
                  conv_size=self.conv_size, backend=self.backend)
        return {**kw, **self.mixer_options}

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs: Any) -> None:
        """config.json with the `auto_map` of `remote_code.py` and its modules beside it, so that transformers' Auto
        classes load the directory with `trust_remote_code=True` without `import hgrn2` first."""
        from .remote_code import AUTO_MAP, write_modules

        self.auto_map = dict(AUTO_MAP)
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        write_modules(save_directory)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoConfig") -> None:
        """Nothing to do: `save_pretrained` writes the remote-code modules itself (transformers' copy of this file
        would not import outside the package)."""

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> HGRN2Config:
        """A named size from `hgrn2.models.presets.PRESETS` ("tiny", "paper-385m", "fla-1.3b", ...); the training
        presets' names of the paper's sizes ("hgrn2-0.385b", ...) are accepted too."""
        from .presets import MODEL_PRESETS, PRESETS
        name = MODEL_PRESETS.get(name, name)
        if name not in PRESETS:
            raise ValueError(f"`name`: expected one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})


def _resolve_heads(hidden_size: int, expand_ratio: int | None, num_heads: int | None) -> tuple[int, int]:
    if not isinstance(hidden_size, int) or hidden_size <= 0:
        raise ValueError(f"`hidden_size`: expected a positive int, got {hidden_size!r}")
    if expand_ratio is None and num_heads is None:
        raise ValueError("`expand_ratio` / `num_heads`: expected at least one of them")
    if num_heads is not None and (not isinstance(num_heads, int) or num_heads <= 0 or hidden_size % num_heads):
        raise ValueError(f"`num_heads`: expected a positive divisor of hidden_size={hidden_size}, got {num_heads!r}")
    if expand_ratio is None:
        return hidden_size // num_heads, num_heads
    if not isinstance(expand_ratio, int) or expand_ratio <= 0 or hidden_size % expand_ratio:
        raise ValueError(f"`expand_ratio`: expected a positive divisor of hidden_size={hidden_size} "
                         f"(heads = hidden_size / expand_ratio), got {expand_ratio!r}")
    if num_heads is not None and num_heads * expand_ratio != hidden_size:
        raise ValueError(f"`num_heads`: expected hidden_size / expand_ratio = {hidden_size // expand_ratio}, "
                         f"got {num_heads}")
    return expand_ratio, hidden_size // expand_ratio
