"""Tiny models saved to a temporary directory with a BPE tokenizer trained on CPython's pydoc topics."""

from __future__ import annotations

import pytest
import torch


def _text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


@pytest.fixture(scope="package")
def corpus_text() -> str:
    return _text()


@pytest.fixture(scope="package")
def tokenizer(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    from hgrn2.data.tokenizer import train_bpe

    tok = train_bpe(iter(_text().split("\n\n")), 300)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def _save(model, tokenizer, path) -> str:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="package")
def hgrn2_dir(tmp_path_factory, tokenizer) -> str:
    """An untrained tiny HGRN2 (weights scaled up so its predictions are far from uniform)."""
    from hgrn2.models import HGRN2Config, HGRN2ForCausalLM

    torch.manual_seed(0)
    cfg = HGRN2Config.from_preset("tiny", vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = HGRN2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return _save(model, tokenizer, tmp_path_factory.mktemp("hgrn2"))


@pytest.fixture(scope="package")
def llama_dir(tmp_path_factory, tokenizer) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return _save(LlamaForCausalLM(cfg), tokenizer, tmp_path_factory.mktemp("llama"))
