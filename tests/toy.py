"""A tiny, peaked Llama whose exact sampling distribution can be enumerated."""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Iterator

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList, TopKLogitsWarper

import hf_sjd

VOCAB = 6  # tokens 0..3 are "image codes"; 4 is a condition prompt, 5 the null (unconditional) prompt
COND, NULL = 4, 5


@contextlib.contextmanager
def no_forward(module: torch.nn.Module) -> Iterator[None]:
    """Asserts that ``module`` runs no forward inside the block: bad input is refused before any work."""
    calls = []
    handle = module.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        yield
    finally:
        handle.remove()
    assert not calls, f"{len(calls)} forward(s) of {type(module).__name__} ran before the error"


def toy_model(seed: int = 0, sharpness: float = 4.0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=None, bos_token_id=None,
                         eos_token_id=None, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # peaked but not deterministic distributions, like a trained image model
        model.lm_head.weight.mul_(sharpness)
    model.generation_config.pad_token_id = 0
    return hf_sjd.enable(model)


@torch.no_grad()
def exact_distribution(model, prompt: list[int], num_new: int, top_k: int, guidance_scale: float = 1.0,
                       null_prompt: list[int] | None = None, processors: list | None = None,
                       guide_log_probs: bool = False) -> dict[tuple[int, ...], float]:
    """Probability of every continuation of ``num_new`` tokens under vanilla top-k sampling (with CFG: over the
    logits, or over log-probabilities as transformers guides), after ``processors`` (each called with the prompt and
    the tokens so far, as ``generate`` calls it)."""
    warper = LogitsProcessorList([*(processors or []), TopKLogitsWarper(top_k)])
    sequences = list(itertools.product(range(VOCAB), repeat=num_new))
    batch = torch.tensor(sequences)

    def logits_for(prefix: list[int]) -> torch.Tensor:
        ids = torch.cat([torch.tensor(prefix).expand(len(batch), -1), batch], dim=1)
        return model(input_ids=ids).logits[:, len(prefix) - 1: len(prefix) - 1 + num_new].float()

    logits = logits_for(prompt)
    if guidance_scale != 1.0:
        uncond = logits_for(null_prompt)
        if guide_log_probs:
            logits, uncond = logits.log_softmax(-1), uncond.log_softmax(-1)
        logits = uncond + guidance_scale * (logits - uncond)
    log_joint = torch.zeros(len(batch))
    for step in range(num_new):
        context = torch.cat([torch.tensor(prompt).expand(len(batch), -1), batch[:, :step]], dim=1)
        probs = warper(context, logits[:, step]).softmax(-1)
        log_joint += probs.gather(1, batch[:, step:step + 1]).squeeze(1).log()
    return {seq: float(p) for seq, p in zip(sequences, log_joint.exp())}


def sample_mc_sjd(model, num_samples: int, num_new: int, seed: int, guidance_scale: float | None = None, **knobs
                  ) -> tuple[collections.Counter, object]:
    """``num_samples`` seeded ``mc-sjd`` rows of ``num_new`` tokens (top-3, after the condition prompt; with CFG the
    null prompt is the negative one) -> (count of each generated sequence, the run's stats)."""
    torch.manual_seed(seed)
    extra = {}
    if guidance_scale is not None:
        extra = {"guidance_scale": guidance_scale, "negative_prompt_ids": torch.full((num_samples, 1), NULL)}
    out = model.generate(torch.full((num_samples, 1), COND), do_sample=True, top_k=3, max_new_tokens=num_new,
                         custom_generate="mc-sjd", return_dict_in_generate=True, **extra, **knobs)
    return collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist()), out.stats


class NoRepeat(LogitsProcessor):
    """A processor that reads ``input_ids``: no token follows itself."""

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], float("-inf"))


def until_eos(sequence: tuple[int, ...], eos: int) -> tuple[int, ...]:
    """``sequence`` up to and including its first ``eos`` (what follows is padding): the outcome of sampling
    that stops at EOS."""
    return sequence[: sequence.index(eos) + 1] if eos in sequence else sequence


def chi_square_pvalue(counts: dict[tuple, int], exact: dict[tuple, float], min_expected: float = 5.0
                      ) -> tuple[float, float, int]:
    """Pearson chi-square of sample counts against the exact law (bins with small expectation pooled).

    Returns (statistic, p-value, mass of samples on zero-probability sequences)."""
    from scipy.stats import chi2

    total = sum(counts.values())
    impossible = sum(c for seq, c in counts.items() if exact.get(seq, 0.0) == 0.0)
    observed, expected, pool_obs, pool_exp = [], [], 0, 0.0
    for seq, prob in exact.items():
        if prob == 0.0:
            continue
        if prob * total >= min_expected:
            observed.append(counts.get(seq, 0))
            expected.append(prob * total)
        else:
            pool_obs += counts.get(seq, 0)
            pool_exp += prob * total
    if pool_exp > 0:
        observed.append(pool_obs)
        expected.append(pool_exp)
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return statistic, float(chi2.sf(statistic, len(observed) - 1)), impossible


def tiny_llama(vocab_size: int, num_key_value_heads: int = 4, seed: int = 0):
    """A randomly initialised 2-layer Llama (shape/correctness tests only; never for speed claims)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=num_key_value_heads, pad_token_id=0,
                         bos_token_id=None, eos_token_id=None)
    return hf_sjd.enable(LlamaForCausalLM(config).eval())


def window_forward(adapter, cache, input_ids: torch.Tensor, siblings: int = 0, num_logits: int | None = None
                   ) -> torch.Tensor:
    """One forward through ``adapter.window_logits`` on a :class:`~hf_sjd.jacobi.cache.RaggedCache`, as the loop
    runs it: a tree forward (4D mask, siblings at the first draft's position) when ``siblings`` > 0."""
    width = input_ids.shape[1]
    if siblings:
        mask = adapter.tree_attention_mask(adapter.model, cache.tree_attention_mask(width, siblings))
        positions = cache.tree_position_ids(width, siblings)
    else:
        mask, positions = cache.attention_mask(width), cache.position_ids(width)
    return adapter.window_logits(adapter.model, input_ids, attention_mask=mask, position_ids=positions,
                                 cache=cache.cache, num_logits=num_logits or width)


def toy_laws(model, num_new: int) -> dict:
    """The exact laws of the toy model's ``num_new`` tokens, top-3, without CFG (key None) and with CFG 3."""
    return {None: exact_distribution(model, [COND], num_new, top_k=3),
            3.0: exact_distribution(model, [COND], num_new, top_k=3, guidance_scale=3.0, null_prompt=[NULL])}


def syncs_between_forwards(gaps: int = 6, vocab: int = 1024, **knobs) -> list[int]:
    """Device reads in each of the first ``gaps`` gaps between forwards (simulated device) of an mc-sjd run on a
    1-layer dummy Llama (V = ``vocab``), batch 2, window 8, top-k 100, with ``knobs``."""
    from benchmarks.loop_cost import CostCounter, ForwardScopes, StopRun, dummy_subject

    subject = dummy_subject(vocab, max_new_tokens=40)
    counter = CostCounter(simulate_device=True)
    with counter, ForwardScopes(subject.model, on_scope=counter.enter_scope, stop_at=gaps):
        torch.manual_seed(0)
        try:
            with torch.no_grad():
                subject.model.generate(subject.prompt(2), do_sample=True, top_k=100, max_new_tokens=40,
                                       attention_mask=torch.ones(2, 1, dtype=torch.long), custom_generate="mc-sjd",
                                       jacobi_window=8, **knobs)
        except StopRun:
            pass
        else:
            raise AssertionError("the run ended before the gaps were counted")
        counter.enter_scope(None)
    return [sum(counter.tallies[("gap", i)].syncs.values()) for i in range(gaps)]
