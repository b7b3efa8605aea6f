"""``out.stats.commit_map``: per-token provenance derived from the commit log, and ``hf_sjd.viz``'s pictures of it.

The map agrees with the counters (counts by kind, tokens per forward, forwards per row), orders each row's tokens by
forward, places each phrase-verification run where a sequential walk puts it and on tokens that spell a library
phrase, changes no token (golden hashes), costs no host read per iteration, and is drawn through the token grid of
every image family (a layout without a grid is refused with a clear error).
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_sjd.viz as viz
from hf_sjd.jacobi.state import CommitLog, Ending
from hf_sjd.jacobi.stats import CommitMap, JacobiStats, TokenKind
from hf_sjd.jacobi.verify import PhraseIndex, PhraseVerifier, SpeculativeVerifier
from hf_sjd.jacobi.verify.phrase import resolve_library

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "adapters"))  # adapter_models (tiny families)

from adapter_models import JANUS_BOI, emu3_prompt, tiny_chameleon, tiny_emu3, tiny_janus  # noqa: E402
from test_golden_tokens import recorded, sequences_hash  # noqa: E402
from toy import COND, syncs_between_forwards, tiny_llama, toy_model  # noqa: E402

KINDS = {kind.name.lower(): int(kind) for kind in TokenKind}


# -- the derivation, on hand-made logs -------------------------------------------------------------------------
def expand_by_hand(entries: list[tuple[int, int, int, int, int]], batch: int) -> dict[int, list[tuple]]:
    """(forward, row, count, accepted, ending) commits -> per row, its tokens as (forward, kind, slot, sibling), by a
    plain loop over the definitions (CommitLog / CommitMap docstrings)."""
    tokens = {row: [] for row in range(batch)}
    for forward, row, count, accepted, ending in entries:
        for slot in range(count):
            if slot < accepted:
                sibling = slot == 0 and ending >= Ending.SIBLING
                kind, which = ("sibling", ending - Ending.SIBLING) if sibling else ("accepted", -1)
            else:
                kind, which = ("recovered" if ending == Ending.RECOVERED else "bonus"), -1
            tokens[row].append((forward, KINDS[kind], slot, which))
    return tokens


def test_map_expands_every_commit_in_row_and_forward_order():
    """Rows leave from anywhere in the batch (the row column keeps track), windows change size, EOS/max_new_tokens
    cut some commits short, siblings 0..2 rescue some first drafts."""
    generator = torch.Generator().manual_seed(0)
    batch, log, entries = 5, CommitLog(torch.device("cpu")), []
    rows = torch.arange(batch)
    for forward in range(40):
        if forward in (9, 17, 30):  # a row in the middle of the batch finishes
            rows = rows[torch.arange(len(rows)) != len(rows) // 2]
        window = [6, 3, 8][forward % 3]
        b = len(rows)
        accepted = torch.randint(0, window + 1, (b,), generator=generator)
        count = torch.minimum(accepted + 1, torch.randint(1, window + 2, (b,), generator=generator))
        sibling = (accepted >= 1) & (accepted < window) & (torch.rand(b, generator=generator) < 0.4)
        which = torch.randint(0, 3, (b,), generator=generator)
        ending = torch.where(sibling, Ending.SIBLING + which, (accepted == window).long())
        log.add((window, 0), count, accepted, ending, rows)
        entries += [(forward, *values) for values in zip(rows.tolist(), count.tolist(), accepted.tolist(),
                                                          ending.tolist())]
    commit = CommitMap.from_log(log)
    expected = expand_by_hand(entries, batch)
    for row in range(batch):
        length = len(expected[row])
        got = list(zip(commit.forward[row, :length].tolist(), commit.kind[row, :length].tolist(),
                       commit.slot[row, :length].tolist(), commit.sibling[row, :length].tolist()))
        assert got == expected[row], row
        assert (commit.kind[row, length:] == -1).all() and (commit.forward[row, length:] == -1).all()
    stats = JacobiStats.from_log(log)
    counts = commit.counts()
    assert counts["accepted"] + counts["sibling"] == stats.num_accepted
    assert (counts["recovered"], counts["bonus"], counts["sibling"]) == (stats.num_recovered, stats.num_bonus,
                                                                         stats.num_siblings_accepted)
    assert len(commit.phrase_runs) == 0 and (commit.phrase == -1).all()


def test_empty_log_gives_an_empty_map():
    commit = JacobiStats.from_log(CommitLog(torch.device("cpu"))).commit_map
    assert commit.forward.shape == (0, 0) and commit.phrase_runs.shape == (0, 4)
    assert commit.counts() == dict.fromkeys(CommitMap.KINDS, 0)


def random_window(generator, batch: int, size: int, vocab: int = 5):
    """Drafts close to the target (long accepted stretches) and a library holding runs of them (joint matches)."""
    p = torch.rand(batch, size, vocab, generator=generator).pow(3)
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(batch, size, vocab, generator=generator).pow(3)
    q = 0.5 * q / q.sum(-1, keepdim=True) + 0.5 * p
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=generator).view(batch, size)
    return drafts, q, p, torch.rand(batch, size, generator=generator), torch.rand(batch, size, generator=generator)


def sequential_runs(verifier: PhraseVerifier, drafts, q, p, u, ju) -> list[tuple[list, int]]:
    """Per row, the jointly accepted runs (slot, length, phrase id) and the drafts accepted, walking the window
    one state at a time as the module docstring of hf_sjd.jacobi.verify.phrase describes (the matches, joint
    ratios and per-token decisions from the verifier's own parts)."""
    length, phrase = verifier.index.longest_matches(drafts, p, verifier.tau, verifier.exact)
    log_ratio = verifier.joint_log_ratio(drafts, q, p, length)
    accept = SpeculativeVerifier().acceptance_probs(drafts, q, p)
    rows = []
    for b in range(drafts.shape[0]):
        runs, s, size = [], 0, drafts.shape[1]
        while s < size:
            m = int(length[b, s])
            if m >= 2 and math.log(max(float(ju[b, s]), 1e-30)) < min(0.0, float(log_ratio[b, s])):
                runs.append((s, m, int(phrase[b, s])))
                s += m
                continue
            stop = next((t for t in range(s, s + max(m, 1)) if not (u[b, t] <= accept[b, t] and accept[b, t] > 0)),
                        None)
            if stop is not None:
                s = stop
                break
            s += max(m, 1)
        rows.append((runs, s))
    return rows


@pytest.mark.parametrize("match", ["exact", "neighbourhood"])
def test_phrase_runs_are_where_a_sequential_walk_accepts_them(match):
    """Windows of 7, 4 and 9 drafts in a row, 6 rows, 12 random seeds each: every row's runs in the map are the
    sequential walk's, at its token offsets (each commit: the accepted drafts plus one token), listed by row, then
    first token."""
    generator = torch.Generator().manual_seed(1 if match == "exact" else 2)
    batch, vocab, found = 6, 5, 0
    for _ in range(12):
        log, expected, offset = CommitLog(torch.device("cpu")), [], torch.zeros(batch, dtype=torch.long)
        for size in (7, 4, 9):
            drafts, q, p, u, ju = random_window(generator, batch, size, vocab)
            phrases = [drafts[b, s:s + 2 + (b % 2)].tolist() for b in range(batch) for s in (0, 2) if s + 3 <= size]
            phrases += [torch.randint(0, vocab, (3,), generator=generator).tolist() for _ in range(4)]
            width = max(map(len, phrases))
            index = PhraseIndex(torch.tensor([ph + [-1] * (width - len(ph)) for ph in phrases]),
                                torch.tensor([len(ph) for ph in phrases]), vocab)
            verifier = PhraseVerifier(index, SpeculativeVerifier(), tau=0.05, match=match)
            result = verifier(drafts, q, p, u, joint_uniforms=ju)
            walked = sequential_runs(verifier, drafts, q, p, u, ju)
            assert result.num_accepted.tolist() == [accepted for _, accepted in walked]
            # the library is per window here, so the map's phrase ids are checked against this window's ids
            for b, (runs, _) in enumerate(walked):
                expected += [(b, int(offset[b]) + s, m, ph) for s, m, ph in runs]
            count = result.num_accepted + 1
            log.add((size, 0), count, result.num_accepted, result.num_accepted == size, runs=result.runs)
            offset += count
        commit = CommitMap.from_log(log)
        assert list(map(tuple, commit.phrase_runs.tolist())) == sorted(expected)  # by row, then first token
        in_runs = sum(m for _, _, m, _ in expected)
        assert int((commit.kind == TokenKind.PHRASE).sum()) == in_runs
        found += len(expected)
    assert found > 10  # joint acceptance happened often enough to test something


# -- on the reference model -----------------------------------------------------------------------------------
def check_consistent(out, library_tokens: list[list[int]] | None = None, siblings: int = 0, cut: bool = False
                     ) -> CommitMap:
    """Everything the map must agree with: the counters, forward order, slots, siblings, phrase runs. ``cut``: rows
    were cut back to where the batch ended, so a row's last forwards may have committed nothing."""
    stats, commit = out.stats, out.stats.commit_map
    batch, new = commit.forward.shape
    assert batch == len(stats.num_new_tokens)
    counts = commit.counts()
    assert counts["accepted"] + counts["sibling"] + counts["phrase"] == stats.num_accepted
    assert counts["recovered"] == stats.num_recovered and counts["bonus"] == stats.num_bonus
    assert counts["sibling"] == stats.num_siblings_accepted
    histogram = torch.zeros_like(stats.tokens_per_forward)
    for row in range(batch):
        length = int(stats.num_new_tokens[row])
        forward, kind, slot = commit.forward[row, :length], commit.kind[row, :length], commit.slot[row, :length]
        assert (kind >= 0).all() and (commit.kind[row, length:] == -1).all()
        assert (forward.diff() >= 0).all(), "forward indices go back along the row"
        last = int(stats.row_forward_passes[row]) - 1
        assert int(forward[0]) == 0 and (int(forward[-1]) <= last if cut else int(forward[-1]) == last)
        per_forward = torch.bincount(forward, minlength=int(forward[-1]) + 1)
        assert (per_forward > 0).all()  # every forward the row took committed at least one token
        histogram += torch.bincount(per_forward, minlength=len(histogram))[: len(histogram)]
        # within one forward the slots are 0, 1, 2, ...: the commit is a prefix of its window
        starts = torch.cat([torch.ones(1, dtype=torch.bool), forward.diff() > 0])
        first_of_forward = torch.cummax(torch.where(starts, torch.arange(length), 0), 0).values
        assert torch.equal(slot, torch.arange(length) - first_of_forward)
        # a recovered or bonus token ends its forward's commit
        ends = torch.cat([forward.diff() > 0, torch.ones(1, dtype=torch.bool)])
        extra = (kind == TokenKind.RECOVERED) | (kind == TokenKind.BONUS)
        assert not (extra & ~ends).any()
        is_sibling = kind == TokenKind.SIBLING
        assert (slot[is_sibling] == 0).all()
        which = commit.sibling[row, :length]
        assert torch.equal(which >= 0, is_sibling) and (which < max(siblings, 1)).all()
    assert torch.equal(histogram[1:], stats.tokens_per_forward[1:])  # (row, forward) pairs by tokens committed
    if library_tokens is not None:
        prompt = out.sequences.shape[1] - new
        for row, first, length, phrase in commit.phrase_runs.tolist():
            committed = out.sequences[row, prompt + first: prompt + first + length].tolist()
            assert committed == library_tokens[phrase][:length], (row, first, phrase)
            assert (commit.kind[row, first:first + length] == TokenKind.PHRASE).all()
            assert (commit.phrase[row, first:first + length] == phrase).all()
        assert int(commit.phrase_runs[:, 2].sum()) == counts["phrase"]
    return commit


def reference_run(reference, method: str, batch: int = 2, guidance_scale: float = 1.0, sampled: bool = True, **knobs):
    prompts = sorted(reference.conditions)[:batch]
    sampling = dict(do_sample=True, top_k=100) if sampled else dict(do_sample=False)
    torch.manual_seed(7)
    return reference.model.generate(reference.prompt_ids(prompts), custom_generate=method, max_new_tokens=256,
                                    guidance_scale=guidance_scale, return_dict_in_generate=True, **sampling, **knobs)


CASES = {  # name -> (strategy, knobs): every verifier, siblings, CFG, greedy
    "sjd": ("sjd", {}),
    "mc-sjd+siblings2/cfg3": ("mc-sjd", {"jacobi_siblings": 2, "guidance_scale": 3.0}),
    "sjd-vp": ("sjd-vp", {}),
    "lantern": ("lantern", {"latent": True}),
    "gsd": ("gsd", {"latent": True}),
    "sjd/greedy": ("sjd", {"sampled": False}),
}


@pytest.mark.parametrize("case", CASES)
def test_map_agrees_with_the_counters_on_the_reference_model(reference, case):
    method, knobs = CASES[case]
    knobs = dict(knobs)
    if knobs.pop("latent", False):
        knobs["latent_embeddings"] = reference.latent_embeddings
    out = reference_run(reference, method, **knobs)
    commit = check_consistent(out, siblings=knobs.get("jacobi_siblings", 0))
    if "siblings" in case:
        assert commit.counts()["sibling"] > 0  # siblings were accepted, so their rows were checked
    assert commit.counts()["phrase"] == 0


@pytest.mark.parametrize("sampled", [True, False])
def test_phrase_cells_spell_library_phrases(reference, sampled):
    adapter = reference.model.sjd_adapter
    library = resolve_library(None, adapter)
    tokens = adapter.draft_token_ids.cpu()[library.codes]
    library_tokens = [tokens[s: s + n].tolist() for s, n in zip(library.starts.tolist(), library.lengths.tolist())]
    out = reference_run(reference, "sjd-pv", batch=3, sampled=sampled)
    commit = check_consistent(out, library_tokens)
    assert len(commit.phrase_runs) > 0  # runs were accepted jointly, so they were checked


def test_text_rows_that_stop_at_eos_end_their_maps_there():
    """A tiny text model stopping at EOS: rows of different lengths, commits cut at EOS, -1 after each row."""
    model = toy_model()
    torch.manual_seed(3)
    out = model.generate(torch.full((16, 1), COND), custom_generate="sjd", do_sample=True, top_k=3, max_new_tokens=12,
                         eos_token_id=3, jacobi_window=4, return_dict_in_generate=True)
    lengths = out.stats.num_new_tokens
    assert len(set(lengths.tolist())) > 1  # some rows stopped early
    check_consistent(out)


class StopAfter(StoppingCriteria):
    """Stops each row after the number of new tokens its prompt names (a row is judged on its own tokens)."""

    def __init__(self, prompts: torch.Tensor, stops: list[int]) -> None:
        self.prompt_length, self.stops = prompts.shape[1], dict(zip(map(tuple, prompts.tolist()), stops))

    def __call__(self, input_ids, scores, **kwargs):
        at = torch.tensor([self.stops[tuple(row[: self.prompt_length].tolist())] for row in input_ids])
        return input_ids.shape[1] - self.prompt_length >= at


@pytest.mark.parametrize("seed", range(3))
def test_rows_a_user_criterion_stops_apart_end_their_maps_where_the_batch_ended(reference, seed):
    """Without an EOS id a stopped row samples on and every row ends where the last one stopped (transformers'
    ``_sample``): rows that committed past that step are cut back, in the map as in the sequences, also where a row
    that was behind commits after the cut."""
    generator = torch.Generator().manual_seed(seed)
    prompts = reference.prompt_ids(sorted(reference.conditions)[:4])
    stops = torch.randint(1, 250, (4,), generator=generator).tolist()
    torch.manual_seed(seed)
    criteria = StoppingCriteriaList([StopAfter(prompts, stops)])
    out = reference.model.generate(prompts, custom_generate="sjd", jacobi_window=8, do_sample=True, top_k=100,
                                   eos_token_id=None, stopping_criteria=criteria, return_dict_in_generate=True)
    assert out.stats.num_new_tokens.tolist() == [max(stops)] * 4
    assert out.sequences.shape[1] == prompts.shape[1] + max(stops)
    check_consistent(out, cut=True)


@pytest.mark.parametrize("case", ["sjd-pv/b8/cfg3/sampled", "mc-sjd+siblings2/b8/cfg3/sampled"])
def test_same_tokens_as_before_the_map(reference, recorded_sampler, case):
    """The map is always derived: the runs that fill its new columns still give the recorded golden tokens."""
    assert sequences_hash(reference, case) in recorded(case)


def test_no_host_read_per_iteration_for_the_map():
    """The map's columns ride on the commit log's one op: phrase verification (which logs its walk) reads the
    device as often between forwards as plain verification, as before the map (2: the commit read and the
    sparse-support check)."""
    from benchmarks.loop_cost import dummy_subject

    phrase_knobs = dummy_subject(1024).strategy_kwargs["sjd-pv"]
    assert syncs_between_forwards(verifier="phrase", jacobi_sparse=True, **phrase_knobs) == \
        syncs_between_forwards(jacobi_sparse=True) == [2] * 6


# -- pictures ------------------------------------------------------------------------------------------------
def test_compare_draws_the_maps_of_three_methods(reference):
    outputs = {method: reference_run(reference, method, batch=1) for method in ("sjd", "mc-sjd", "sjd-pv")}
    figure = viz.compare(outputs, reference.model)
    assert len(figure.axes) == 3 * 3 + 3  # image, forward, kind per method, and a colour bar per forward heatmap
    for number, (method, out) in enumerate(outputs.items()):
        image_axis, forward_axis, kind_axis = panels(figure, number)
        maps = viz.cell_maps(out, reference.model)
        assert maps["forward"].shape == (16, 16)
        assert torch.equal(torch.as_tensor(forward_axis.images[0].get_array()), maps["forward"])
        assert torch.equal(torch.as_tensor(kind_axis.images[0].get_array()), maps["kind"])
        assert image_axis.images[0].get_array().shape[:2] == (64, 64)  # the decoded picture
        assert method in image_axis.get_title()
        # the row's raster order: cell (i, j) is generated token 16 i + j
        assert torch.equal(maps["forward"].flatten(), out.stats.commit_map.forward[0, :256])
    pv = viz.cell_maps(outputs["sjd-pv"], reference.model)
    assert bool((pv["run"] >= 0).any()) and torch.equal(pv["run"] >= 0, pv["kind"] == TokenKind.PHRASE)
    assert [len(panels(figure, number)[2].collections) for number in range(3)] == [0, 0, 1]  # phrase outlines
    # one colour scale for every forward heatmap
    assert len({panels(figure, number)[1].images[0].get_clim() for number in range(3)}) == 1


def panels(figure, row: int) -> list:
    """The subplot axes of one figure row, left to right (colour bars left out)."""
    axes = [axis for axis in figure.axes if axis.images and axis.get_subplotspec().rowspan.start == row]
    return sorted(axes, key=lambda axis: axis.get_subplotspec().colspan.start)


@pytest.fixture(scope="module")
def families():
    """(model, prompt, generate kwargs, draw kwargs) of each tiny real-family model."""
    chameleon = tiny_chameleon()
    return {"emu3": (tiny_emu3(), emu3_prompt(3, 4), {}, {}),
            "janus": (tiny_janus(), torch.tensor([[1, 7, 8, 9, JANUS_BOI]]), {}, {}),
            "lumina-mgpt": (chameleon, torch.tensor([[1, 30, 31, 32, *chameleon.sjd_adapter.image_header(64, 96)]]),
                            {}, {"image": False})}  # transformers ships no Chameleon image decoder


@pytest.mark.parametrize("family", ["emu3", "janus", "lumina-mgpt"])
def test_commit_map_on_every_image_family(families, family):
    model, prompt, kwargs, draw = families[family]
    torch.manual_seed(0)
    out = model.generate(prompt, custom_generate="sjd", do_sample=True, top_k=8, jacobi_window=4,
                         return_dict_in_generate=True, **kwargs)
    check_consistent(out)
    grid = viz.token_grid(model.sjd_adapter, out.sequences)
    maps = viz.cell_maps(out, model.sjd_adapter)
    assert maps["forward"].shape == (grid.height, grid.width)
    # cell (i, j) is generated token i * row_stride + j (end-of-line tokens are not cells)
    tokens = out.stats.commit_map.forward[0]
    for i, j in [(0, 0), (grid.height - 1, grid.width - 1), (1, grid.width - 1)]:
        assert int(maps["forward"][i, j]) == int(tokens[i * grid.row_stride + j])
    figure = viz.commit_map(out, model, **draw)
    assert len([axis for axis in figure.axes if axis.images]) == (2 if draw.get("image") is False else 3)


def test_chameleon_without_decoder_says_how_to_draw_anyway(families):
    model, prompt, _, _ = families["lumina-mgpt"]
    out = model.generate(prompt, custom_generate="sjd", do_sample=False, return_dict_in_generate=True)
    with pytest.raises(ValueError, match="image=False"):
        viz.commit_map(out, model)


def test_a_layout_without_a_grid_is_refused_clearly():
    model = tiny_llama(32)
    out = model.generate(torch.tensor([[3, 4]]), custom_generate="sjd", do_sample=False, max_new_tokens=10,
                         return_dict_in_generate=True)
    assert out.stats.commit_map.forward.shape == (1, 10)  # the map is there; only the picture needs a grid
    with pytest.raises(ValueError, match="'causal-lm' adapter .* has no token grid"):
        viz.commit_map(out, model)


def test_bad_arguments_are_refused_before_drawing(reference):
    out = reference_run(reference, "sjd", batch=1)
    with pytest.raises(ValueError, match=r"row must be an int in 0\.\.0"):
        viz.commit_map(out, reference.model, row=1)
    with pytest.raises(ValueError, match="return_dict_in_generate=True"):
        viz.commit_map(out.sequences, reference.model)
    with pytest.raises(ValueError, match="outputs is empty"):
        viz.compare({}, reference.model)
    with pytest.raises(ValueError, match="one image per output"):
        viz.compare([out, out], reference.model, images=[None])
    with pytest.raises(ValueError, match="adapter must be"):
        viz.commit_map(out, "llamagen")


def test_without_matplotlib_the_drawing_functions_say_what_to_install(reference, monkeypatch):
    out = reference_run(reference, "sjd", batch=1)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import matplotlib.figure now raises ImportError
    with pytest.raises(ImportError, match="pip install matplotlib"):
        viz.commit_map(out, reference.model)
    assert viz.cell_maps(out, reference.model)["forward"].shape == (16, 16)  # the data needs no matplotlib
