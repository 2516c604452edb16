"""Named model sizes for `HGRN2Config.from_preset(name)`.

Provenance of each number:
- "fla-1.3b": fla's default HGRN2Config (fla/models/hgrn2/configuration_hgrn2.py, 0.6.0), which is the published
  `fla-hub/hgrn2-1.3B-100B` shape: hidden 2048, 24 layers, expand_ratio 128, vocab 32000.
- "fla-2.7b": hidden 2560, 32 layers — the shape of fla-hub's 2.7B-100B family (the HGRN1 sibling
  `fla-hub/hgrn-2.7B-100B` config.json has hidden 2560 / 32 layers); expand_ratio 128 assumed (fla default).
  Verify against the checkpoint's config.json; `hgrn2 convert-fla` always reads the real config.
- "paper-*": the HGRN2 paper's language-model sizes (0.15B / 0.385B / 1B / 2.9B). We could not read the paper's
  appendix table offline; widths and depths follow the usual Llama-style ladder for those sizes and the
  hgru2-pytorch default (hidden 1024, 24 layers = the ~385M model, also DESIGN §4's 374M benchmark model).
  Parameter counts below (vocab 32000, untied head) land within ~10% of the nominal sizes. Treat the exact
  depth/width of paper-150m, paper-1b and paper-2.9b as unverified.
- "paper-wt103-44m": the WikiText-103 ablation model (fairseq, expand-ratio sweep hgrn2_lm_outproduct_{1..128});
  hidden 512, 6 layers, expand_ratio 128 by our choice (unverified), vocab of fairseq's WikiText-103 dictionary
  is set by the data pipeline, not here.
- "tiny": for tests.
All "paper-*" presets use the paper's convention: i_act silu, o_act sigmoid, scale 1.
"""

from __future__ import annotations

_PAPER = dict(o_act="sigmoid", i_act="silu", attn_scale=1.0, g_norm="rmsnorm")

PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, expand_ratio=8, intermediate_size=64),
    "fla-1.3b": dict(hidden_size=2048, num_hidden_layers=24, expand_ratio=128, vocab_size=32000),
    "fla-2.7b": dict(hidden_size=2560, num_hidden_layers=32, expand_ratio=128, vocab_size=32000),
    "paper-150m": dict(hidden_size=768, num_hidden_layers=12, expand_ratio=128, vocab_size=32000, **_PAPER),
    "paper-385m": dict(hidden_size=1024, num_hidden_layers=24, expand_ratio=128, vocab_size=32000, **_PAPER),
    "paper-1b": dict(hidden_size=2048, num_hidden_layers=18, expand_ratio=128, vocab_size=32000, **_PAPER),
    "paper-2.9b": dict(hidden_size=2560, num_hidden_layers=32, expand_ratio=128, vocab_size=32000, **_PAPER),
    "paper-wt103-44m": dict(hidden_size=512, num_hidden_layers=6, expand_ratio=128, **_PAPER),
}
