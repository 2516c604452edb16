"""Named model sizes for `HGRN2Config.from_preset(name)`, and the paper's parameter count for each paper preset.

Provenance (the HGRN2 paper is Qin et al., COLM 2024, arXiv 2404.07904):
- "fla-1.3b": fla's default HGRN2Config (fla/models/hgrn2/configuration_hgrn2.py, 0.6.0), the published
  `fla-hub/hgrn2-1.3B-100B` shape: hidden 2048, 24 layers, expand_ratio 128, vocab 32000; fla's gate convention.
- "fla-2.7b": hidden 2560, 32 layers, the shape of fla-hub's 2.7B-100B family; fla's gate convention.
- "paper-150m" / "paper-385m" / "paper-1b" / "paper-2.9b": the appendix's model-configuration table (0.15B =
  15 × 768, 0.385B = 26 × 1024, 1B = 18 × 2048, 2.9B = 36 × 2560, expand ratio 128). The table gives no
  vocabulary: the GPT-2 BPE of 50265 tokens (the paper's WikiText-103 vocabulary) with tied embeddings gives
  144.8M / 385.6M / 1.03B / 2.98B, all within 3.5% of the table (an untied 32000 vocabulary lands within 5.6%).
- "paper-wt103-44m": the WikiText-103 model (Table "Results on Wikitext-103", 44.66M): 6 layers × 512, BPE
  vocabulary 50265, tied embeddings, SwiGLU width 1365 (= 2/3 · 4 · 512, the Transformer baseline's 44.65M
  budget); 44.62M parameters.
- "paper-wt103-hgrn1-complex" / "-hgrn1-real" / "-hgrn1-real-2d": Table "Comparison of real HGRN and complex
  HGRN" (46.25M / 46.24M / 45.46M). The table gives totals only; the SwiGLU widths (1024 / 1536 / 768) are the
  multiples of 256 that meet them.
- "paper-385m-<mixer>": Table "PESE Ablation" (the paper-385m shape with each token mixer, n = 4 unless named).
- "tiny": for tests.
Every "paper-*" preset uses the paper's gate convention (i_act silu, o_act sigmoid, scale 1).
"""

from __future__ import annotations

_PAPER = dict(o_act="sigmoid", i_act="silu", attn_scale=1.0, g_norm="rmsnorm")
_GPT2_TIED = dict(vocab_size=50265, tie_word_embeddings=True)
_LM = dict(expand_ratio=128, **_GPT2_TIED, **_PAPER)
_WT103 = dict(hidden_size=512, num_hidden_layers=6, expand_ratio=128, **_GPT2_TIED, **_PAPER)
_385M = dict(hidden_size=1024, num_hidden_layers=26, **_LM)

PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, expand_ratio=8, intermediate_size=64),
    "fla-1.3b": dict(hidden_size=2048, num_hidden_layers=24, expand_ratio=128, vocab_size=32000),
    "fla-2.7b": dict(hidden_size=2560, num_hidden_layers=32, expand_ratio=128, vocab_size=32000),
    "paper-150m": dict(hidden_size=768, num_hidden_layers=15, **_LM),
    "paper-385m": _385M,
    "paper-1b": dict(hidden_size=2048, num_hidden_layers=18, **_LM),
    "paper-2.9b": dict(hidden_size=2560, num_hidden_layers=36, **_LM),
    "paper-wt103-44m": dict(intermediate_size=1365, **_WT103),
    "paper-wt103-hgrn1-complex": dict(intermediate_size=1024, token_mixer="hgrn1_complex", **_WT103),
    "paper-wt103-hgrn1-real": dict(intermediate_size=1536, token_mixer="hgrn1", **_WT103),
    "paper-wt103-hgrn1-real-2d": dict(intermediate_size=768, token_mixer="hgrn1", mixer_options=dict(expand=2),
                                      **_WT103),
    "paper-385m-hgrn1": dict(_385M, token_mixer="hgrn1"),
    **{f"paper-385m-{m}{n}": dict(_385M, token_mixer=m, mixer_options=dict(expand=n))
       for m, n in (("lr", 4), ("lr", 8), ("glt", 4), ("glti", 4), ("krp", 4), ("kp", 4))},
    **{f"paper-385m-hgrn2-e{e}": dict(_385M, expand_ratio=e) for e in (4, 8)},
}

# The paper's sizes under both spellings, each accepted wherever the other is: the model preset here
# (`HGRN2Config.from_preset`) and the training preset of the same model with the paper's training settings
# (`hgrn2/configs/lm/<name>.yaml`, `hgrn2 train --config`).
TRAINING_PRESETS: dict[str, str] = {"paper-150m": "hgrn2-0.15b", "paper-385m": "hgrn2-0.385b", "paper-1b": "hgrn2-1b",
                                    "paper-2.9b": "hgrn2-2.9b", "paper-wt103-44m": "wikitext103"}
MODEL_PRESETS: dict[str, str] = {v: k for k, v in TRAINING_PRESETS.items()}

# The paper's parameter count (in parameters) for each preset it gives one for.
PAPER_PARAMETERS: dict[str, float] = {
    "paper-150m": 0.15e9, "paper-385m": 0.385e9, "paper-1b": 1e9, "paper-2.9b": 2.9e9,
    "paper-wt103-44m": 44.66e6, "paper-wt103-hgrn1-complex": 46.25e6, "paper-wt103-hgrn1-real": 46.24e6,
    "paper-wt103-hgrn1-real-2d": 45.46e6,
    "paper-385m-hgrn1": 379e6, "paper-385m-lr4": 385e6, "paper-385m-lr8": 386e6, "paper-385m-glt4": 386e6,
    "paper-385m-glti4": 386e6, "paper-385m-krp4": 386e6, "paper-385m-kp4": 386e6, "paper-385m-hgrn2-e4": 385e6,
    "paper-385m-hgrn2-e8": 385e6,
}
