"""The loop's per-call state: derived per-row tensors follow every change, the token buffer keeps its
invariant, and the device-side statistics reduce to what per-iteration sums would give."""

import torch

from hf_sjd.jacobi.state import CommitLog, DecodeState
from hf_sjd.jacobi.stats import JacobiStats

PAD = 0


def expected_views(state: DecodeState) -> dict:
    """What every derived tensor must equal, recomputed from ``num_new`` and ``rows`` alone."""
    committed = state.num_new[state.rows]
    return {"committed": committed, "lengths": committed + state.prompt_length,
            "remaining": state.max_new - committed,
            "positions": committed[:, None] + torch.arange(5),
            "last_tokens": state.tokens[state.rows, committed + state.prompt_length - 1][:, None]}


def views(state: DecodeState) -> dict:
    return {"committed": state.committed(), "lengths": state.lengths(), "remaining": state.remaining(),
            "positions": state.positions(5), "last_tokens": state.last_tokens()}


def assert_consistent(state: DecodeState) -> None:
    for name, value in views(state).items():
        assert torch.equal(value, expected_views(state)[name]), name
    for row in range(state.tokens.shape[0]):  # prompt, committed tokens, then padding only
        end = state.prompt_length + int(state.num_new[row])
        assert (state.tokens[row, end:] == PAD).all()


def test_derived_tensors_follow_writes_row_selection_and_assignment():
    prompt = torch.tensor([[7, 8, 9], [4, 5, 6], [1, 2, 3], [9, 9, 9]])
    state = DecodeState.start(prompt, max_new=40, pad_id=PAD)
    written = [[] for _ in range(4)]
    assert_consistent(state)
    for step in range(12):
        rows = state.rows.tolist()
        block = torch.randint(1, 50, (len(rows), 6))
        count = torch.randint(1, 7, (len(rows),)).clamp(max=state.remaining())
        views(state)  # derived before the write: must not survive it
        state.write(block, count)
        for i, row in enumerate(rows):
            written[row] += block[i, : int(count[i])].tolist()
        assert_consistent(state)
        if step == 4:
            state.select_rows(torch.tensor([0, 2, 3]))  # row 1 leaves
            assert_consistent(state)
        if step == 8:
            state.rows = state.rows[1:]  # assigning rows directly drops the derived tensors too
            assert_consistent(state)
    assert state.rows.tolist() == [2, 3]
    for row in range(4):
        length = 3 + int(state.num_new[row])
        assert state.tokens[row, 3:length].tolist() == written[row]
        assert torch.equal(state.tokens[row, :3], prompt[row])


def test_write_grows_the_buffer_past_its_first_capacity():
    state = DecodeState.start(torch.tensor([[1, 2]]), max_new=3000, pad_id=PAD)
    capacity = state.tokens.shape[1]
    for _ in range(capacity // 8 + 2):
        state.write(torch.full((1, 9), 5), torch.tensor([8]))
    assert state.tokens.shape[1] > capacity
    assert int(state.num_new[0]) == 8 * (capacity // 8 + 2)
    assert (state.tokens[0, 2: 2 + int(state.num_new[0])] == 5).all()
    assert state.last_tokens().tolist() == [[5]]
    assert_consistent(state)


def test_commit_log_reduces_to_per_iteration_sums():
    """More iterations than the log's first capacity, with rows leaving the batch on the way, and some commits
    ended by a bonus after an accepted sibling (ending 2): the stats sum what each forward committed."""
    window, batch = 4, 5
    log = CommitLog(torch.device("cpu"))
    per_kind, histogram = torch.zeros(4, dtype=torch.long), torch.zeros(window + 2, dtype=torch.long)
    for step in range(600):
        rows = batch - step // 150  # 5, 4, 3, 2 rows
        num_accepted = torch.randint(0, window + 1, (rows,))
        count = torch.minimum(num_accepted + 1, torch.randint(1, window + 2, (rows,)))  # EOS / max_new cut some
        all_accepted = num_accepted == window
        sibling = (num_accepted >= 1) & ~all_accepted & (torch.rand(rows) < 0.5)  # the first accepted: a sibling
        log.add((window, 1), count, num_accepted, all_accepted.long() + 2 * sibling)
        extra, accepted = count > num_accepted, torch.minimum(num_accepted, count)
        bonus = all_accepted | sibling
        per_kind += torch.stack([accepted.sum(), (extra & ~bonus).sum(), (extra & bonus).sum(), sibling.sum()])
        histogram.scatter_add_(0, count, torch.ones_like(count))
    stats = JacobiStats.from_log(log)
    assert [stats.num_accepted, stats.num_recovered, stats.num_bonus, stats.num_siblings_accepted] == per_kind.tolist()
    assert stats.tokens_per_forward.tolist() == histogram.tolist()
    assert int((stats.tokens_per_forward * torch.arange(window + 2)).sum()) == int(per_kind[:3].sum())
    assert stats.forward_windows.tolist() == [0] * window + [600]


def test_commit_log_without_iterations_is_zero():
    stats = JacobiStats.from_log(CommitLog(torch.device("cpu")))
    assert [stats.num_accepted, stats.num_recovered, stats.num_bonus, stats.num_siblings_accepted] == [0] * 4
    assert stats.tokens_per_forward.tolist() == [0, 0]
