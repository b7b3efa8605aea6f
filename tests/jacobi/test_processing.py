"""Logits processors inside a Jacobi window: each (row, position) sees exactly vanilla sampling's prefix."""

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (PrefixConstrainedLogitsProcessor, SuppressTokensLogitsProcessor,
                                                    TopKLogitsWarper)

from hf_sjd.jacobi.processing import (call_processors, groups_by_length, process_window, window_prefixes,
                                      with_faster_equivalents)
from toy import tiny_llama


class RecordPrefixes(LogitsProcessor):
    """Writes each row's prefix length into its scores and remembers every prefix it was called with."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.extend(tuple(row.tolist()) for row in input_ids)
        return scores + input_ids.shape[1]


def test_each_row_and_position_is_processed_with_its_own_prefix():
    tokens = torch.tensor([[9, 1, 2, 0, 0, 0], [9, 3, 0, 0, 0, 0], [9, 4, 5, 6, 7, 0]])  # junk after lengths
    lengths = torch.tensor([3, 2, 5])
    drafts = torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33]])
    logits = torch.zeros(3, 4, 5)  # window of 3 drafts -> 4 positions
    recorder = RecordPrefixes()
    scores = process_window(LogitsProcessorList([recorder]), logits, tokens, lengths, drafts)
    seen = set(recorder.seen)
    for r in range(3):
        committed = tokens[r, : lengths[r]].tolist()
        for j in range(4):
            prefix = tuple(committed + drafts[r, :j].tolist())
            assert prefix in seen
            assert torch.all(scores[r, j] == len(prefix))  # the row got its own call's output


def test_processors_always_see_the_whole_batch_in_row_order():
    """Row-indexed processor state (repetition penalty's per-row prompt_ignore_length) needs the full batch,
    even when only some rows are still active."""
    class RowIndexed(LogitsProcessor):
        def __call__(self, input_ids, scores):
            assert input_ids.shape[0] == 4
            return scores + torch.arange(4)[:, None] * 100 + input_ids.shape[1]

    tokens = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 6, 0], [7, 0, 0, 0]])
    lengths = torch.tensor([2, 1, 3, 1])
    rows = torch.tensor([1, 2])  # rows 0 and 3 have finished
    scores = process_window(LogitsProcessorList([RowIndexed()]), torch.zeros(2, 3, 5), tokens, lengths,
                            torch.tensor([[8, 9], [8, 9]]), rows=rows)
    assert scores[0, :, 0].tolist() == [100 + 1, 100 + 2, 100 + 3]
    assert scores[1, :, 0].tolist() == [200 + 3, 200 + 4, 200 + 5]


def test_faster_processors_give_transformers_scores_bit_for_bit():
    """The substitutes of with_faster_equivalents on scores with ties, +-inf and NaN (NaN ranks above every number in a
    top-k, so rows with k or more NaNs keep everything), for k below, at and above the vocabulary."""
    generator = torch.Generator().manual_seed(0)
    for trial in range(400):
        vocab = int(torch.randint(2, 40, (1,), generator=generator))
        scores = torch.randint(-3, 3, (6, vocab), generator=generator).float()  # many ties
        kind = torch.rand(6, vocab, generator=generator)
        scores[kind < 0.1] = float("nan")
        scores[(kind >= 0.1) & (kind < 0.2)] = float("inf")
        scores[(kind >= 0.2) & (kind < 0.3)] = float("-inf")
        scores[0] = float("nan") if trial % 3 == 0 else scores[0]
        top_k = int(torch.randint(1, vocab + 3, (1,), generator=generator))
        processors = LogitsProcessorList([
            SuppressTokensLogitsProcessor([0, vocab - 1], device="cpu"),
            TopKLogitsWarper(top_k, filter_value=-5.0 if trial % 2 else float("-inf"), min_tokens_to_keep=2)])
        faster = with_faster_equivalents(processors)
        assert [type(p) for p in faster] != [type(p) for p in processors]  # both were replaced
        expected, got = processors(None, scores.clone()), faster(None, scores.clone())
        assert torch.equal(expected.isnan(), got.isnan()), (trial, scores, top_k)
        assert torch.equal(expected.nan_to_num(nan=0.5), got.nan_to_num(nan=0.5)), (trial, scores, top_k)


def test_a_prefix_function_that_allows_nothing_marks_its_own_row_among_returned_sequences():
    """With num_return_sequences copies transformers passes the prompt's index as ``batch_id`` (row // copies); the
    row the function answered ``[]`` for is the one marked as having no law, the others keep transformers' scores."""
    def nothing_for_the_second_copy_of_the_second_prompt(batch_id, sent):
        return [] if int(sent[-1]) == 3 else [batch_id, 4]

    input_ids = torch.tensor([[7, 0], [7, 1], [8, 2], [8, 3]])  # 2 prompts x 2 copies
    faster = with_faster_equivalents(LogitsProcessorList(
        [PrefixConstrainedLogitsProcessor(nothing_for_the_second_copy_of_the_second_prompt, 2)]))
    got = call_processors(faster, input_ids, torch.zeros(4, 6))
    assert got[3].isnan().all()
    for row in range(3):  # transformers' mask: 0 on the allowed tokens of the row's prompt, -inf elsewhere
        assert got[row].isfinite().nonzero().flatten().tolist() == [row // 2, 4]


def test_window_prefixes_and_groups():
    tokens = torch.tensor([[1, 2, 0], [3, 0, 0]])
    context = window_prefixes(tokens, torch.tensor([2, 1]), torch.tensor([[7, 8], [9, 10]]))
    assert context.tolist() == [[1, 2, 7, 8, 0], [3, 9, 10, 0, 0]]
    groups = groups_by_length(torch.tensor([4, 2, 4, 3]))
    assert [(length, rows.tolist()) for length, rows in groups] == [(2, [1]), (3, [3]), (4, [0, 2])]


def test_min_new_tokens_holds_in_every_row_of_a_ragged_sampled_batch():
    """Sampling with EOS and min_new_tokens: no row may end before min_new_tokens (vanilla: none does).
    With the prefix padded to the longest row, rows that are behind saw a longer prefix and ended early."""
    model = tiny_llama(12)
    prompt = torch.tensor([[3, 4, 5]]).expand(64, -1)
    vanilla = model.generate(prompt, do_sample=True, max_new_tokens=20)
    eos = int(torch.mode(vanilla[:, 3:].flatten()).values)  # the model's most frequent token
    torch.manual_seed(1)
    out = model.generate(prompt, do_sample=True, max_new_tokens=20, eos_token_id=eos, pad_token_id=0,
                         min_new_tokens=12, custom_generate="mc-sjd", jacobi_window=4, return_dict_in_generate=True)
    generated = out.sequences[:, 3:]
    first_eos = torch.where((generated == eos).any(1), (generated == eos).int().argmax(1), generated.shape[1])
    assert (first_eos >= 11).all()  # index 11 is the 12th new token
    assert (out.stats.num_new_tokens < 20).sum() > 10  # EOS does end many rows (the check has power)
