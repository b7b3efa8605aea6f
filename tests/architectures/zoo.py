"""transformers' causal-LM classes, each built tiny from its own config class.

The list comes from transformers' own auto mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), so a class that a
new transformers adds is in the matrix the day it is installed, and one that it drops leaves it: nothing here
names a class to test. What is written by hand is how to make a config class small (:data:`SIZES`, one table of
constructor arguments shared by every family, and :data:`FAMILY`, the families whose constructors need more)
and the configurations worth a row of their own: :data:`VARIANTS` (Falcon with ALiBi), and the variants
:func:`derived_variants` reads off each config class (a window the sequences reach, an encoder-style config as a
decoder, a sparse indexer that keeps fewer keys than the sequences have).

Weights are the model's own initialisation with a larger ``initializer_range`` and a sharpened output layer, so
greedy decoding has clear top-2 margins (a near-tie could flip on float rounding between a window forward and a
one-token forward, and that would say nothing about the cache; the matrix also re-seeds until there is none).
"""

from __future__ import annotations

import dataclasses
import inspect
from functools import cache

import torch

VOCAB = 256
#: token ids the prompts and drafts avoid: special ids are moved here, at the top of the vocabulary
SPECIAL_LOW = 200
PAD, BOS, EOS = 0, 1, 2

# Constructor argument -> tiny value. One table for every family: a config class takes the names it has.
SIZES: dict[str, object] = {
    # width
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "embed_dim": 64, "embedding_size": 64, "emb_dim": 64,
    "embedding_dim": 64, "word_embed_proj_dim": 64, "attention_hidden_size": 64, "hidden_size_global": 64,
    # feed-forward
    "intermediate_size": 128, "ffn_dim": 128, "decoder_ffn_dim": 128, "encoder_ffn_dim": 128, "n_inner": 128,
    "dff": 128, "d_ff": 128, "d_inner": 128, "ffn_hidden_size": 128, "intermediate_size_mlp": 128, "dim_ff": 128,
    "dense_intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "shared_experts_intermediate_size": 32, "shared_intermediate_size": 32, "expert_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    # depth
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "decoder_layers": 2, "encoder_layers": 2, "n_layers": 2,
    "num_decoder_layers": 2, "num_encoder_layers": 2,
    # attention heads
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "decoder_attention_heads": 4, "encoder_attention_heads": 4,
    "n_heads": 4, "num_decoder_attention_heads": 4, "num_encoder_attention_heads": 4, "attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "dim_head": 16, "d_head": 16, "d_kv": 16, "kv_channels": 16,
    "attention_head_size": 16,
    # multi-head latent attention (DeepSeek-V2/V3 style) and sparse-attention indexers
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "qk_head_dim": 16, "index_head_dim": 16, "index_n_heads": 2,
    # mixture of experts
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "num_experts_per_token": 2, "moe_topk": 2, "n_group": 1, "topk_group": 1, "num_expert_group": 1,
    "n_shared_experts": 1,
    # linear attention / state-space layers (their classes are refused, but must be built to be asked)
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_head_dim": 16, "linear_num_heads": 4, "mamba_d_state": 8, "mamba_n_heads": 8, "mamba_d_head": 16,
    "state_size": 8, "ssm_state_size": 8, "mamba_num_heads": 8, "mamba_head_dim": 16, "time_step_rank": 8,
    # vocabulary and positions
    "vocab_size": VOCAB, "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512, "max_target_positions": 512,
    "initializer_range": 0.1,
}

# A family whose constructor needs more than SIZES (model_type -> extra arguments, applied after SIZES).
FAMILY: dict[str, dict] = {
    # rotary dimensions, head sizes and routing that SIZES' defaults do not fit
    "codegen": {"rotary_dim": 8}, "gptj": {"rotary_dim": 8},
    "dots3_note_text": {"head_dim": 20},  # its sliding layers' head size is the latent query's (12 + 8)
    "longcat_flash": {"head_dim": 8},
    "ernie4_5_moe": {"moe_k": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 1},
    "zaya": {"num_experts_per_tok": 1},
    "dbrx": {"attn_config": {"rope_theta": 1e4, "kv_n_heads": 2, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 128}},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 64,
                       "indexer_compress_ratio": 4},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    # per-layer layouts that a two-layer cut of the defaults does not give
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # its checkpoints' layout (the config's default has no conv)
    "dory": {"num_hidden_layers": 4, "n_input_layers": 1, "n_recurrent_layers": 2, "n_output_layers": 1,
             "layer_types": ["sliding_attention", "full_attention"] * 2, "rope_parameters": None},
    # Gemma-3n: two layers that keep a cache, two that read it (KV sharing), one of each attention kind
    "gemma3n_text": {"num_hidden_layers": 4, "num_kv_shared_layers": 2, "intermediate_size": [128] * 4,
                     "layer_types": ["sliding_attention", "full_attention"] * 2,
                     "activation_sparsity_pattern": [0.0] * 4, "hidden_size_per_layer_input": 16,
                     "vocab_size_per_layer_input": VOCAB, "laurel_rank": 8},
    # Gemma-3n's vision tower is a timm model: the smallest MobileNet instead of its 300M-parameter encoder
    "gemma3n": {"vision_config": {"architecture": "mobilenetv3_small_050", "hidden_size": 64},
                "audio_config": {"hidden_size": 64, "conf_num_hidden_layers": 1, "conf_num_attention_heads": 2,
                                 "sscp_conv_channel_size": [8, 8], "input_feat_size": 16}},
    # Kolibri 1.1: a sliding layer, an indexed (sparse) layer that keeps a cache and one that reads it; a pool,
    # local and sink tokens smaller than the sequences, so the indexer selects
    "kolibri1_1": {"num_hidden_layers": 3, "layer_types": ["sliding_attention"] + ["indexed_attention"] * 2,
                   "kv_source_layers": [0, 1, 1], "index_layers": [1], "mlp_only_layers": [0],
                   "mlp_only_intermediate_size": 128, "index_num_heads": 2, "index_pool_size": 16,
                   "index_compression": 4, "index_num_local_tokens": 4, "index_num_sink_tokens": 2},
    "gemma4_text": {"hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB},
    "gemma4_unified_text": {"hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB},
    # assistant (draft) models: every layer reads the target model's cache
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
                                         "num_hidden_layers": 2, "num_kv_shared_layers": 2,
                                         "layer_types": ["sliding_attention", "full_attention"]}},
    "gemma4_unified_assistant": {"text_config": {"num_kv_shared_layers": 2}},
    # vocabulary-sized tables SIZES does not name
    "blt": {"encoder_hash_byte_group_vocab": 64},
    "roc_bert": {"shape_vocab_size": 64, "pronunciation_vocab_size": 64, "shape_embed_dim": 16,
                 "pronunciation_embed_dim": 16},
    "inkling2_text": {"unpadded_vocab_size": VOCAB}, "inkling2_loop_text": {"unpadded_vocab_size": VOCAB},
    # recurrent and other refused families: enough to build them (their refusal is what is checked)
    "bamba": {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_chunk_size": 16},
    "falcon_h1": {"mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_chunk_size": 16},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"], "mamba_n_heads": 8,
                         "mamba_d_head": 16, "mamba_chunk_size": 16},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "use_mamba_kernels": False, "mamba_dt_rank": 8},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1, "chunk_size": 16},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"], "lru_width": 64},
    "reformer": {"is_decoder": True, "axial_pos_shape": [16, 32], "axial_pos_embds_dim": [32, 32],
                 "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8, "num_buckets": 4},
    "xlstm": {"num_blocks": 2, "qk_dim_factor": 1.0},
    "zamba": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1, "attention_hidden_size": 128,
              "attention_head_dim": 32, "mamba_dt_rank": 8,
              "layers_block_type": ["linear_attention", "hybrid", "linear_attention", "hybrid"]},
}

# What a family needs after it is built (model_type -> a function of the model), as its model card says.
SETUP: dict[str, object] = {
    "xmod": lambda model: model.set_default_language("en_XX"),
}

# Extra configurations with a row of their own: (model_type, label) -> arguments. The label says what differs.
# Besides these, entries() derives three kinds from each config class (so a new family gets them too):
# "window" (every attention window shrunk to WINDOW, which the matrix's sequences pass), "is_decoder"
# (an encoder-style model loaded as a causal decoder, as its model card says to) and "index_topk" (a sparse
# attention's indexer keeps 4 keys per query, fewer than the sequences have).
VARIANTS: dict[tuple[str, str], dict] = {
    ("falcon", "alibi"): {"alibi": True},  # ALiBi biases from the attention mask instead of rotary positions
}
#: the attention window of the "window" variants (prompts of up to 5 tokens + 24 new ones pass it)
WINDOW = 8


@dataclasses.dataclass(frozen=True)
class Entry:
    """One configuration of the matrix: a causal-LM class of transformers and the arguments of its tiny config."""

    model_type: str
    class_name: str
    variant: str = ""

    @property
    def id(self) -> str:
        return f"{self.model_type}[{self.variant}]" if self.variant else self.model_type


@cache
def causal_lm_classes() -> dict[str, str]:
    """model_type -> class name, from transformers' own auto mapping of causal-LM heads."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@cache
def entries() -> list[Entry]:
    """Every configuration of the matrix: each model type of the mapping once, then the variants (the listed
    ones, and those :func:`derived_variants` finds)."""
    classes = causal_lm_classes()
    rows = [Entry(model_type, class_name) for model_type, class_name in classes.items()]
    rows += [Entry(model_type, classes[model_type], label) for model_type, label in VARIANTS
             if model_type in classes]
    for model_type, class_name in classes.items():
        rows += [Entry(model_type, class_name, label) for label in derived_variants(Entry(model_type, class_name))]
    return rows


def derived_variants(entry: Entry) -> list[str]:
    """The variants ``entry``'s config class has: ``"window"`` if its attention window can be shrunk to
    :data:`WINDOW` (the tiny config then has sliding, chunked or local layers), ``"is_decoder"`` if it is an
    encoder-style config (``is_decoder`` and ``add_cross_attention`` arguments) that defaults to an encoder."""
    try:
        cls = config_class(entry)
        fields = _fields(cls)
    except Exception:  # noqa: BLE001 - a class whose config cannot be made has no variants (its row says why)
        return []
    labels = []
    if {"is_decoder", "add_cross_attention"} <= fields and not cls().is_decoder:
        labels.append("is_decoder")
    try:
        config = tiny_config(Entry(entry.model_type, entry.class_name, "window"))
    except Exception:  # noqa: BLE001
        return labels
    if _windowed(config):
        labels.append("window")
    if "index_topk" in fields:
        labels.append("index_topk")
    return labels


def _window_arguments(cls) -> dict:
    """Arguments that shrink a config class's attention windows to :data:`WINDOW` (and turn windows on where a
    flag does), in it or in its text sub-config."""
    fields = _fields(cls)
    if "text_config" in fields and "text_config" in getattr(cls, "sub_configs", {}):
        sub = cls.sub_configs["text_config"]
        if isinstance(sub, type) and hasattr(sub, "model_type") and _window_arguments(sub):
            return {"text_config": _window_arguments(sub)}
    arguments = {}
    for name, value in (("sliding_window", WINDOW), ("attention_chunk_size", WINDOW), ("use_sliding_window", True),
                        ("max_window_layers", 1), ("sliding_window_size", WINDOW)):
        if name in fields:
            arguments[name] = value
    if "window_size" in fields and ({"attention_layers", "attention_types"} & fields):  # GPT-Neo's local layers
        arguments["window_size"] = WINDOW
    return arguments


def _windowed(config) -> bool:
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    try:
        types = get_layer_types_and_kwargs(text)[0]
    except Exception:  # noqa: BLE001
        types = []
    return bool({"sliding_attention", "chunked_attention"} & set(types)) or "local" in (
        getattr(text, "attention_layers", None) or [])


def _fields(config_class) -> set[str]:
    return set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}


DEPTH_NAMES = ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers", "n_layers")


def _tiny_arguments(config_class, defaults=None, extra: dict | None = None) -> dict:
    """Constructor arguments that make ``config_class`` tiny: :data:`SIZES` where it has the name, one layer of
    each kind its per-layer lists name (:func:`_layer_lists`), its sub-configs made tiny the same way (as dicts),
    special token ids moved into the small vocabulary, then ``extra`` (a dict value merges into a sub-config's).
    ``defaults``: an instance with the class's defaults."""
    extra = extra or {}
    if defaults is None:
        try:
            defaults = config_class()
        except Exception:  # some classes' defaults do not validate on their own (Gemma-4 assistant)
            defaults = config_class(**extra)
    fields = _fields(config_class)
    arguments = {name: value for name, value in SIZES.items() if name in fields}
    arguments.update(_layer_lists(defaults, fields))
    for name in getattr(config_class, "sub_configs", {}):
        sub = getattr(defaults, name, None)
        if name in fields and hasattr(sub, "to_dict"):
            sub_extra = {**FAMILY.get(getattr(sub, "model_type", None), {}), **extra.get(name, {})}
            arguments[name] = {**sub.to_dict(), **_tiny_arguments(type(sub), sub, sub_extra)}
    if "kv_lora_rank" in fields and "num_key_value_heads" in arguments:  # latent attention: one key head per query
        arguments["num_key_value_heads"] = arguments.get("num_attention_heads", SIZES["num_attention_heads"])
    arguments.update(_special_ids(config_class, fields))
    sub_configs = getattr(config_class, "sub_configs", {})
    arguments.update({name: value for name, value in extra.items() if name not in sub_configs})
    if "per_layer_config" in arguments:  # heterogeneous layers: each kept layer's sizes, tiny in the same ratio
        globals_ = defaults.to_dict()
        arguments["per_layer_config"] = {
            key: {name: _scaled(value, globals_.get(name), arguments.get(name)) for name, value in sizes.items()}
            for key, sizes in arguments["per_layer_config"].items()}
    return arguments


def _layer_lists(defaults, fields: set[str]) -> dict:
    """Per-layer lists (``layer_types``, ``mlp_layer_types``, ``attention_layers``, flags such as
    ``no_rope_layers``) cut to one layer of each distinct kind (at least two layers), and lists of layer indices
    (``moe_layers``, ``full_attn_idxs``, ...) renumbered to the layers kept; the depth set to match."""
    values = defaults.to_dict()  # not getattr: a heterogeneous config refuses to read a per-layer size globally
    depth_name = next((n for n in DEPTH_NAMES if n in fields and isinstance(values.get(n), int)), None)
    if depth_name is None:
        return {}
    depth = values[depth_name]
    values = {name: values.get(name) for name in fields}
    per_layer = {name: v for name, v in values.items()
                 if isinstance(v, (list, tuple)) and len(v) == depth and not _is_index_list(v, depth)}
    kinds = [name for name, v in per_layer.items() if all(isinstance(x, str) for x in v)]
    keep: list[int] = []
    seen = set()
    for layer in range(depth):
        kind = tuple(per_layer[name][layer] for name in kinds)
        if kind not in seen:
            seen.add(kind)
            keep.append(layer)
    keep += [layer for layer in range(depth) if layer not in keep][: max(0, 2 - len(keep))]
    keep.sort()
    arguments = {depth_name: len(keep)}
    overrides = defaults.to_dict().get("per_layer_config") or {}
    if overrides:  # the kept layers' own sizes, renumbered (made tiny by _tiny_arguments)
        arguments["per_layer_config"] = {str(new): dict(overrides[key]) for new, layer in enumerate(keep)
                                         for key in overrides if int(key) == layer}
    for name, v in per_layer.items():
        arguments[name] = [v[layer] for layer in keep]
    for name, v in values.items():
        if isinstance(v, (list, tuple)) and name not in per_layer and _is_index_list(v, depth) and v:
            arguments[name] = [new for new, layer in enumerate(keep) if layer in set(v)]
    return arguments


def _scaled(value, default, tiny):
    """A layer's own size ``value`` where the global size is ``default`` (made ``tiny``): tiny in the same ratio."""
    if not all(isinstance(x, int) for x in (value, default, tiny)) or not default:
        return value
    return max(1, round(tiny * value / default))


def _is_index_list(values, depth: int) -> bool:
    """Whether ``values`` is a sorted list of distinct layer indices (rather than one value per layer)."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in values) or not values:
        return False
    if set(values) <= {0, 1} and len(values) == depth:  # per-layer flags
        return False
    return list(values) == sorted(set(values)) and max(values) < depth


def _special_ids(config_class, fields: set[str]) -> dict:
    """pad 0, bos 1, eos 2, and any other ``*_token_id`` / ``*_token_index`` a distinct id from the top down."""
    ids, high = {}, VOCAB - 1
    for name in sorted(fields):
        if name == "pad_token_id":
            ids[name] = PAD
        elif name == "bos_token_id":
            ids[name] = BOS
        elif name == "eos_token_id":
            ids[name] = EOS
        elif name.endswith(("_token_id", "_token_index", "_token_ids")) and name != "decoder_start_token_id":
            ids[name], high = high, high - 1
        elif name == "decoder_start_token_id":
            ids[name] = BOS
    return ids


def config_class(entry: Entry):
    """The config class of ``entry``: its model type's, unless the class takes another (``MusicgenForCausalLM``
    takes the decoder's config, ``Emu3ForCausalLM`` the text model's)."""
    import transformers
    from transformers import CONFIG_MAPPING

    by_type, by_class = CONFIG_MAPPING[entry.model_type], getattr(transformers, entry.class_name).config_class
    return by_type if issubclass(by_type, by_class) else by_class


def tiny_config(entry: Entry):
    cls = config_class(entry)
    family = FAMILY.get(entry.model_type, FAMILY.get(getattr(cls, "model_type", None), {}))
    variant = VARIANTS.get((entry.model_type, entry.variant), {})
    if entry.variant == "window":
        variant = _window_arguments(cls)
    elif entry.variant == "is_decoder":
        variant = {"is_decoder": True}
    elif entry.variant == "index_topk":  # sparse attention keeps fewer keys per query than the sequence has
        variant = {"index_topk": 4}
    extra = {**family}
    for name, value in variant.items():  # a variant's sub-config arguments merge into the family's
        merge = isinstance(value, dict) and isinstance(extra.get(name), dict)
        extra[name] = {**extra[name], **value} if merge else value
    arguments = _tiny_arguments(cls, extra=extra)
    if entry.variant == "window":  # per-layer types without a window are recomputed from the window flags
        for target in (arguments, arguments.get("text_config")):
            types = (target or {}).get("layer_types")
            if types and not {"sliding_attention", "chunked_attention"} & set(types):
                del target["layer_types"]
    return cls(**arguments)


def build(entry: Entry, seed: int = 0, sharpen: float = 4.0):
    """The tiny model of ``entry`` (eval mode, seeded), its output layer multiplied by ``sharpen``."""
    import transformers

    config = tiny_config(entry)
    torch.manual_seed(seed)
    model = getattr(transformers, entry.class_name)(config).eval()
    if entry.model_type in SETUP:
        SETUP[entry.model_type](model)
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        with torch.no_grad():
            head.weight.mul_(sharpen)
    return model


def parameter_count(entry: Entry) -> int:
    """Parameters of ``entry``'s tiny model, counted on the meta device (nothing allocated)."""
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, entry.class_name)(tiny_config(entry))
    return sum(p.numel() for p in model.parameters())
