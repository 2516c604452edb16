"""`hgrn2 convert-fla SRC DST`: turn a local fla HGRN2 checkpoint directory into an hgrn2 one.

fla (`fla/models/hgrn2`, 0.6.0) and hgrn2 share state-dict names, so conversion maps the config and checks every
tensor; the weights are not renamed or changed. fla's convention becomes explicit config fields: o_act="silu",
i_act=None, scale = e^{-1/2}, and g_norm eps 1e-5 (fla's HGRN2Attention calls `rms_norm_linear` without an eps,
so its `norm_eps` never reaches g_norm). Hybrid attention layers (`attn`) and attention residuals
(`attnres_block_size`) are refused. Tokenizer files are copied along.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from .configuration_hgrn2 import HGRN2Config
from .modeling_hgrn2 import CACHE_FIELD, HGRN2ForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt")


def config_from_fla(fla: dict) -> HGRN2Config:
    """Map an fla HGRN2 config.json dict to an HGRN2Config (fla convention), refusing what we cannot load."""
    if fla.get("model_type") != "hgrn2":
        raise ValueError(f"config.json: expected fla model_type 'hgrn2', got {fla.get('model_type')!r}")
    if fla.get("attn") is not None:
        raise ValueError("config.json: hybrid models with softmax-attention layers (`attn`) are not supported")
    if fla.get("attnres_block_size") is not None:
        raise ValueError("config.json: attention residuals (`attnres_block_size`) are not supported")
    if fla.get("hidden_act", "swish") != "swish":
        raise ValueError(f"config.json: only hidden_act='swish' is supported, got {fla['hidden_act']!r}")
    if fla.get("use_short_conv") and fla.get("conv_bias"):
        raise ValueError("config.json: short convolutions with bias (`conv_bias`) are not supported")
    hidden = fla.get("hidden_size", 2048)
    expand, heads = fla.get("expand_ratio", 128), fla.get("num_heads")
    if expand is None and heads is not None:
        expand = hidden // heads  # fla's rule; HGRN2Config checks divisibility
    return HGRN2Config(
        vocab_size=fla.get("vocab_size", 32000), hidden_size=hidden,
        num_hidden_layers=fla.get("num_hidden_layers", 24), expand_ratio=expand, token_mixer="hgrn2",
        use_lower_bound=fla.get("use_lower_bound", True), hidden_ratio=fla.get("hidden_ratio", 4),
        intermediate_size=fla.get("intermediate_size"), hidden_act="swish", norm_eps=fla.get("norm_eps", 1e-6),
        g_norm="rmsnorm", g_norm_eps=1e-5, o_act="silu", i_act=None, attn_scale="auto",
        use_short_conv=fla.get("use_short_conv", False), conv_size=fla.get("conv_size", 4),
        max_position_embeddings=fla.get("max_position_embeddings", 2048),
        initializer_range=fla.get("initializer_range", 0.02), pad_token_id=fla.get("pad_token_id"),
        bos_token_id=fla.get("bos_token_id", 1), eos_token_id=fla.get("eos_token_id", 2),
        tie_word_embeddings=fla.get("tie_word_embeddings", False))


def load_tensors(src: Path) -> dict[str, torch.Tensor]:
    """All tensors of *.safetensors in `src` (sharded or not), else of *.bin files (torch.load, weights only)."""
    files = sorted(src.glob("*.safetensors"))
    out: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file
        for f in files:
            out.update(load_file(f))
        return out
    files = sorted(src.glob("*.bin"))
    if not files:
        raise ValueError(f"`src`: no *.safetensors or *.bin weight files in {src}")
    for f in files:
        out.update(torch.load(f, map_location="cpu", weights_only=True))
    return out


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, torch.Size], elementwise_affine: bool) -> None:
    """Fill what fla leaves implicit, then demand exactly the expected names and shapes (clear errors)."""
    if not elementwise_affine:  # fla's g_norm then has no weight: a weight of ones is the same function
        for name, shape in expected.items():
            if name.endswith("attn.g_norm.weight") and name not in tensors:
                tensors[name] = torch.ones(shape)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    wrong = [f"{n}: checkpoint {tuple(tensors[n].shape)} vs config {tuple(s)}" for n, s in expected.items()
             if n in tensors and tensors[n].shape != s]
    problems = ([f"missing: {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}"] if missing else []) + \
               ([f"unexpected: {', '.join(extra[:8])}{' …' if len(extra) > 8 else ''}"] if extra else []) + wrong[:8]
    if problems:
        raise ValueError("checkpoint tensors do not match the config:\n  " + "\n  ".join(problems))


def convert_fla_checkpoint(src_dir: str | Path, dst_dir: str | Path) -> HGRN2ForCausalLM:
    """Convert the fla HGRN2 checkpoint in `src_dir` to an hgrn2 `HGRN2ForCausalLM` saved in `dst_dir`.

    Returns the loaded model (weights in the checkpoint's dtype, on the CPU).
    """
    src, dst = Path(src_dir), Path(dst_dir)
    if not (src / "config.json").is_file():
        raise ValueError(f"`src_dir`: expected an fla checkpoint directory with config.json, got {src}")
    fla = json.loads((src / "config.json").read_text())
    config = config_from_fla(fla)
    tensors = load_tensors(src)
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = HGRN2ForCausalLM(config)
    expected = {n: p.shape for n, p in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    check_tensors(tensors, expected, fla.get("elementwise_affine", True) is not False)
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embeddings.weight
    model.eval()
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return model


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation [B, T + new_tokens] of input_ids [B, T] (no padding), decoded by hand: the prompt once
    with use_cache=True, then one token at a time with the cache the model returned. What `generate` does, without
    `generate`, whose cache plumbing changes between transformers versions (fla 0.6.0's models lose their cache
    in transformers ≥ 5.24's `generate`); so fla's and our greedy tokens compare in any version."""
    out, ids = model(input_ids, use_cache=True), input_ids
    for _ in range(new_tokens):
        ids = torch.cat([ids, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        # outputs carry the cache under the installed transformers' name; both models' forwards take this one
        out = model(ids[:, -1:], past_key_values=getattr(out, CACHE_FIELD), use_cache=True)
    return ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="local fla HGRN2 checkpoint directory (config.json + safetensors or .bin)")
    p.add_argument("dst", help="output directory for the hgrn2 checkpoint")


def run(args: argparse.Namespace) -> int:
    model = convert_fla_checkpoint(args.src, args.dst)
    n = sum(p.numel() for p in model.parameters())
    print(f"converted {args.src} -> {args.dst}: {n / 1e6:.1f}M parameters, "
          f"{model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}")
    return 0
