"""SJD-PV phrase verification: matching, joint acceptance, fallback and chaining against a plain sequential
reference walk, plus hand-built windows with known outcomes and the bad inputs."""

import doctest
import math

import pytest
import torch

import hf_sjd
from hf_sjd import PhraseLibrary
from hf_sjd.jacobi.verify import phrase as phrase_verification
from hf_sjd.jacobi.distributions import residual_distribution
from hf_sjd.jacobi.verify import PhraseIndex, PhraseVerifier, SpeculativeVerifier
from toy import COND, no_forward, toy_model


def test_doctests():
    assert doctest.testmod(phrase_verification).failed == 0


def reference_walk(drafts, q, p, u, ju, phrases, tau, exact):
    """One row, sequentially, exactly as the module docstring describes. Returns (num_accepted, residual)."""
    size = len(drafts)
    accept = SpeculativeVerifier().acceptance_probs(drafts[None], q[None], p[None])[0]
    s = 0
    while s < size:
        best = None
        for index, phrase in enumerate(phrases):
            if s + len(phrase) > size:
                continue
            if all(p[s + k, v] >= tau and (not exact or v == drafts[s + k]) for k, v in enumerate(phrase)):
                if best is None or len(phrase) > len(phrases[best]):
                    best = index
        run = 1
        if best is not None:
            run = len(phrases[best])
            log_ratio = sum(math.log(max(float(p[s + k, t]), 1e-30)) - math.log(max(float(q[s + k, t]), 1e-30))
                            for k, t in enumerate(drafts[s:s + run].tolist()))
            if math.log(max(float(ju[s]), 1e-30)) < min(0.0, log_ratio):
                s += run
                continue
        for t in range(s, s + run):
            if not (u[t] <= accept[t] and accept[t] > 0):
                return t, residual_distribution(p[t], q[t])
        s += run
    return size, None


def random_case(seed, batch=6, size=7, vocab=5, num_phrases=12):
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand(batch, size, vocab, generator=generator).pow(3)
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(batch, size, vocab, generator=generator).pow(3)
    q = 0.5 * q / q.sum(-1, keepdim=True) + 0.5 * p  # drafts close to the target: long accepted runs
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=generator).view(batch, size)
    phrases = []
    for _ in range(num_phrases):
        length = int(torch.randint(2, 5, (1,), generator=generator))
        phrases.append(torch.randint(0, vocab, (length,), generator=generator).tolist())
    # phrases equal to drafted runs, so that exact matching (and chaining) happens in most rows
    for b in range(batch):
        for _ in range(2):
            length = int(torch.randint(2, 4, (1,), generator=generator))
            start = int(torch.randint(0, size - length + 1, (1,), generator=generator))
            phrases.append(drafts[b, start:start + length].tolist())
    u = torch.rand(batch, size, generator=generator)
    ju = torch.rand(batch, size, generator=generator)
    return drafts, q, p, u, ju, phrases


def index_of(phrases, vocab):
    width = max(map(len, phrases))
    table = torch.tensor([ph + [-1] * (width - len(ph)) for ph in phrases])
    return PhraseIndex(table, torch.tensor([len(ph) for ph in phrases]), vocab)


@pytest.mark.parametrize("match", ["exact", "neighbourhood"])
@pytest.mark.parametrize("seed", range(8))
def test_vectorised_walk_equals_sequential_reference(seed, match):
    drafts, q, p, u, ju, phrases = random_case(seed)
    tau = 0.05
    verifier = PhraseVerifier(index_of(phrases, p.shape[-1]), SpeculativeVerifier(), tau=tau, match=match)
    result = verifier(drafts, q, p, u, joint_uniforms=ju)
    for b in range(drafts.shape[0]):
        expected, residual = reference_walk(drafts[b], q[b], p[b], u[b], ju[b], phrases, tau, match == "exact")
        assert int(result.num_accepted[b]) == expected, (b, seed)
        if residual is not None:
            assert torch.allclose(result.residual_probs[b], residual, atol=1e-6)


def test_without_matches_it_is_the_base_verifier():
    for seed in range(4):
        drafts, q, p, u, ju, _ = random_case(seed)
        verifier = PhraseVerifier(index_of([[9, 9]], 10), SpeculativeVerifier(), tau=0.05)  # never matches
        pad = torch.zeros(*p.shape[:-1], 5)
        result = verifier(drafts, torch.cat([q, pad], -1), torch.cat([p, pad], -1), u, joint_uniforms=ju)
        base = SpeculativeVerifier()(drafts, torch.cat([q, pad], -1), torch.cat([p, pad], -1), u)
        assert torch.equal(result.num_accepted, base.num_accepted)
        assert torch.allclose(result.residual_probs, base.residual_probs)


def hand_window():
    """Window of 4 drafts [1, 2, 1, 2]; p/q per draft: 0.5, 2.0, 0.5, 2.0 (vocab 3)."""
    drafts = torch.tensor([[1, 2, 1, 2]])
    p = torch.tensor([[[0.5, 0.2, 0.3], [0.2, 0.2, 0.6], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]]])
    q = torch.tensor([[[0.2, 0.4, 0.4], [0.4, 0.3, 0.3], [0.2, 0.4, 0.4], [0.4, 0.3, 0.3]]])
    return drafts, q, p


def test_joint_acceptance_and_chaining_on_a_hand_built_window():
    drafts, q, p = hand_window()
    verifier = PhraseVerifier(index_of([[1, 2]], 3), SpeculativeVerifier(), tau=0.1)
    per_token_reject = torch.tensor([[0.9, 0.0, 0.9, 0.0]])  # alone, drafts 1 and 3 (ratio 0.5) are rejected
    # the phrase [1, 2] matches at 0 and 2; joint ratio 0.5 * 2 = 1: always accepted -> chained through the window
    result = verifier(drafts, q, p, per_token_reject, joint_uniforms=torch.full((1, 4), 0.99))
    assert result.num_accepted.tolist() == [4]
    assert SpeculativeVerifier()(drafts, q, p, per_token_reject).num_accepted.tolist() == [0]


def test_failed_joint_test_falls_back_to_tokens_then_matches_again():
    drafts, q, p = hand_window()
    q2 = q.clone()
    q2[0, 1] = torch.tensor([0.1, 0.1, 0.8])  # second draft now p/q = 0.75: joint ratio of run 1 is 0.375
    verifier = PhraseVerifier(index_of([[1, 2]], 3), SpeculativeVerifier(), tau=0.1)
    tokens_pass = torch.tensor([[0.4, 0.7, 0.9, 0.9]])  # per token: 0.4 <= 0.5 and 0.7 <= 0.75 pass; 0.9 fails
    joint = torch.tensor([[0.5, 0.0, 0.99, 0.0]])  # joint run 1 fails (0.5 > 0.375); joint run 2 passes (ratio 1)
    result = verifier(drafts, q2, p, tokens_pass, joint_uniforms=joint)
    assert result.num_accepted.tolist() == [4]
    tokens_fail = torch.tensor([[0.4, 0.8, 0.0, 0.0]])  # fallback rejects the second draft
    result = verifier(drafts, q2, p, tokens_fail, joint_uniforms=joint)
    assert result.num_accepted.tolist() == [1]
    assert torch.allclose(result.residual_probs[0], residual_distribution(p[0, 1], q2[0, 1]))


def test_longest_match_wins_and_matching_needs_the_neighbourhood():
    drafts, q, p = hand_window()
    index = index_of([[1, 2], [1, 2, 1]], 3)
    length, phrase = index.longest_matches(drafts, p, tau=0.1, exact=True)
    assert length.tolist() == [[3, 0, 2, 0]] and phrase[0, 0] == 1
    length, _ = index.longest_matches(drafts, p, tau=0.25, exact=True)  # p(draft 1) = 0.2 < tau: no match
    assert length.tolist() == [[0, 0, 0, 0]]


def test_a_neighbourhood_match_commits_the_drafts():
    """Phrase [1, 0, 2] matches the drafts [1, 2, 0] by neighbourhood (p >= tau at each of its tokens): the drafts
    under it are verified jointly, and what is committed is the drafts, never the phrase's tokens."""
    drafts, q, p = hand_window()
    verifier = PhraseVerifier(index_of([[1, 0, 2]], 3), SpeculativeVerifier(), tau=0.1, match="neighbourhood")
    result = verifier(drafts, q, p, torch.ones(1, 4), joint_uniforms=torch.full((1, 4), 1e-6))
    assert int(result.num_accepted[0]) >= 3  # the joint test passed: three drafts at once, per-token all failed
    exact = PhraseVerifier(index_of([[1, 0, 2]], 3), SpeculativeVerifier(), tau=0.1)
    assert exact(drafts, q, p, torch.ones(1, 4), joint_uniforms=torch.full((1, 4), 1e-6)).num_accepted.tolist() == [0]


def test_a_neighbourhood_run_never_commits_a_draft_the_processors_exclude():
    """Neighbourhood matching reads no draft's p; the run's joint ratio does, and a draft with p = 0 makes it 0
    (however far the run's other drafts outweigh it: 8 certain drafts of a 20000-token uniform q here)."""
    vocab, size = 20000, 9
    index = PhraseIndex(torch.arange(size)[None], torch.tensor([size]), vocab_size=vocab)  # one phrase: 0 .. 8
    p = torch.zeros(1, size, vocab)
    p[0, torch.arange(size), torch.arange(size)] = 1.0  # the target: token k at slot k
    q = torch.full((1, size, vocab), 1.0 / vocab)
    drafts = torch.arange(size)[None].clone()
    drafts[0, 4] = 12345  # p = 0 there
    for match in ("exact", "neighbourhood"):
        verifier = PhraseVerifier(index, SpeculativeVerifier(), tau=0.01, match=match)
        result = verifier(drafts, q, p, torch.full((1, size), 0.5), joint_uniforms=torch.full((1, size), 0.5))
        assert int(result.num_accepted[0]) == 4, match  # the drafts before the excluded one, token by token


# -- through generate() ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_library():
    return PhraseLibrary.from_token_sequences(torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1]] * 4), num_merges=4,
                                              codebook_size=4, fingerprint="toy")


@pytest.mark.device
def test_sjd_pv_runs_through_generate_with_a_library_object(toy_library):
    model = toy_model()
    torch.manual_seed(0)
    out = model.generate(torch.full((4, 1), COND), do_sample=True, top_k=3, max_new_tokens=9, custom_generate="sjd-pv",
                         phrase_library=toy_library, draft_token_ids=[0, 1, 2, 3], jacobi_window=4,
                         return_dict_in_generate=True)
    assert out.sequences.shape == (4, 10) and out.stats.num_new_tokens.tolist() == [9] * 4


@pytest.mark.parametrize("kwargs, match", [
    ({"pv_tau": 0.0}, r"pv_tau must be a finite number > 0.0 and < 1.0, got 0.0"),
    ({"pv_tau": 1.0}, r"pv_tau must be a finite number > 0.0 and < 1.0, got 1.0"),
    ({"pv_tau": float("nan")}, r"pv_tau must be a finite number > 0.0 and < 1.0, got nan"),
    ({"pv_tau": "0.1"}, r"pv_tau must be a finite number"),
    ({"pv_ignore_fingerprint": "no"}, r"pv_ignore_fingerprint must be True or False, got 'no'"),
    ({"pv_match": "fuzzy"}, "pv_match='fuzzy' is not supported; allowed values: 'exact', 'neighbourhood'"),
    ({"pv_base_verifier": "nope"}, "pv_base_verifier='nope' is not supported; allowed values: 'speculative'"),
    ({"pv_base_verifier": "block"}, "pv_base_verifier='block' decides the window as a whole"),
    ({"phrase_library": None}, "phrase verification needs phrase_library="),
    ({"phrase_library": 3}, "phrase_library must be a PhraseLibrary, a folder or a Hub repo id"),
])
def test_bad_pv_input_fails_before_any_forward(toy_library, kwargs, match):
    model = toy_model()
    kwargs = {"phrase_library": toy_library, **kwargs}
    with no_forward(model), pytest.raises((ValueError, TypeError), match=match):
        model.generate(torch.full((1, 1), COND), do_sample=True, max_new_tokens=3, custom_generate="sjd-pv", **kwargs)


def test_fingerprint_mismatch_and_corrupt_library(tmp_path, toy_library):
    from hf_sjd.reference import load

    ref = load()
    hf_sjd.enable(ref.model)
    prompt = ref.prompt_ids(["coffee"])
    with pytest.raises(ValueError, match="fingerprint 'toy'.*ignore_fingerprint"):
        ref.model.generate(prompt, do_sample=True, custom_generate="sjd-pv",
                           phrase_library=toy_library)
    out = ref.model.generate(prompt, do_sample=True, custom_generate="sjd-pv",
                             phrase_library=toy_library, pv_ignore_fingerprint=True)
    assert out.shape == (1, prompt.shape[1] + 256)  # the layout fills in one image
    toy_library.save_pretrained(tmp_path / "lib")
    (tmp_path / "lib" / "phrases.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="phrases.safetensors"):
        ref.model.generate(prompt, do_sample=True, custom_generate="sjd-pv",
                           phrase_library=str(tmp_path / "lib"), pv_ignore_fingerprint=True)


def test_a_text_models_codes_are_the_callers_draft_token_ids_in_their_order(toy_library):
    """Code c is ``draft_token_ids[c]`` as given, as a latent_embeddings row is (LANTERN, GSD); repeated ids are
    refused, as they are there."""
    import types

    from hf_sjd.jacobi.config import SJDConfig
    from hf_sjd.jacobi.verify import PhraseOptions

    adapter = types.SimpleNamespace(draft_token_ids=None, vocab_size=10, tokenizer_fingerprint="toy")
    given = [7, 3, 5, 9]
    verifier = PhraseVerifier.from_config(SJDConfig(draft_token_ids=given), adapter, torch.tensor(given),
                                          PhraseOptions(library=toy_library), SpeculativeVerifier())
    assert torch.equal(verifier.index.tokens, torch.tensor(given)[toy_library.codes])
    with pytest.raises(ValueError, match="draft_token_ids has repeated ids, so phrase codes cannot be matched"):
        PhraseVerifier.from_config(SJDConfig(draft_token_ids=[7, 3, 7, 9]), adapter, torch.tensor([3, 7, 9]),
                                   PhraseOptions(library=toy_library), SpeculativeVerifier())


# -- caches --------------------------------------------------------------------------------------------------
def test_index_cache_keys_on_the_whole_draft_id_map(toy_library):
    """Two maps with the same count and endpoints but different middles must not share an index."""
    library = PhraseLibrary(toy_library.codes.clone(), toy_library.lengths.clone(), toy_library.counts.clone())
    straight = PhraseIndex.from_library(library, torch.tensor([10, 11, 12, 13]), 20)
    swapped = PhraseIndex.from_library(library, torch.tensor([10, 12, 11, 13]), 20)
    assert not torch.equal(straight.gather(torch.arange(len(library)), 9), swapped.gather(torch.arange(len(library)), 9))
    expected = PhraseIndex(torch.tensor([10, 12, 11, 13])[library.codes], library.lengths, 20)
    assert torch.equal(swapped.tokens, expected.tokens)
    assert PhraseIndex.from_library(library, torch.tensor([10, 11, 12, 13]), 20) is straight  # still cached


def test_library_rebuilt_in_place_is_reloaded_and_rechecked(tmp_path):
    folder = tmp_path / "lib"
    old = PhraseLibrary.from_token_sequences(torch.tensor([[0, 1, 2, 0, 1, 2]] * 3), num_merges=2, codebook_size=4,
                                             fingerprint="old")
    new = PhraseLibrary.from_token_sequences(torch.tensor([[3, 2, 3, 2, 3, 2]] * 3), num_merges=2, codebook_size=4,
                                             fingerprint="new")
    old.save_pretrained(folder)
    assert hf_sjd.phrases._load_library(str(folder), "old", False).phrase_list() == old.phrase_list()
    new.save_pretrained(folder)  # rebuilt in place, same path
    with pytest.raises(ValueError, match="fingerprint 'new'"):  # the new files are checked, not the cached old ones
        hf_sjd.phrases._load_library(str(folder), "old", False)
    assert hf_sjd.phrases._load_library(str(folder), "new", False).phrase_list() == new.phrase_list()
    assert hf_sjd.phrases._load_library(str(folder), "new", False) is hf_sjd.phrases._load_library(
        str(folder), None, False)  # unchanged files: served from the cache, checked again per call


def test_missing_library_error_points_to_the_cli():
    class Adapter:
        default_phrase_library, family, tokenizer_fingerprint = None, "toy", None

    with pytest.raises(ValueError, match="hf-sjd build-phrases --model"):
        phrase_verification.resolve_library(None, Adapter())


def test_the_verifier_interface_is_what_phrase_verification_calls(toy_library, monkeypatch):
    """A verifier states acceptance_probs (+ optionally residual_at); __call__ is the base class's walk. One that
    only overrides __call__ still runs on its own, but is refused as pv_base_verifier before any forward."""
    from hf_sjd import VERIFIERS, SpeculativeVerifier, Verifier

    class CallOnly(Verifier):
        def __call__(self, drafts, draft_probs, target_probs, uniforms):
            return SpeculativeVerifier()(drafts, draft_probs, target_probs, uniforms)

    class AcceptanceOnly(Verifier):  # exact speculative acceptance, the base class's residual and walk
        acceptance_probs = SpeculativeVerifier.acceptance_probs

    monkeypatch.setitem(VERIFIERS, "call-only", CallOnly)
    monkeypatch.setitem(VERIFIERS, "acceptance-only", AcceptanceOnly)
    model = toy_model()
    prompt, common = torch.full((2, 1), COND), dict(do_sample=True, top_k=3, max_new_tokens=6, jacobi_window=3,
                                                    draft_token_ids=[0, 1, 2, 3])
    assert model.generate(prompt, custom_generate="sjd", verifier="call-only", **common).shape == (2, 7)
    with pytest.raises(ValueError, match=r"pv_base_verifier='call-only' decides the window as a whole \(it implements "
                                         r"only __call__.*allowed values: 'speculative', 'lantern', 'gsd', "
                                         r"'acceptance-only'"):
        model.generate(prompt, custom_generate="sjd-pv", phrase_library=toy_library, pv_base_verifier="call-only",
                       **common)
    torch.manual_seed(5)
    expected = model.generate(prompt, custom_generate="sjd-pv", phrase_library=toy_library, **common)
    torch.manual_seed(5)
    got = model.generate(prompt, custom_generate="sjd-pv", phrase_library=toy_library,
                         pv_base_verifier="acceptance-only", **common)
    assert torch.equal(got, expected)
    with pytest.raises(NotImplementedError, match="Verifier must implement acceptance_probs"):
        Verifier().acceptance_probs(None, None, None)


def test_exact_matching_by_hash_equals_a_brute_force_search():
    """Exact matching runs in fixed shapes (hash lookup + token check): it must find exactly the longest library
    phrase equal to the drafts at each offset whose every token has p >= tau, as a search over all phrases does."""
    generator = torch.Generator().manual_seed(0)

    def randint(low, high, shape=()):
        return torch.randint(low, high, shape, generator=generator)

    for _ in range(60):
        vocab = int(randint(2, 8))
        phrases = sorted({tuple(randint(0, vocab, (int(randint(2, 7)),)).tolist()) for _ in range(int(randint(1, 25)))})
        index = PhraseIndex(torch.tensor([t for phrase in phrases for t in phrase]),
                            torch.tensor([len(phrase) for phrase in phrases]), vocab)
        batch, size = int(randint(1, 4)), int(randint(1, 9))
        drafts = randint(0, vocab, (batch, size))
        p = torch.rand(batch, size, vocab, generator=generator)
        p = p / p.sum(-1, keepdim=True)
        tau = 0.3 * float(torch.rand((), generator=generator))
        length, phrase = index.longest_matches(drafts, p, tau, exact=True)
        for r in range(batch):
            for start in range(size):
                best, best_phrase = 0, 0
                for k, candidate in enumerate(phrases):
                    if tuple(drafts[r, start: start + len(candidate)].tolist()) != candidate:
                        continue  # (a run cut off by the window end never equals the phrase)
                    good = all(p[r, start + i, t] >= tau for i, t in enumerate(candidate))
                    if good and len(candidate) > best:
                        best, best_phrase = len(candidate), k
                assert int(length[r, start]) == best
                if best:
                    assert int(phrase[r, start]) == best_phrase


@pytest.mark.parametrize("exact", [True, False])
def test_a_token_at_exactly_tau_is_in_the_neighbourhood(exact):
    """p >= tau (the module docstring): a run whose tokens all have p == tau matches."""
    from hf_sjd.jacobi.verify import PhraseIndex
    index = PhraseIndex(torch.tensor([[1, 2]]), torch.tensor([2]), vocab_size=3)
    p = torch.tensor([[[0.25, 0.5, 0.25], [0.25, 0.25, 0.5]]])
    length, phrase = index.longest_matches(torch.tensor([[1, 2]]), p, 0.5, exact=exact)
    assert (int(length[0, 0]), int(phrase[0, 0])) == (2, 0)


def test_neighbourhood_ties_go_to_the_earlier_merge():
    """Two equally long phrases in the tau-neighbourhood: the earlier one (lower id) is reported."""
    from hf_sjd.jacobi.verify import PhraseIndex
    index = PhraseIndex(torch.tensor([[1, 2], [1, 0], [2, 2]]), torch.tensor([2, 2, 2]), vocab_size=3)
    p = torch.tensor([[[0.1, 0.8, 0.1], [0.45, 0.1, 0.45]]])
    length, phrase = index.longest_matches(torch.tensor([[1, 2]]), p, 0.2, exact=False)
    assert (int(length[0, 0]), int(phrase[0, 0])) == (2, 0)
