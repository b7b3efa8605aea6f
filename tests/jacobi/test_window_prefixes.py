"""Processors see prefixes vanilla sampling never builds: a window's positions behind drafts, forbidden ones too.

Position j of a window is processed after the drafts before it, and a draft may be a token the processors forbid
(rejected later, p = 0). Behind it the processors may allow nothing, or a user's function may refuse to answer;
either must leave the law of what is committed transformers' own. And a processor is read by its exact type: a
subclass of a warper may read ``input_ids`` where its base does not. Sample size: see ``ROWS``.
"""

import collections
import math

import pytest
import torch
from transformers import NoBadWordsLogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper
from transformers import StoppingCriteria, StoppingCriteriaList, TopKLogitsWarper

from toy import COND, VOCAB, chi_square_pvalue, exact_distribution

# Over the toy model's 216 sequences of 3 tokens (1296 of 4), the defects these tests guard against shift the law by
# a total variation of 0.03 or more (a forbidden token's drafts accepted with probability 1): at 12 000 rows the
# chi-square rejects them at p < 1e-6 (checked by reverting each fix), and passes a correct sampler at level 1e-3
# with probability 0.999.
ROWS = 12000
# "3 1" is banned, and so is every token after "3 1": vanilla never builds that prefix (1 never follows 3), a
# window does whenever it drafts 3 then 1, and the position behind it has no allowed token (no law)
DEAD_AFTER_3_1 = [[3, 1]] + [[3, 1, token] for token in range(VOCAB)]


def grammar(batch_id, tokens):
    """After token 3 only token 1 may follow; a prefix that breaks the rule is a dead state: nothing allowed."""
    tokens = tokens.tolist()[1:]  # after the prompt
    if any(a == 3 and b != 1 for a, b in zip(tokens, tokens[1:])):
        return []
    return [1] if tokens and tokens[-1] == 3 else list(range(VOCAB))


class GrammarProcessor:
    """``grammar`` as a processor over ``(input_ids, scores)`` (for the exact law)."""

    def __call__(self, input_ids, scores):
        allowed = torch.full_like(scores, -math.inf)
        for row, tokens in enumerate(input_ids):
            allowed[row, grammar(0, tokens)] = 0.0
        return scores + allowed


def exact_law(model, processors, num_new=3):
    """The exact law of ``num_new`` tokens; sequences through a state with no law (never sampled) have probability 0."""
    law = exact_distribution(model, [COND], num_new, top_k=VOCAB, processors=processors)
    return {sequence: 0.0 if math.isnan(p) else p for sequence, p in law.items()}


def sample(model, seed=0, rows=ROWS, num_new=3, **kwargs):
    torch.manual_seed(seed)
    out = model.generate(torch.full((rows, 1), COND), do_sample=True, top_k=None, max_new_tokens=num_new, **kwargs)
    return collections.Counter(tuple(row) for row in out[:, 1:].tolist())


COMPOSITIONS = {
    "sjd": {"custom_generate": "sjd"},
    "mc-sjd": {"custom_generate": "mc-sjd", "jacobi_siblings": 0},
    "mc-sjd+siblings": {"custom_generate": "mc-sjd", "jacobi_siblings": 2},
    "last-target": {"custom_generate": "mc-sjd", "jacobi_siblings": 0, "draft_init": "last-target"},
    "block": {"custom_generate": "sjd", "verifier": "block"},
    "gumbel": {"custom_generate": "mc-sjd", "jacobi_siblings": 1, "draft_coupling": "gumbel"},
}


@pytest.mark.parametrize("knobs", COMPOSITIONS.values(), ids=COMPOSITIONS.keys())
def test_a_position_with_no_law_behind_a_forbidden_draft_leaves_the_law_exact(model, knobs):
    """Drafts are never drawn from such a position's (NaN) law: they were, stored with q = NaN, and then accepted
    whenever p > 0 (block verification refused the call)."""
    num_new = 4 if knobs.get("verifier") == "block" else 3  # 3 drafts: a position with no law behind a weighed one
    exact = exact_law(model, [NoBadWordsLogitsProcessor(DEAD_AFTER_3_1, eos_token_id=None)], num_new)
    counts = sample(model, bad_words_ids=DEAD_AFTER_3_1, jacobi_window=3, num_new=num_new, **knobs)
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0 and pvalue > 1e-3


def test_a_prefix_function_that_allows_nothing_behind_a_forbidden_draft_runs_as_transformers_does(model):
    """transformers' processor raises where the function answers ``[]``; vanilla never asks it there, a window does.
    The law (sampled) and the tokens (greedy) are transformers'."""
    for knobs in (COMPOSITIONS["sjd"], COMPOSITIONS["mc-sjd+siblings"], COMPOSITIONS["block"]):
        num_new = 4 if knobs.get("verifier") == "block" else 3
        counts = sample(model, prefix_allowed_tokens_fn=grammar, jacobi_window=3, num_new=num_new, **knobs)
        _, pvalue, impossible = chi_square_pvalue(counts, exact_law(model, [GrammarProcessor()], num_new))
        assert impossible == 0 and pvalue > 1e-3, knobs
    prompts = torch.tensor([[COND], [COND - 1], [2], [3]])
    expected = model.generate(prompts, max_new_tokens=6, prefix_allowed_tokens_fn=grammar)
    for knobs in COMPOSITIONS.values():
        got = model.generate(prompts, max_new_tokens=6, prefix_allowed_tokens_fn=grammar, jacobi_window=3, **knobs)
        assert torch.equal(got, expected), knobs


@pytest.mark.parametrize("remove_invalid_values", [False, True])
def test_nothing_allowed_at_a_committed_position_is_still_refused(model, remove_invalid_values):
    """Where the function allows nothing after a committed prefix, the call raises (transformers raises too), also
    where a later processor would clear the mark (``remove_invalid_values`` turns NaN into 0: a uniform law)."""
    def nothing_after_two(batch_id, tokens):
        return [] if len(tokens) >= 3 else list(range(VOCAB))

    kwargs = dict(max_new_tokens=4, prefix_allowed_tokens_fn=nothing_after_two,
                  remove_invalid_values=remove_invalid_values)
    for do_sample in (False, True):
        with pytest.raises(ValueError, match="empty list"):
            model.generate(torch.full((2, 1), COND), do_sample=do_sample, **kwargs)
        with pytest.raises(ValueError, match="leave no token allowed at generated position 2"):
            model.generate(torch.full((2, 1), COND), do_sample=do_sample, custom_generate="sjd", jacobi_window=3,
                           **kwargs)


class AfterNewTokens(StoppingCriteria):
    def __init__(self, prompt_length: int, num_new: int) -> None:
        self.prompt_length, self.num_new = prompt_length, num_new

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((len(input_ids),), input_ids.shape[1] - self.prompt_length >= self.num_new)


def test_nothing_allowed_past_where_a_users_criterion_stopped_is_not_refused(model):
    """A window may commit past the step where the user's criterion ends the batch; a position there whose law is
    undefined was never generated (transformers never asks the function there), so the call runs as vanilla does."""
    def nothing_after_two(batch_id, tokens):
        return [] if len(tokens) >= 3 else list(range(VOCAB))

    prompts = torch.full((2, 1), COND)
    kwargs = dict(max_new_tokens=4, prefix_allowed_tokens_fn=nothing_after_two,
                  stopping_criteria=StoppingCriteriaList([AfterNewTokens(1, 2)]))
    for do_sample in (False, True):
        torch.manual_seed(0)
        expected = model.generate(prompts, do_sample=do_sample, **kwargs)
        for knobs in COMPOSITIONS.values():
            torch.manual_seed(0)
            got = model.generate(prompts, do_sample=do_sample, jacobi_window=3, **kwargs, **knobs)
            assert got.shape == expected.shape == (2, 3), knobs
            if not do_sample:
                assert torch.equal(got, expected), knobs


class AfterNewTokensByPrompt(StoppingCriteria):
    def __init__(self, stops: dict[int, int]) -> None:
        self.stops = stops  # prompt token -> new tokens after which its row stops

    def __call__(self, input_ids, scores, **kwargs):
        return torch.tensor([len(row) - 1 >= self.stops[int(row[0])] for row in input_ids])


def test_nothing_allowed_past_a_rows_stop_is_refused_where_the_batch_goes_on(model):
    """Without an EOS id a stopped row samples on until the last row stops: where the function allows nothing
    after the row's stop but before the batch ends, the call raises as transformers' does (the window may have
    committed that position before the batch's end was known)."""
    def nothing_after_two_for_cond(batch_id, tokens):
        return [] if int(tokens[0]) == COND and len(tokens) >= 3 else list(range(VOCAB))

    prompts = torch.tensor([[COND], [COND - 1]])
    kwargs = dict(max_new_tokens=6, prefix_allowed_tokens_fn=nothing_after_two_for_cond,
                  stopping_criteria=StoppingCriteriaList([AfterNewTokensByPrompt({COND: 2, COND - 1: 4})]))
    for do_sample in (False, True):
        with pytest.raises(ValueError, match="empty list"):
            model.generate(prompts, do_sample=do_sample, **kwargs)
        for seed, knobs in enumerate(COMPOSITIONS.values()):
            torch.manual_seed(seed)
            with pytest.raises(ValueError, match="leave no token allowed at generated position 2 of row 0"):
                model.generate(prompts, do_sample=do_sample, jacobi_window=3, **kwargs, **knobs)


def test_the_prefix_constraints_fallback_is_transformers_per_row_and_refused_across_copies(model):
    """Where the processors before it forbid every token the function allows, transformers' constraint allows them
    again (score 0) in a group of rows only if every row of the group is stuck at that step; its group is the
    num_return_sequences copies of a prompt. Per row (repeated prompts) the window runs as vanilla does; across
    copies, which a window decodes at different steps, the stuck position is refused, saying so."""
    kwargs = dict(max_new_tokens=4, no_repeat_ngram_size=1, prefix_allowed_tokens_fn=lambda batch_id, sent: [1, 2])
    repeated = torch.full((3, 1), COND)  # after 1 and 2 (any order) nothing is allowed: the fallback at token 3
    expected = model.generate(repeated, do_sample=False, **kwargs)
    for seed, knobs in enumerate(COMPOSITIONS.values()):
        assert torch.equal(model.generate(repeated, do_sample=False, jacobi_window=3, **kwargs, **knobs), expected)
        torch.manual_seed(seed)
        out = model.generate(repeated, do_sample=True, jacobi_window=3, **kwargs, **knobs)
        assert all(sorted(row[1:3]) == [1, 2] and set(row[3:]) <= {1, 2} for row in out.tolist()), knobs
        torch.manual_seed(seed)
        with pytest.raises(ValueError, match="repeat the prompts instead of num_return_sequences"):
            model.generate(torch.full((1, 1), COND), do_sample=True, num_return_sequences=3, jacobi_window=3,
                           **kwargs, **knobs)


def test_greedy_where_the_processors_allow_nothing_is_transformers_argmax(model):
    """Where the processors leave every score -inf from the first position, transformers' greedy takes the argmax
    (token 0) and runs; so does the window (drafted from the whole vocabulary: no token is allowed to draft from)."""
    prompts = torch.tensor([[COND], [COND - 1]])
    kwargs = dict(do_sample=False, max_new_tokens=4, suppress_tokens=[0, 1],
                  prefix_allowed_tokens_fn=lambda batch_id, sent: [0, 1])
    expected = model.generate(prompts, **kwargs)
    for knobs in COMPOSITIONS.values():
        assert torch.equal(model.generate(prompts, jacobi_window=3, **kwargs, **knobs), expected), knobs


class StepTemperature(TemperatureLogitsWarper):
    """A warper subclass that reads ``input_ids``: hot after an even prefix length, cold after an odd one."""

    def __call__(self, input_ids, scores):
        return scores / (3.0 if input_ids.shape[-1] % 2 == 0 else 0.3)


class NotTheLastToken(SuppressTokensLogitsProcessor):
    """A suppressor subclass that reads ``input_ids``: the previous token cannot follow itself."""

    def __init__(self):
        super().__init__([])

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], -math.inf)


class TopKAndZero(TopKLogitsWarper):
    """A top-k subclass that also keeps token 0 (an end token, say): a support of k + 1."""

    def __call__(self, input_ids, scores):
        return super().__call__(input_ids, scores).index_copy(1, torch.tensor([0]), scores[:, :1])


def test_a_processor_subclass_is_not_read_as_its_base(model):
    """A subclass of a prefix-free warper gets its prefix; a top-k subclass is not fused into the sparse top-k."""
    for processor, knobs in ((StepTemperature(1.0), {}), (TopKAndZero(1), {"jacobi_sparse": True})):
        exact = exact_law(model, [processor])
        counts = sample(model, logits_processor=[processor], custom_generate="sjd", jacobi_window=2, **knobs)
        _, pvalue, impossible = chi_square_pvalue(counts, exact)
        assert impossible == 0 and pvalue > 1e-3, type(processor).__name__
    prompts = torch.tensor([[COND], [3]])
    expected = model.generate(prompts, max_new_tokens=8, logits_processor=[NotTheLastToken()])
    got = model.generate(prompts, max_new_tokens=8, logits_processor=[NotTheLastToken()], custom_generate="sjd",
                         jacobi_window=3)
    assert torch.equal(got, expected)


def test_a_prefix_of_weight_zero_weighs_nothing_where_the_law_after_it_is_none():
    """Block verification's max(rho p - q, 0): 0 where rho = 0, whatever p is there (0 x NaN was NaN)."""
    from hf_sjd.jacobi.distributions import unnormalised_residual

    p = torch.tensor([[[0.5, 0.5], [math.nan, math.nan]]])  # [b=1, L=2, V=2]: no law behind the second draft
    q = torch.full((1, 2, 2), 0.5)
    residual = unnormalised_residual(p, q, torch.tensor([[1.0, 0.0]]))
    assert torch.equal(residual, torch.zeros(1, 2, 2))
