"""Which models Jacobi decoding runs token-identically, their cache layout, and the refusal of the others before
any decoding forward.

A window of drafts is fed after each row's committed tokens and the rejected ones' entries are dropped
(:class:`hf_sjd.jacobi.cache.RaggedCache`), so rows that commit different amounts leave masked slots before their
next window. That is exact for a causal model with a per-token KV cache, in one of three layouts:

* ``"ragged"``: positions come from ``position_ids`` or the mask, gaps change nothing (only appended slots move);
* ``"aligned"``: only slot distances matter (sliding/chunked windows, GPT-Neo's local layers, ALiBi): each row is
  kept contiguous and right-aligned, a gap being extra left padding;
* ``"lockstep"``: absolute slot indices matter: exact only while every row commits alike (one prompt; CFG's two
  copies of it commit alike), larger batches are refused.

:func:`probe` decides, windows are read from the config; what a probe cannot show is refused from the class and
config before anything runs (:func:`check_model`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..checks import UnsupportedModelError

#: transformers cache layer types whose entries are per token and can be cut per token (``DynamicCache``)
KV_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "indexed_attention", "dummy")
#: cache layer types that keep a recurrent state (state-space, linear attention, short convolutions)
RECURRENT_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "hybrid_sliding")
#: cache layer types whose attention window is measured in cache slots
WINDOW_LAYER_TYPES = ("sliding_attention", "chunked_attention")
#: transformers' mask builders that apply a window measured in slots (masking_utils)
WINDOW_MASKS = ("create_sliding_window_causal_mask", "create_chunked_causal_mask", "sliding_window_overlay",
                "chunked_overlay", "sliding_window_causal_mask_function", "chunked_causal_mask_function")
#: masked slots the probe inserts (large enough that a position error is not a rounding-sized change)
PROBE_GAP = 32
#: the refusal kind of a model whose forward fails on a window after cached tokens (the probe's own forwards)
FORWARD_FAILS = "its forward cannot take a window"
#: ... and of one whose plain one-token forward fails as well (vanilla generate's would too)
PLAIN_FORWARD_FAILS = "its forward fails"
#: the forward-hook tables of a torch module (torch.nn.Module.__init__)
HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks")  # id -> hook (the tables beside them hold flags per id)
RECURRENT = ("that summarises every token fed so far; a forward over drafts folds the rejected ones into it, and the "
             "state before them cannot be recovered per token")


def text_config(model):
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def cache_layer_types(model) -> list[str]:
    """The layer types of the ``DynamicCache`` transformers' ``generate`` builds for ``model``."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    try:
        return list(get_layer_types_and_kwargs(text_config(model))[0])
    except Exception as error:  # noqa: BLE001 - transformers' own generate fails the same way
        raise UnsupportedModelError(
            model, "no DynamicCache for this config",
            f"transformers cannot build the DynamicCache generate() decodes with from its config "
            f"({type(error).__name__}: {error})") from error


def _own_generate(model) -> type | None:
    """The class that overrides transformers' ``GenerationMixin.generate`` for ``model`` (None: nobody)."""
    from transformers import GenerationMixin

    for cls in type(model).__mro__:
        if cls is GenerationMixin:
            return None
        if "generate" in vars(cls) and not cls.__module__.startswith("hf_sjd."):
            return cls
    return None


def check_own_generate(model, known: type | None = None) -> None:
    """Refuse a model whose class overrides transformers' ``generate`` (``known``: the class whose override the
    adapter was written for, Janus's)."""
    own = _own_generate(model)
    if own is not None and own is not known:
        raise UnsupportedModelError(
            model, "a generate of its own",
            f"{own.__name__}.generate replaces transformers' decoding loop (what it does around each step is not "
            f"GenerationMixin's), and Jacobi decoding runs inside GenerationMixin.generate, so its tokens could not "
            f"match the model's own generate")


def check_model(model) -> None:
    """Refuse from ``model``'s class and config alone what Jacobi decoding cannot run exactly (in
    ``hf_sjd.enable`` and at the start of every Jacobi ``generate``)."""
    check_own_generate(model)
    if getattr(model, "_is_stateful", False):
        raise UnsupportedModelError(model, "recurrent state", f"it carries a recurrent state (state-space, "
                                    f"linear-attention or xLSTM/RWKV-style layers) {RECURRENT}")
    if not model._supports_default_dynamic_cache():
        raise UnsupportedModelError(
            model, "no croppable KV cache",
            "it keeps its own cache format instead of a transformers DynamicCache, whose entries Jacobi decoding "
            "must cut per token and per row")
    types = cache_layer_types(model)
    if all(t == "dummy" for t in types):
        raise UnsupportedModelError(
            model, "no KV cache of its own",
            "every layer reads the KV cache of another model (a draft/assistant model of a larger one), so it "
            "cannot decode on its own")
    if not {"cache", "past_key_values"} & set(inspect.signature(model.forward).parameters):
        raise UnsupportedModelError(
            model, "no KV cache",
            "its forward takes no cache, so a window of drafts cannot be appended after the committed tokens; "
            "each forward would recompute the whole sequence")
    recurrent = sorted({t for t in types if t in RECURRENT_LAYER_TYPES})
    if recurrent:
        raise UnsupportedModelError(model, "recurrent state",
                                    f"its layers of type {', '.join(recurrent)} carry a recurrent state {RECURRENT}")
    unknown = sorted({t for t in types if t not in KV_LAYER_TYPES})
    if unknown:
        raise UnsupportedModelError(
            model, "cache that cannot be cut per token",
            f"its cache layers of type {', '.join(unknown)} do not keep one entry per token, so the entries of "
            f"rejected drafts cannot be dropped")
    windowed = sorted({t for t in types if t in WINDOW_LAYER_TYPES})
    if windowed and not _masks_windows(model):
        raise UnsupportedModelError(
            model, "window applied by the cache only",
            f"its {'/'.join(windowed)} layers get their window from the cache dropping old entries (its attention "
            f"mask has no window), so a token one forward feeds sees the last window's worth of cached tokens plus "
            f"every token fed with it; a window of drafts would see more than transformers' token-by-token "
            f"decoding does")


def _masks_windows(model) -> bool:
    """Whether ``model``'s modeling code builds window masks with transformers' mask builders (Moshi does not: it
    only truncates its sliding-window cache)."""
    files = frozenset(inspect.getmodule(type(module)) for module in model.modules()) - {None}
    return _sources_mask_windows(frozenset(f for f in files if f.__name__.startswith("transformers.models.")))


@functools.cache
def _sources_mask_windows(files: frozenset) -> bool:
    for module in files:
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            return True  # source not available: trust the config
        if any(name in source for name in WINDOW_MASKS):
            return True
    return False


def check_length(model, max_length: int, prompt_length: int = 0) -> None:
    """Refuse a sparse attention (an indexer's top-k keys per query) when ``max_length`` may pass its budget, and a
    rotary embedding that rescales with the positions (:func:`rope_switch`) when the call may cross its switch (a
    longrope prompt already past it runs on the long factors throughout, as transformers' prefill does)."""
    config = text_config(model)
    switch, grows = rope_switch(model) or (None, False)
    if switch is not None and max_length > switch and (grows or prompt_length <= switch):
        raise UnsupportedModelError(
            model, "rotary frequencies that follow the longest position",
            f"its rotary embedding (dynamic or longrope scaling) recomputes its frequencies once a forward holds a "
            f"position past {switch} ({'max' if grows else 'original_max'}_position_embeddings), and this call may "
            f"reach {max_length} tokens: a window of drafts holds positions ahead of the committed token, so its "
            f"forward would switch earlier than transformers' one-token forward does and give other tokens; set "
            f"max_new_tokens so that prompt + new tokens <= {switch}"
            + ("" if grows else " (or pass a prompt longer than that)"))
    budget = getattr(config, "indexer_budget", None)
    if getattr(config, "index_topk_blocks", None) and getattr(config, "index_block_size", None):
        budget = int(config.index_topk_blocks * config.index_block_size)
    if getattr(config, "index_topk", None):
        budget = int(config.index_topk)
    if budget is not None and max_length > budget:
        raise UnsupportedModelError(
            model, "sparse attention beyond its top-k",
            f"its indexer keeps the {budget} best-scored keys of each query, and this call may reach {max_length} "
            f"tokens: once a query has more keys than that, which of the equally scored ones it keeps (ReLU "
            f"scores tie at zero) depends on how many keys the forward holds, so a window forward keeps other keys "
            f"than transformers' one-token forward; set max_new_tokens so that prompt + new tokens <= {budget}")


def window_layers(model) -> str | None:
    """What makes ``model``'s attention depend on cache slot distances (windows read from the config), or None."""
    config = text_config(model)
    windowed = sorted({t for t in cache_layer_types(model) if t in WINDOW_LAYER_TYPES})
    if windowed:
        sizes = {getattr(config, "sliding_window", None), getattr(config, "attention_chunk_size", None)} - {None}
        return f"{'/'.join(windowed)} layers (window {', '.join(map(str, sorted(sizes))) or '?'})"
    if "local" in (getattr(config, "attention_layers", None) or []):  # GPT-Neo: "global" / "local" per layer
        return f"local attention layers (window {getattr(config, 'window_size', '?')})"
    return None


@dataclass(frozen=True)
class Probe:
    """What :func:`probe` saw: a token's logits do not depend on later tokens (``causal``); a row fed after another
    committed more gets contiguous decoding's logits in the ``ragged`` and in the ``aligned`` layout; a ``tree``
    forward (``jacobi_siblings``: a sibling at its draft's position, neither seeing the other, through a 4D mask)
    gets the logits of each branch decoded on its own (not where the model builds its own biases from a 2D mask,
    as ALiBi does, or its attention takes no 4D mask). Given no position_ids, as transformers' CFG runs the negative
    prompt, the model places a left-padded prompt's tokens by cache slot, its padding counted (``slot_positions``),
    or by its mask."""

    causal: bool
    ragged: bool
    aligned: bool
    tree: bool = False
    slot_positions: bool = False


def _probe_tokens(model, count: int) -> list[int]:
    """``count`` ordinary token ids: spread over the vocabulary, none of the config's special ids."""
    vocab = model.get_input_embeddings().num_embeddings
    special = set()
    for config in (text_config(model), model.config):
        for name, value in config.to_dict().items():
            if re.search(r"token_(id|index)s?$", name):
                special.update(value if isinstance(value, list) else [value])
    tokens = [t for t in range(vocab // 3, vocab) if t not in special] or list(range(vocab))
    if len(tokens) > count:
        step = len(tokens) // (count + 1)
        return tokens[step::step][:count]
    return [tokens[i % len(tokens)] for i in range(count)]  # a tiny vocabulary: neighbours still differ


def _differ(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether two logit tensors of a ``dtype`` model differ by more than its rounding (relative to their spread:
    ~1e-6 in float32, ~1e-2 under TF32 or half precision); a layout's error, positions off by
    :data:`PROBE_GAP`, is far larger."""
    if a.shape != b.shape or a.numel() < 2:
        raise ValueError(f"the forward returned logits of shape {tuple(a.shape)} / {tuple(b.shape)}")
    eps = torch.finfo(dtype).eps
    if dtype == torch.float32 and a.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        eps = 2.0 ** -10  # TF32 keeps 10 mantissa bits
    spread = float(a.float().std()) + 1e-6
    return float((a.float() - b.float()).abs().max()) > max(spread * min(0.05, 500 * eps), 1e-5)


@torch.no_grad()
def probe(model) -> Probe:
    """Once per model object, through :class:`~hf_sjd.jacobi.cache.RaggedCache` itself: two rows decode
    ``[a, b]`` + :data:`PROBE_GAP` drafts, the first keeps none of them, the second all; then both are fed
    ``[c, d]``. The first row must get the logits of ``[a, b, c, d]`` decoded alone (and ``c``'s must not change
    when ``d`` does). The model's forward hooks are set aside in this thread: a caller's counters and timers do not
    see it (but for a hook registered while it runs)."""
    with _PROBING:  # one probe at a time: threads whose first calls meet wait for it, then read it
        cached = model.__dict__.get("_sjd_probe")
        if cached is not None:
            return cached
        model.__dict__["_sjd_probing"] = True  # tells a forward counter these forwards are the probe's
        try:
            try:
                with _hooks_set_aside(model):
                    result = _run_probe(model)
            except Exception:  # noqa: BLE001 - a model whose forward needs its hooks (FSDP, ZeRO-3): with them
                result = _run_probe(model)
        except Exception as error:  # noqa: BLE001 - the decoding forwards would fail the same way
            raise _forward_refusal(model, error) from error
        finally:
            del model.__dict__["_sjd_probing"]
        model.__dict__["_sjd_probe"] = result
        return result


def _forward_refusal(model, error: Exception) -> UnsupportedModelError:
    """Why the probe's forwards failed: a window after cached tokens, which only Jacobi decoding runs, or any forward
    (a one-token forward with no cache fails too, as vanilla ``generate``'s first would). A missing package
    (``ImportError``) is not tried again: its fallback may fetch a kernel from the Hub."""
    try:
        if not isinstance(error, ImportError):
            ids = torch.tensor([_probe_tokens(model, 1)], device=input_device(model))
            # what a prompt's first forward gets in transformers' loop: a mask, and positions where it takes them
            takes_positions = "position_ids" in inspect.signature(model.forward).parameters
            positions = {"position_ids": torch.zeros_like(ids)} if takes_positions else {}
            model.forward(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **positions)
    except Exception as plain:  # noqa: BLE001 - reported, not handled
        return UnsupportedModelError(model, PLAIN_FORWARD_FAILS, f"a forward of one token with no cache (vanilla "
                                     f"generate's would fail too) fails: {type(plain).__name__}: {plain}")
    return UnsupportedModelError(
        model, FORWARD_FAILS, f"a forward of several tokens after cached ones, with an explicit attention mask and "
        f"position_ids (what each Jacobi iteration runs), fails: {type(error).__name__}: {error}")


_PROBING = threading.RLock()  # (reentrant: a probe whose forward probes another model)


@contextlib.contextmanager
def _hooks_set_aside(model) -> Iterator[None]:
    """The forward hooks of ``model`` and its submodules skipped in this thread while the block runs: another
    thread's forwards still run them (a hook another thread registers meanwhile runs here too)."""
    this_thread = threading.get_ident()

    def skipped_here(hook):
        @functools.wraps(hook)
        def run(*args, **kwargs):  # None: the input or output unchanged
            return None if threading.get_ident() == this_thread else hook(*args, **kwargs)
        return run

    # swapped in place, in the tables torch's hook handles point to: a handle removes or reorders as it would, and
    # a table that keeps its size can be read by another thread's forward meanwhile
    saved = []
    for module in model.modules():
        for name in HOOK_TABLES:
            table = module.__dict__.get(name) or {}
            for key, hook in list(table.items()):
                table[key] = skipped_here(hook)
                saved.append((table, key, hook, table[key]))
    try:
        yield
    finally:
        for table, key, hook, wrapped in saved:
            if table.get(key) is wrapped:  # (else removed meanwhile)
                table[key] = hook


def input_device(model) -> torch.device:
    """The device ``model`` takes its inputs on: its input embeddings' weight's, or where accelerate keeps that
    weight off the device (on ``meta``: offloaded to disk or the CPU), the device its hook runs the module on."""
    embeddings = model.get_input_embeddings()
    device = embeddings.weight.device
    if device.type != "meta":
        return device
    execution = getattr(getattr(embeddings, "_hf_hook", None), "execution_device", None)
    return torch.device("cpu" if execution is None else execution)


def _run_probe(model) -> Probe:
    from transformers import DynamicCache

    from ..jacobi.cache import RaggedCache

    a, b, c, d, e, filler = _probe_tokens(model, 6)
    device = input_device(model)
    gap = max(1, min(PROBE_GAP, (position_limit(model) or PROBE_GAP + 4) - 4))  # positions reach gap + 3

    def decode(first: list[list[int]], kept: list[int], then: list[list[int]], aligned: bool,
               siblings: int = 0) -> torch.Tensor:
        """Logits of ``then`` after each row fed ``first`` and kept its first ``kept`` tokens (the loop's ops);
        the last ``siblings`` of ``then`` are siblings of its second token (the loop's tree forward)."""
        cache = RaggedCache(full_attention_layers(DynamicCache(config=text_config(model))),
                            torch.ones(len(first), 2, dtype=torch.long, device=device))
        cache.aligned = aligned
        for step, ids in enumerate((first, then)):
            ids = torch.tensor(ids, device=device)
            width = ids.shape[1]
            tree = step == 1 and siblings > 0
            mask = tree_mask(model, cache.tree_attention_mask(width, siblings)) if tree else \
                cache.attention_mask(width)
            positions = cache.tree_position_ids(width, siblings) if tree else cache.position_ids(width)
            # model.forward, not model(): the model's own hooks are not run (its submodules' are set aside by the
            # caller); wrappers that replace forward (accelerate's device hooks) still apply
            logits = model.forward(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache.cache,
                                   use_cache=True).logits
            if step == 0:
                valid = cache.plan(torch.tensor(kept, device=device))
                cache.commit(valid, width, lowest_valid=0, max_valid=max(kept))
        return logits.float()

    def unpositioned(positions: list[int] | None) -> torch.Tensor:
        """Logits of ``[filler, a, b]``, the first slot masked, at ``positions`` (None: the model's own)."""
        given = {} if positions is None else {"position_ids": torch.tensor([positions], device=device)}
        return model.forward(input_ids=torch.tensor([[filler, a, b]], device=device), use_cache=False,
                             attention_mask=torch.tensor([[0, 1, 1]], device=device), **given).logits[0, 1:].float()

    contiguous = decode([[a, b]] * 2, [2, 2], [[c, d], [c, e]], aligned=False)  # [2, 2, V]
    drafts = [a, b] + [filler] * gap
    ragged = decode([drafts] * 2, [2, len(drafts)], [[c, d]] * 2, aligned=False)
    aligned = decode([drafts] * 2, [2, len(drafts)], [[c, d]] * 2, aligned=True)
    dtype = model.get_input_embeddings().weight.dtype
    branches = None  # [3, V]: the logits of [c, d, e] after [a, b], e a sibling of d: after c, after d, after e
    if tree_mask_supported(model):
        try:
            branches = decode([[a, b]], [2], [[c, d, e]], aligned=False, siblings=1)[0]
        except Exception:  # noqa: BLE001 - any error: the 4D mask is what the forward cannot take
            pass
    try:
        own, by_slot = unpositioned(None), unpositioned([0, 1, 2])  # (rotary: equal either way up to rounding)
        slots = torch.equal(own, by_slot) or (not _differ(own, by_slot, dtype)
                                              and _differ(own, unpositioned([0, 0, 1]), dtype))
    except Exception:  # noqa: BLE001 - a forward that takes no such call: the mask's positions, as before
        slots = False
    return Probe(causal=not _differ(contiguous[0, 0], contiguous[1, 0], dtype),
                 ragged=not _differ(ragged[0], contiguous[0], dtype),
                 aligned=not _differ(aligned[0], contiguous[0], dtype),
                 tree=branches is not None and not _differ(branches, torch.cat([contiguous[0], contiguous[1, 1:]]),
                                                           dtype),
                 slot_positions=slots)


#: attention implementations that take a custom 4D mask (``jacobi_siblings``' tree forward)
TREE_ATTENTION = ("sdpa", "eager")


#: config fields that size a position table: learned (Whisper's decoder names its own), or ALiBi's (MPT)
POSITION_TABLES = ("max_position_embeddings", "max_target_positions", "max_seq_len")


def position_limit(model) -> int | None:
    """Positions a forward may reach without changing what the model computes (``None``: no limit stated): the
    end of a learned position table, or where a dynamic rotary embedding switches its frequencies
    (:func:`rope_switch`)."""
    config = text_config(model)
    limits = [getattr(config, name, None) for name in POSITION_TABLES] + [(rope_switch(model) or (None,))[0]]
    limits = [int(limit) for limit in limits if isinstance(limit, int)]
    return min(limits) if limits else None


def rope_switch(model) -> tuple[int, bool] | None:
    """Where ``model``'s rotary embedding recomputes its frequencies from the positions a forward holds
    (transformers' ``dynamic_rope_update``), and whether it keeps doing so token by token past it: ``"dynamic"``
    scaling grows them with the longest position past ``max_position_embeddings`` (its ``original_max_seq_len``),
    ``"longrope"`` switches once to its long factors past ``original_max_position_embeddings``. None: neither.
    transformers' one-token forwards cross it at another token than a window of drafts does."""
    switches = []
    for module in model.modules():
        kinds = getattr(module, "rope_type", None)
        for kind in kinds.values() if isinstance(kinds, dict) else [kinds]:
            if isinstance(kind, str) and "dynamic" in kind and isinstance(getattr(module, "original_max_seq_len",
                                                                                  None), int):
                switches.append((module.original_max_seq_len, True))
            elif kind == "longrope":
                parameters = getattr(getattr(module, "config", None), "rope_parameters", None) or {}
                nested = [v for v in parameters.values() if isinstance(v, dict)] or [parameters]
                switches += [(int(v["original_max_position_embeddings"]), False) for v in nested
                             if isinstance(v.get("original_max_position_embeddings"), int)]
    return min(switches) if switches else None


def tree_mask_supported(model) -> bool:
    return getattr(model.config, "_attn_implementation", None) in TREE_ATTENTION


def tree_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """``allowed`` [rows, 1, W, K] bool (True: attend) in the form the model's attention takes: SDPA reads a
    boolean mask as it is, eager attention adds a float one (0, or the dtype's minimum)."""
    if model.config._attn_implementation == "sdpa":
        return allowed
    blocked = torch.finfo(model.dtype).min
    return torch.zeros(allowed.shape, dtype=model.dtype, device=allowed.device).masked_fill_(~allowed, blocked)


def full_attention_layers(cache):
    """``cache`` with its empty sliding-window layers (which cannot be cut once full) made full ``DynamicLayer``\\s:
    every slot is kept and the attention mask applies the window."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    for index, layer in enumerate(getattr(cache, "layers", None) or []):
        if isinstance(layer, DynamicSlidingWindowLayer) and not layer.get_seq_length():  # a filled one is refused
            cache.layers[index] = DynamicLayer()
    return cache


def layout(model, batch: int) -> str:
    """The layout (module docstring) of ``model`` decoding ``batch`` prompts; refuses attention that is not causal
    and ``"lockstep"`` with ``batch > 1``."""
    check_model(model)
    seen = probe(model)
    if not seen.causal:
        raise UnsupportedModelError(
            model, "attention is not causal",
            "a token's logits change with the tokens after it (bidirectional attention, e.g. an encoder loaded "
            "without is_decoder=True), so the drafts of a window would change the logits of the tokens they are "
            "verified against; if the model can be a causal decoder, load it with is_decoder=True")
    windows = window_layers(model)
    if seen.ragged and windows is None:
        return "ragged"
    if seen.aligned:
        return "aligned"
    if batch > 1:
        raise UnsupportedModelError(
            model, "positions from the cache length",
            "it derives positions (or attention) from absolute cache slot indices, not from the position_ids it "
            "is given, so the rows of a batch, which commit different numbers of tokens, would see other "
            "positions than in transformers' own decoding; decode one prompt at a time (batch size 1), which is "
            "exact")
    return "lockstep"
