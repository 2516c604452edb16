"""The one place the trainer builds models: a transformers causal LM from `cfg.arch` and `cfg.model`.

`hgrn2.models` is imported lazily, so the trainer also runs the Llama/SDPA baseline without it. The model must
return `.loss` when called with `labels` (HGRN2ForCausalLM computes it with the chunked linear cross-entropy).
"""

from __future__ import annotations

from .config import unknown_key_error


def config_class(arch: str):
    if arch == "hgrn2":
        try:
            from hgrn2.models import HGRN2Config, HGRN2ForCausalLM
        except ImportError as e:
            raise ValueError(f"arch=hgrn2 needs hgrn2.models ({e}); arch=llama trains the baseline") from e
        return HGRN2Config, HGRN2ForCausalLM
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaConfig, LlamaForCausalLM
    raise ValueError(f"arch must be 'hgrn2' or 'llama', got {arch!r}")


def model_config(arch: str, model: dict, vocab_size: int):
    """The architecture's config from `model` kwargs (keys checked); vocab_size "auto"/missing = the corpus'."""
    config_cls, _ = config_class(arch)
    valid = list(config_cls().to_dict())
    for key in model:
        if key not in valid:
            raise unknown_key_error(key, valid, what=f"model ({config_cls.__name__})")
    kwargs = dict(model)
    if kwargs.get("vocab_size", "auto") == "auto":
        kwargs["vocab_size"] = vocab_size
    if int(kwargs["vocab_size"]) < vocab_size:
        raise ValueError(f"model.vocab_size={kwargs['vocab_size']} is smaller than the tokenizer's vocabulary "
                         f"({vocab_size}); token ids would index past the embedding")
    if arch == "llama":
        kwargs.setdefault("attn_implementation", "sdpa")
    return config_cls(**kwargs)


def build_model(arch: str, model: dict, vocab_size: int, init_from: str | None = None):
    """A randomly initialised (or `init_from`-loaded) causal LM in float32 on the CPU."""
    config_cls, model_cls = config_class(arch)
    if init_from:
        m = model_cls.from_pretrained(init_from, torch_dtype="float32")
        if m.config.vocab_size < vocab_size:
            raise ValueError(f"{init_from}: vocab_size {m.config.vocab_size} < the tokenizer's {vocab_size}")
        return m
    return model_cls(model_config(arch, model, vocab_size))
