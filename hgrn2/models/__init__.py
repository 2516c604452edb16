"""transformers classes for HGRN2 (config, models, recurrent cache, presets, fla conversion); the experiment models
(`lra`, `vision`, `zoology`) are submodules, imported directly.

Importing this module (or just `import hgrn2`) registers the classes with AutoConfig / AutoModel /
AutoModelForCausalLM / AutoModelForSequenceClassification under model_type "hgrn2_lm".

    import hgrn2
    from hgrn2.models import HGRN2Config, HGRN2ForCausalLM
    model = HGRN2ForCausalLM(HGRN2Config.from_preset("paper-385m"))   # or any field: HGRN2Config(token_mixer=...)
    loss = model(ids, labels=ids).loss                                  # chunked CE, no [B·T, V] logits
    out = model.generate(ids, attention_mask=mask, max_new_tokens=32)   # left padding; constant-size state
    model.save_pretrained(d); AutoModelForCausalLM.from_pretrained(d)

fla checkpoints: `hgrn2 convert-fla SRC DST` (or `convert.convert_fla_checkpoint`); text: `hgrn2 generate DIR`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .cache import HGRN2Cache, HGRN2StaticCache
from .configuration_hgrn2 import HGRN2Config
from .modeling_hgrn2 import HGRN2ForCausalLM, HGRN2ForSequenceClassification, HGRN2Model, HGRN2PreTrainedModel
from .presets import PRESETS

AutoConfig.register(HGRN2Config.model_type, HGRN2Config, exist_ok=True)
AutoModel.register(HGRN2Config, HGRN2Model, exist_ok=True)
AutoModelForCausalLM.register(HGRN2Config, HGRN2ForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(HGRN2Config, HGRN2ForSequenceClassification, exist_ok=True)

__all__ = ["HGRN2Config", "HGRN2Model", "HGRN2ForCausalLM", "HGRN2ForSequenceClassification",
           "HGRN2PreTrainedModel", "HGRN2Cache", "HGRN2StaticCache", "PRESETS"]
