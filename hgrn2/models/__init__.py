"""transformers classes for HGRN2 (config, models, recurrent cache, presets, fla conversion).

Importing this module registers the classes with AutoConfig / AutoModel / AutoModelForCausalLM /
AutoModelForSequenceClassification under model_type "hgrn2_lm".
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .cache import HGRN2Cache
from .configuration_hgrn2 import HGRN2Config
from .modeling_hgrn2 import HGRN2ForCausalLM, HGRN2ForSequenceClassification, HGRN2Model, HGRN2PreTrainedModel
from .presets import PRESETS

AutoConfig.register(HGRN2Config.model_type, HGRN2Config, exist_ok=True)
AutoModel.register(HGRN2Config, HGRN2Model, exist_ok=True)
AutoModelForCausalLM.register(HGRN2Config, HGRN2ForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(HGRN2Config, HGRN2ForSequenceClassification, exist_ok=True)

__all__ = ["HGRN2Config", "HGRN2Model", "HGRN2ForCausalLM", "HGRN2ForSequenceClassification",
           "HGRN2PreTrainedModel", "HGRN2Cache", "PRESETS"]
