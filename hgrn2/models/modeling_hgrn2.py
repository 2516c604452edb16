"""The HGRN2 language model as transformers classes (state-dict names identical to fla's HGRN2).

    x = embeddings(ids)
    per layer l:  x = x + attn(attn_norm(x), β_l);  x = x + mlp(mlp_norm(x))
    logits = lm_head(norm(x))

Each residual add is fused with the norm after it (`RMSNorm.add_and_norm`): a block takes the residual stream
and the previous block's pending branch output and returns its own, and the final norm adds the last one.

β = cumax(Γ) with Γ = `model.lower_bounds` [L, hidden] (zero-initialised, so β_l = l / L at the start); layer 0's
bound is 0. `attn` is any token mixer of `hgrn2.layers.TOKEN_MIXERS`, chosen by `config.token_mixer`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
)
from transformers.utils import ModelOutput

from ..layers import GLU, HGRU2, check_mixer_options, get_token_mixer
from ..layers.conv import ShortConv
from ..layers.norm import LayerNorm, RMSNorm
from ..ops.checks import reads_on_host
from ..ops.cross_entropy import linear_cross_entropy
from ..ops.gates import layer_bounds, lower_bounds_from_logits
from .cache import HGRN2Cache, HGRN2StaticCache, MixerState
from .configuration_hgrn2 import HGRN2Config

# transformers ≥ 5.24 names the recurrent cache `cache` (model outputs, forward arguments, generate's model kwargs),
# earlier versions `past_key_values`: the models take either and return it under the installed version's name.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def _one_cache(cache, past_key_values):
    if cache is not None and past_key_values is not None:
        raise ValueError("`cache` / `past_key_values`: two names for one cache, pass only one")
    return cache if cache is not None else past_key_values


class HGRN2Block(nn.Module):
    """Pre-norm block: token mixer then SwiGLU MLP, each with a residual. x [B, T, hidden]."""

    def __init__(self, config: HGRN2Config, layer_idx: int) -> None:
        super().__init__()
        d = config.hidden_size
        self.attn_norm = RMSNorm(d, eps=config.norm_eps)
        check_mixer_options(config.token_mixer, config.mixer_kwargs())
        self.attn = get_token_mixer(config.token_mixer)(d, layer_idx=layer_idx, **config.mixer_kwargs())
        self.mlp_norm = self.mlp = None
        if config.use_mlp:
            self.mlp_norm = RMSNorm(d, eps=config.norm_eps)
            self.mlp = GLU(d, config.hidden_ratio, config.intermediate_size, config.hidden_act)

    def forward(self, x: torch.Tensor, branch: torch.Tensor | None = None, lower_bound: torch.Tensor | None = None,
                state: MixerState | None = None, use_cache: bool = False, attention_mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, MixerState | None]:
        """x [B, T, hidden]: the residual stream without `branch`, the previous block's last branch output
        (None before the first block). Returns (x, branch, state): this block's residual stream is x + branch."""
        dt = _projection_dtype(x)
        kw = dict(lower_bound=lower_bound, state=state, use_cache=use_cache, attention_mask=attention_mask,
                  cu_seqlens=cu_seqlens)
        if isinstance(self.attn, HGRU2):  # the mixer applies the norm (one kernel with q/f/i in decoding)
            y, state, x = self.attn(x, prenorm=(self.attn_norm, branch, dt), **kw)
        else:
            if branch is None:
                h = self.attn_norm(x, dt)
            else:
                x, h = self.attn_norm.add_and_norm(x, branch, dt)
            y, state = self.attn(h, **kw)
        if self.mlp is None:
            return x, y, state
        out, x = self.mlp(x, prenorm=(self.mlp_norm, y, dt))
        return x, out, state


def _projection_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype in which a block's norm hands the fp32 residual x to the projections: under autocast, the
    autocast dtype. The projections would cast to it anyway, one copy each (three in the token mixer, two in
    the MLP), every copy kept for the backward; written so by the norm, they share one and no cast pass is
    made. The forward is unchanged; the consumers' input gradients are then summed in the autocast dtype
    (as for any low-precision activation with several consumers). None: x's own dtype."""
    kind = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return None


class HGRN2PreTrainedModel(PreTrainedModel):
    config_class = HGRN2Config
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HGRN2Block"]
    _is_stateful = True  # no assisted decoding / rollback: the recurrent state cannot be cropped

    def _init_weights(self, module: nn.Module):
        """fla's scheme: normal(0, initializer_range) for linear/conv/embedding weights, zero biases, unit norms,
        zero lower-bound logits."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, ShortConv)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (RMSNorm, LayerNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, HGRN2Model) and module.lower_bounds is not None:
            nn.init.zeros_(module.lower_bounds)
        elif not isinstance(module, (HGRN2Model, HGRN2PreTrainedModel)) and hasattr(module, "reset_parameters"):
            module.reset_parameters()

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoModel") -> None:
        """Nothing to do: the config's `save_pretrained` writes the remote-code modules and `auto_map`
        (`remote_code.py`); transformers' copy of this file would not import outside the package."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # we build an HGRN2Cache ourselves on the first forward with use_cache


class HGRN2Model(HGRN2PreTrainedModel):
    """Embeddings → L blocks → final RMSNorm. Returns BaseModelOutputWithPast with its HGRN2Cache under
    `CACHE_FIELD` (`cache`, or `past_key_values` before transformers 5.24)."""

    def __init__(self, config: HGRN2Config) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        L = config.num_hidden_layers
        bounded = config.use_lower_bound and getattr(get_token_mixer(config.token_mixer), "uses_lower_bound", True)
        if bounded and L == 1:
            # layer 0 is unbounded, so no output depends on Γ: kept (fla's checkpoints hold it) as a buffer, which
            # no loader makes trainable (DDP would wait for a trainable parameter's gradient)
            self.register_buffer("lower_bounds", torch.zeros(L, config.hidden_size))
        else:
            self.lower_bounds = nn.Parameter(torch.zeros(L, config.hidden_size)) if bounded else None
        self.layers = nn.ModuleList([HGRN2Block(config, i) for i in range(L)])
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, cache: HGRN2Cache | None = None,
                use_cache: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, cu_seqlens: torch.Tensor | None = None,
                past_key_values: HGRN2Cache | None = None, **kwargs: Any) -> BaseModelOutputWithPast | tuple:
        """input_ids [B, T] (or inputs_embeds [B, T, hidden]); attention_mask [B, T_total ≥ T] 0/1 with left
        padding (generate passes the whole mask; its last T columns belong to this call); cu_seqlens [N + 1]
        for packed sequences in a batch of one; cache (or past_key_values): an HGRN2Cache."""
        past_key_values = _one_cache(cache, past_key_values)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("`input_ids` / `inputs_embeds`: expected exactly one of them")
        if input_ids is not None:
            _check_ids(input_ids, self.config.vocab_size)
        x = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        asked = use_cache is not None
        # by default an evaluation forward keeps the state, unless its rows are packed (no state follows them)
        use_cache = use_cache if asked else (self.config.use_cache and not self.training and cu_seqlens is None)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        output_hidden_states = output_hidden_states or False
        if past_key_values is not None and not isinstance(past_key_values, HGRN2Cache):
            raise ValueError("`cache`: expected an HGRN2Cache (or None), got "
                             f"{type(past_key_values).__name__}")
        if attention_mask is not None:
            if attention_mask.ndim != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] < T:
                raise ValueError(f"`attention_mask`: expected [batch={B}, ≥{T}] 0/1 padding mask, "
                                 f"got {tuple(attention_mask.shape)}")
            attention_mask = attention_mask[:, -T:]
            if bool(attention_mask.all()):  # one check here instead of one per layer
                attention_mask = None
            elif use_cache and not asked and past_key_values is None and _right_padded(attention_mask):
                use_cache = False  # a scoring forward of right-padded rows: no state can follow them
        gckpt = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        if gckpt and use_cache:
            warnings.warn("use_cache=True is not kept under gradient checkpointing (the checkpointed layers return "
                          "no state): the forward returns no cache", stacklevel=2)
            use_cache = False
        if use_cache and past_key_values is None:
            past_key_values = HGRN2Cache(self.config.num_hidden_layers)
        betas = layer_bounds(lower_bounds_from_logits(self.lower_bounds) if self.lower_bounds is not None else None,
                             len(self.layers))
        hidden_states, branch = [], None
        for i, layer in enumerate(self.layers):
            if output_hidden_states:
                hidden_states.append(x if branch is None else x + branch)
            beta = betas[i]
            state = past_key_values[i] if past_key_values is not None else None
            if gckpt:
                x, branch, new_state = self._gradient_checkpointing_func(layer.__call__, x, branch, beta, state,
                                                                         False, attention_mask, cu_seqlens)
            else:
                x, branch, new_state = layer(x, branch, beta, state, use_cache, attention_mask, cu_seqlens)
            if use_cache:
                past_key_values.update_state(i, new_state, T)
        x = self.norm(x) if branch is None else self.norm.add_and_norm(x, branch)[1]
        if output_hidden_states:
            hidden_states.append(x)
        out = BaseModelOutputWithPast(last_hidden_state=x, hidden_states=tuple(hidden_states) if output_hidden_states
                                      else None, **{CACHE_FIELD: past_key_values if use_cache else None})
        return out if return_dict else out.to_tuple()



def _right_padded(mask: torch.Tensor) -> bool:
    """Whether every row of a 0/1 mask is ones, then zeros."""
    m = mask.to(torch.bool)
    return not bool((m[:, 1:] > m[:, :-1]).any())

class HGRN2ForCausalLM(HGRN2PreTrainedModel, GenerationMixin):
    """HGRN2Model + untied (by default) lm_head. With `labels`, the loss is computed chunkwise without
    materialising the [B·T, V] logits, and `logits` is None."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}

    def __init__(self, config: HGRN2Config) -> None:
        super().__init__(config)
        self.model = HGRN2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def get_decoder(self) -> HGRN2Model:
        return self.model

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, cache: HGRN2Cache | None = None,
                labels: torch.Tensor | None = None, use_cache: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                logits_to_keep: int | torch.Tensor = 0, num_logits_to_keep: int | None = None,
                num_items_in_batch: int | torch.Tensor | None = None, shift_labels: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None, past_key_values: HGRN2Cache | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast | tuple:
        """labels [B, T] (shifted inside, −100 ignored) or shift_labels [B, T] (already aligned with the inputs).
        logits_to_keep: int k > 0 keeps the last k positions' logits (0 keeps all), or a tensor of indices."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        cache = _one_cache(cache, past_key_values)
        if (isinstance(cache, HGRN2StaticCache) and use_cache is not False and labels is None and shift_labels is None
                and not output_hidden_states and cu_seqlens is None and cache.graphable(input_ids)
                and _only_real_tokens(attention_mask)):
            weights = (self.model.embeddings.weight.data_ptr(), self.lm_head.weight.data_ptr())  # moved: recapture
            result = CausalLMOutputWithPast(logits=cache.decode(self._decode_step(cache), input_ids, weights),
                                            **{CACHE_FIELD: cache})
            return result if return_dict else result.to_tuple()
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                         cache=cache, use_cache=use_cache,
                         output_hidden_states=output_hidden_states, return_dict=True, cu_seqlens=cu_seqlens)
        h = out.last_hidden_state
        loss = logits = None
        if labels is not None or shift_labels is not None:
            if shift_labels is None:
                shift_labels = F.pad(labels[:, 1:], (0, 1), value=-100)
            if cu_seqlens is not None and labels is not None:  # no prediction across packed-sequence boundaries
                shift_labels = shift_labels.clone()
                shift_labels[:, cu_seqlens[1:] - 1] = -100
            reduction = "mean" if num_items_in_batch is None else "sum"
            loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.lm_head.weight,
                                        shift_labels.reshape(-1).to(h.device), reduction=reduction)
            if num_items_in_batch is not None:
                loss = loss / num_items_in_batch
        else:
            keep = num_logits_to_keep if num_logits_to_keep is not None else logits_to_keep
            sel = h[:, -keep:] if isinstance(keep, int) else h[:, keep]
            logits = self.lm_head(sel)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        **{CACHE_FIELD: getattr(out, CACHE_FIELD)})
        return result if return_dict else result.to_tuple()

    def _decode_step(self, cache: HGRN2StaticCache):
        """The one-token step a CUDA graph captures: ids [B, 1] → logits [B, 1, vocab], the states updated in
        `cache`'s buffers. No attention mask: a decoded token is never padding (`_only_real_tokens`)."""
        def step(ids):
            return self.lm_head(self.model(input_ids=ids, cache=cache, use_cache=True).last_hidden_state)
        return step

    def generate(self, *args: Any, static_cache: bool = False, **kwargs: Any) -> torch.LongTensor | ModelOutput:
        """transformers' `generate`; `static_cache=True` decodes with an `HGRN2StaticCache` kept on the model (its
        buffers and CUDA graph reused by the next call of the same batch size), as `cache_implementation="static"`
        does for transformers' attention models."""
        if static_cache:
            if kwargs.get(CACHE_FIELD) is not None or kwargs.get("past_key_values") is not None:
                raise ValueError("`static_cache`: pass either static_cache=True or a cache, not both")
            if getattr(self, "_static_cache", None) is None:
                self._static_cache = HGRN2StaticCache(self.config.num_hidden_layers)
            self._static_cache.reset()
            kwargs[CACHE_FIELD] = self._static_cache
        return super().generate(*args, **kwargs)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, past_key_values: HGRN2Cache | None = None,
                                      attention_mask: torch.Tensor | None = None,
                                      inputs_embeds: torch.Tensor | None = None, use_cache: bool = True,
                                      logits_to_keep: int | torch.Tensor | None = None,
                                      cache: HGRN2Cache | None = None, next_sequence_length: int | None = None,
                                      is_first_iteration: bool | None = None, **kwargs: Any) -> dict[str, Any]:
        """Feed only the positions the cache has not consumed yet (the whole prompt first, then one token). The
        count comes from the cache itself, so `next_sequence_length` and `is_first_iteration` (transformers ≥ 5.24)
        are not needed."""
        past_key_values = _one_cache(cache, past_key_values)
        seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        if inputs_embeds is not None and seen == 0:
            inputs = {"inputs_embeds": inputs_embeds}
        else:
            # positions so far: the mask covers them all; without one, a prompt given as embeddings comes first
            if attention_mask is not None:
                total = attention_mask.shape[1]
            else:
                total = input_ids.shape[1] + (inputs_embeds.shape[1] if inputs_embeds is not None else 0)
            new = total - seen
            if not 1 <= new <= input_ids.shape[1]:
                raise ValueError(f"`cache`: the cache has consumed {seen} of {total} positions; "
                                 f"cannot feed {new} new tokens from input_ids of length {input_ids.shape[1]}")
            inputs = {"input_ids": input_ids[:, input_ids.shape[1] - new:].contiguous()}
        inputs.update(attention_mask=attention_mask, use_cache=use_cache,
                      logits_to_keep=1 if logits_to_keep is None else logits_to_keep, **{CACHE_FIELD: past_key_values})
        return inputs


class HGRN2ForSequenceClassification(HGRN2PreTrainedModel):
    """HGRN2Model + linear `score` on the last non-padding token (left or right padding)."""

    def __init__(self, config: HGRN2Config) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = HGRN2Model(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embeddings = value

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, **kwargs: object) -> SequenceClassifierOutputWithPast | tuple:
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                         use_cache=False, return_dict=True)
        h = out.last_hidden_state
        B, T = h.shape[:2]
        if attention_mask is not None:
            last = (torch.arange(T, device=h.device) * attention_mask[:, -T:].to(h.device)).argmax(-1)
        elif input_ids is not None and self.config.pad_token_id is not None:
            last = (torch.arange(T, device=h.device) * (input_ids != self.config.pad_token_id)).argmax(-1)
        else:
            last = torch.full((B,), T - 1, device=h.device)
        logits = self.score(h[torch.arange(B, device=h.device), last])
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        result = SequenceClassifierOutputWithPast(loss=loss, logits=logits)
        return result if return_dict else result.to_tuple()


def _only_real_tokens(attention_mask: torch.Tensor | None) -> bool:
    """The mask's last column (this step's token) is all ones: no padding to apply in a decode step."""
    return attention_mask is None or bool(attention_mask[:, -1].all())


def _check_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """Token ids in [0, vocab_size), read on the host for CPU tensors (on a GPU the embedding asserts on its own;
    a host read there would stall every forward); their dtype an integer one on any device."""
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"`input_ids`: expected an integer tensor of token ids, got {ids.dtype}")
    if not reads_on_host(ids) or ids.numel() == 0 or torch.compiler.is_compiling():
        return
    lo, hi = ids.min().item(), ids.max().item()
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"`input_ids`: expected token ids in [0, vocab_size={vocab_size}), got ids in [{lo}, {hi}]")
