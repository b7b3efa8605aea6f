"""The architecture matrix: every causal-LM class of transformers, token-identical to its own greedy ``generate``
or refused before any forward with the reason.

Each configuration of :mod:`zoo` is built tiny and decoded greedily by transformers (the reference) and by the
Jacobi strategies on a left-padded batch of 3 rows of different lengths:

* ``plain``: nothing constrains the tokens;
* ``ragged``: a ``prefix_allowed_tokens_fn`` forces most positions and leaves a different set free in each row,
  so rows accept different numbers of drafts per forward and the per-row rollback really runs, and forces an EOS
  into two rows at different steps, so rows leave the batch at different times.

Checks are named ``<path>:<strategy>:<window>[+<siblings>]:<batch>`` (window ``auto``: the strategy's own
knobs, none passed); ``path`` is ``enabled``
(``hf_sjd.enable``, then ``custom_generate="<strategy>"``) or ``recipe`` (the Hub recipe from this checkout's
``custom_generate/`` folder, ``trust_remote_code=True, sjd_method=...``, on a model that was never enabled);
``+m`` sets ``jacobi_siblings=m`` (the tree forward, a 4D mask). A configuration ends in exactly one
:class:`Outcome` status:

* ``identical``: every check's tokens equal the reference's, but a check with siblings may instead be refused
  before any forward with a reason about siblings (``set jacobi_siblings=0``), which the table states;
* ``refused``: every check raised :class:`hf_sjd.adapters.UnsupportedModelError` before any forward of the call
  (the forward-cost calibration's included; the layout probe's few tokens, once per model, are not the
  call's), with one reason for all; for a class with a ``generate`` of its own, the recipe path never reaches
  hf_sjd (transformers' error that its generate takes no ``custom_generate``, before any forward, counts);
* ``failed``: anything else (a crash, a token that differs, a refusal after a forward, checks that disagree).

``python tests/architectures/matrix.py --full --markdown docs/models.md`` regenerates ``docs/models.md`` (run as
a file: an installed package named ``tests`` would shadow ``python -m tests...``); ``--only gpt_neo,bloom`` runs a
few model types, without ``--full`` only :data:`DEFAULT_CHECKS`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch

if __package__ in (None, ""):  # run as a file: make ``architectures`` importable like under pytest
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from architectures import zoo  # type: ignore[no-redef]
else:
    from . import zoo

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_NEW_TOKENS = 24
PROMPT_LENGTHS = (5, 3, 4)  # left-padded to 5
EOS_STEP = {0: 6, 1: 11}  # the ragged check forces EOS here (row 2 runs to the end)
SEEDS = (0, 1, 2, 3)  # weights tried in turn until the reference has no near-tie (build_with_margins)
MIN_MARGIN = 1e-3

#: the checks the default test runs (every configuration: both paths, both strategies, both batches, siblings)
DEFAULT_CHECKS = ("enabled:sjd:4:plain", "recipe:mc-sjd:8:ragged", "enabled:mc-sjd:4+2:ragged")
#: the full sweep (``slow``): every path, strategy, window and batch, siblings, and the strategies' own "auto"
FULL_CHECKS = tuple(f"{path}:{strategy}:{window}:{batch}" for path in ("enabled", "recipe")
                    for strategy, windows in (("sjd", ("4", "8", "auto")), ("mc-sjd", ("4", "8", "4+2", "auto")))
                    for window in windows for batch in ("plain", "ragged"))
SIBLINGS_REFUSED = "siblings refused"  # a check with siblings that ended in a refusal about siblings


@dataclasses.dataclass
class Outcome:
    entry: zoo.Entry
    status: str  # "identical" | "refused" | "failed"
    reason: str = ""  # the refusal message, or what failed
    checks: dict[str, str] = dataclasses.field(default_factory=dict)  # check -> what it ended in
    siblings_refused: str = ""  # the kind of a refusal about siblings (checks with siblings; "" if none)
    margin: float | None = None  # the smallest top-2 logit margin along the reference's greedy path
    seconds: float = 0.0


def prompt_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """[3, 5] left-padded prompts of :data:`PROMPT_LENGTHS` tokens below ``zoo.SPECIAL_LOW``, and their mask."""
    width = max(PROMPT_LENGTHS)
    generator = torch.Generator().manual_seed(1)  # the CPU's: the same prompts on every test device
    tokens = torch.randint(3, zoo.SPECIAL_LOW, (len(PROMPT_LENGTHS), width), generator=generator, device="cpu")
    lengths = torch.tensor(PROMPT_LENGTHS, device="cpu")
    mask = (torch.arange(width, device="cpu")[None] >= width - lengths[:, None]).long()
    device = torch.get_default_device()  # tests/conftest.py: HF_SJD_TEST_DEVICE
    return (tokens * mask + zoo.PAD * (1 - mask)).to(device), mask.to(device)


class Forcing:
    """``prefix_allowed_tokens_fn`` of the ragged check: step ``s`` of row ``r`` is free (any ordinary token) when
    ``s % (2 + r) == 0``, else forced to a token that depends on (r, s); EOS is forced at :data:`EOS_STEP`."""

    free_tokens = list(range(3, zoo.SPECIAL_LOW))

    def __init__(self, prompt_width: int, eos: int) -> None:
        self.prompt_width, self.eos = prompt_width, eos

    def __call__(self, row: int, input_ids: torch.Tensor) -> list[int]:
        step = input_ids.shape[-1] - self.prompt_width
        if EOS_STEP.get(row) == step:
            return [self.eos]
        if step % (2 + row) == 0:
            return self.free_tokens
        return [3 + (7 * step + 31 * row) % (zoo.SPECIAL_LOW - 3)]


def generate_kwargs(batch: str, prompt: torch.Tensor, mask: torch.Tensor) -> dict:
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": MAX_NEW_TOKENS,
              "pad_token_id": zoo.PAD}
    if batch == "ragged":
        kwargs.update(eos_token_id=zoo.EOS, prefix_allowed_tokens_fn=Forcing(prompt.shape[1], zoo.EOS))
    return kwargs


@contextlib.contextmanager
def counting_forwards(model: torch.nn.Module) -> Iterator[list]:
    """Counts the model's decoding forwards inside the block (``len`` of the yielded list); the forwards of
    ``hf_sjd.adapters.support.probe`` (a few tokens, once per model, which decide the cache layout) are not."""
    calls: list = []
    handle = model.register_forward_pre_hook(
        lambda module, *_: None if module.__dict__.get("_sjd_probing") else calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def reference(model, batch: str) -> tuple[torch.Tensor, float]:
    """transformers' own greedy tokens for ``batch`` and the smallest top-2 margin of the scores that chose them
    (after the processors: a forced position has no runner-up, so it does not count)."""
    prompt, mask = prompt_batch()
    out = model.generate(prompt, **generate_kwargs(batch, prompt, mask), return_dict_in_generate=True,
                         output_scores=True)
    running = torch.ones(len(prompt), dtype=torch.bool)  # rows that have not emitted EOS yet
    margins = []
    for step, scores in enumerate(out.scores):
        top = torch.topk(scores.float(), 2, dim=-1).values
        margins.append((top[:, 0] - top[:, 1]).nan_to_num(float("inf"))[running].min())
        running &= out.sequences[:, prompt.shape[1] + step] != zoo.EOS
    return out.sequences, float(torch.stack(margins).min())


def jacobi(model, check: str) -> torch.Tensor:
    """The check's tokens, decoded as a user's call is: with ``"auto"`` knobs (``mc-sjd``'s siblings, where a
    check does not set them) priced by timing on this machine, which the rest of the suite turns off."""
    path, strategy, window, batch = check.split(":")
    window, _, siblings = window.partition("+")
    prompt, mask = prompt_batch()
    kwargs = generate_kwargs(batch, prompt, mask)
    if window != "auto":
        kwargs["jacobi_window"] = int(window)
    if siblings:
        kwargs["jacobi_siblings"] = int(siblings)
    with mock.patch.dict(os.environ, {"HF_SJD_CALIBRATE": "1"}):
        if path == "recipe":
            return model.generate(prompt, custom_generate=str(REPO_ROOT), trust_remote_code=True,
                                  sjd_method=strategy, **kwargs)
        return model.generate(prompt, custom_generate=strategy, **kwargs)


def own_generate(model) -> bool:
    """Whether ``model``'s class replaces transformers' ``generate`` (so ``custom_generate`` never reaches it)."""
    from hf_sjd.adapters.support import _own_generate

    return _own_generate(model) is not None


def first_difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
    row, column = (got != expected).nonzero()[0].tolist()
    return f"row {row} differs from step {column - expected.shape[1] + MAX_NEW_TOKENS}"


def build_with_margins(entry: zoo.Entry, batches: set[str]) -> tuple[torch.nn.Module, dict, float]:
    """The model of the first seed (of :data:`SEEDS`) whose reference decoding has no top-2 margin below
    :data:`MIN_MARGIN` (a near-tie could flip on float rounding between a window forward and a one-token
    forward, which would say nothing about Jacobi decoding); its references and margin."""
    best = None
    for seed in SEEDS:
        model = zoo.build(entry, seed=seed)
        model.generation_config.eos_token_id = None  # the plain batch runs every row to the end
        with torch.no_grad():
            references = {batch: reference(model, batch) for batch in sorted(batches)}
        margin = min(m for _, m in references.values())
        if best is None or margin > best[2]:
            best = (model, references, margin)
        if margin >= MIN_MARGIN:
            break
    return best


def run(entry: zoo.Entry, checks: tuple[str, ...] = DEFAULT_CHECKS) -> Outcome:
    """Build ``entry`` and run ``checks`` (recipe checks first: they need a model that was never enabled)."""
    import hf_sjd
    from hf_sjd.adapters import UnsupportedModelError

    start = time.perf_counter()
    outcome = Outcome(entry, "failed")
    try:
        model, references, outcome.margin = build_with_margins(entry, {c.split(":")[3] for c in checks})
    except Exception as error:  # noqa: BLE001 - every failure is reported, with its kind
        frame = traceback.extract_tb(error.__traceback__)[-1]
        reference_error = f"{type(error).__name__}: {str(error)[:300]} ({Path(frame.filename).name}:{frame.lineno})"
        try:  # transformers' own generate fails: Jacobi decoding may still be refused before any forward
            model, references = zoo.build(entry), None
        except Exception as build_error:  # noqa: BLE001
            outcome.reason = f"not built: {type(build_error).__name__}: {build_error}"
            outcome.seconds = time.perf_counter() - start
            return outcome
    enabled = False
    refusals = set()
    for check in sorted(checks, key=lambda c: not c.startswith("recipe")):
        if check.startswith("enabled") and not enabled:
            try:
                hf_sjd.enable(model)
                enabled = True
            except UnsupportedModelError as error:
                outcome.checks[check] = "refused by enable"
                refusals.add(str(error))
                continue
        with counting_forwards(model) as forwards, torch.no_grad():
            try:
                got = jacobi(model, check)
            except Exception as error:  # noqa: BLE001 - every failure is reported, with its kind
                if "+" in check and not forwards and "set jacobi_siblings=0" in str(error):
                    outcome.checks[check] = SIBLINGS_REFUSED
                    outcome.siblings_refused = getattr(error, "reason", None) or str(error).split(";")[0]
                    continue
                if isinstance(error, UnsupportedModelError):
                    outcome.checks[check] = "refused" if not forwards else f"refused after {len(forwards)} forward(s)"
                    refusals.add(str(error))
                    continue
                if (check.startswith("recipe") and not forwards and own_generate(model)
                        and "custom_generate" in str(error)):
                    # the class's own generate() runs instead of transformers', which is what loads a recipe
                    outcome.checks[check] = "refused"
                    continue
                frame = traceback.extract_tb(error.__traceback__)[-1]
                outcome.checks[check] = (f"crashed: {type(error).__name__}: {str(error)[:300]} "
                                         f"({Path(frame.filename).name}:{frame.lineno})")
                continue
        if references is None:
            outcome.checks[check] = f"ran, but transformers' own generate failed: {reference_error}"
            continue
        expected = references[check.split(":")[3]][0]
        outcome.checks[check] = "identical" if torch.equal(got, expected) else first_difference(got, expected)
    ends = set(outcome.checks.values()) - {SIBLINGS_REFUSED}
    if ends == {"identical"}:
        outcome.status = "identical"
    elif ends <= {"refused", "refused by enable"} and len(refusals) == 1:  # one reason, whatever the path
        outcome.status, outcome.reason = "refused", refusals.pop()
    else:
        outcome.reason = "; ".join(f"{check}: {end}" for check, end in outcome.checks.items() if end != "identical")
        if refusals:
            outcome.reason += " | refusals: " + " / ".join(sorted(refusals))
    outcome.seconds = time.perf_counter() - start
    return outcome


def markdown(outcomes: list[Outcome], checks: tuple[str, ...]) -> str:
    """The table of ``docs/models.md``: one row per class (its configurations' outcomes), then the counts."""
    import transformers

    by_class: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_class.setdefault(outcome.entry.class_name, []).append(outcome)
    identical = sum(all(o.status == "identical" for o in group) for group in by_class.values())
    refused = sum(all(o.status == "refused" for o in group) for group in by_class.values())
    failed = sum(any(o.status == "failed" for o in group) for group in by_class.values())
    mixed = len(by_class) - identical - refused - failed
    lines = [
        "# Models: token-identical or refused",
        "",
        f"Every causal-LM class of transformers {transformers.__version__} (its own auto mapping, "
        f"`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`: {len(by_class)} classes, {len(outcomes)} configurations with the "
        f"variants), built tiny from its config class and decoded greedily on a left-padded batch of 3 rows, by "
        f"transformers' own `generate` and by Jacobi decoding: checks {', '.join(f'`{c}`' for c in checks)} "
        f"(path `enabled` = `hf_sjd.enable` then `custom_generate=<strategy>`, `recipe` = the Hub recipe on a "
        f"model never enabled; strategy; `jacobi_window` (`auto`: none passed), `+2`: with `jacobi_siblings=2`, a "
        f"tree forward through a 4D mask; batch `plain`, or `ragged`: most positions forced so rows accept "
        f"different numbers of drafts, and EOS forced into two rows at different steps). `\"auto\"` knobs are "
        f"priced by timing, as in a user's call.",
        "",
        f"**{identical}** classes are token-identical in every configuration, **{refused}** are refused before "
        f"any decoding forward, **{mixed}** are identical in some configurations and refused in others (the "
        f"variant says which), **{failed}** fail (a crash or a wrong token).",
        "",
        "A refusal is a `hf_sjd.adapters.UnsupportedModelError` whose message says why the model cannot be decoded "
        "exactly; a row with a variant in brackets is the class with that change of config: `window` (its "
        "attention windows shrunk to 8 tokens, which these sequences pass), `is_decoder` (an encoder-style model "
        "loaded as a decoder), `index_topk` (a sparse-attention indexer keeping 4 keys per query), `alibi`. "
        "\"identical; `jacobi_siblings` refused\": every check is identical but those with siblings, which are "
        "refused before any forward with the reason (`jacobi_siblings=\"auto\"` picks none there).",
        "",
        "Refused by a call's settings in any class (`tests/architectures/test_positions.py`): a rotary embedding "
        "that rescales with the positions (`rope_type` `dynamic` past `max_position_embeddings`, or `longrope` past "
        "`original_max_position_embeddings`, e.g. Phi-3's 128k checkpoints) when a call may cross that length (a "
        "window would switch earlier than one-token decoding; a longrope prompt already past it runs); and, in a "
        "class that decodes one prompt at a time (positions from the cache length), guidance with a "
        "`negative_prompt_ids` of another length or padding than the prompt; and inputs of the model's forward "
        "other than the token ids (a vision-language model's `pixel_values`, GPT-2's `token_type_ids`): the rows "
        "here are text-only calls.",
        "",
        "Regenerate with `python tests/architectures/matrix.py --full --markdown docs/models.md` (the test suite "
        "runs the same checks: `tests/architectures/`), on the newest transformers of the supported range: an "
        "older one has no rows of its own, only fewer classes.",
        "",
        "| class | configurations | outcome |",
        "| --- | --- | --- |",
    ]
    for class_name in sorted(by_class, key=str.lower):
        group = by_class[class_name]
        ends: dict[str, list[str]] = {}
        for o in group:
            if o.status == "refused":  # "<Class> cannot be used for Jacobi decoding (<reason>): <why>"
                kind, why = o.reason.split(" (", 1)[1].split("): ", 1)
                what = f"refused ({kind}): {why}"
            elif o.status == "identical":
                kind = o.siblings_refused.removeprefix("jacobi_siblings with ")
                what = f"identical; `jacobi_siblings` refused ({kind})" if kind else "identical"
            else:
                what = f"FAILED: {o.reason}"
            ends.setdefault(what, []).append(f"`{o.entry.id}`")
        cells = [f"{', '.join(ids)}: {what}" if len(ends) > 1 else what for what, ids in ends.items()]
        types = ", ".join(f"`{o.entry.id}`" for o in group)
        lines.append(f"| `{class_name}` | {types} | {'<br>'.join(c.replace('|', '/') for c in cells)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path, help="write the table here (e.g. docs/models.md)")
    parser.add_argument("--full", action="store_true", help="every check, not only the default ones")
    parser.add_argument("--only", help="comma-separated model types (or ids such as 'gpt_neo[local]')")
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    only = set(args.only.split(",")) if args.only else None
    checks = FULL_CHECKS if args.full else DEFAULT_CHECKS
    outcomes = []
    for entry in zoo.entries():
        if only and entry.model_type not in only and entry.id not in only:
            continue
        outcome = run(entry, checks)
        outcomes.append(outcome)
        margin = f"{outcome.margin:.3f}" if outcome.margin is not None else "-"
        said = outcome.reason or (f"jacobi_siblings refused ({outcome.siblings_refused})" if outcome.siblings_refused
                                  else "")
        print(f"{entry.id:40s} {outcome.status:9s} {outcome.seconds:5.1f}s margin {margin}  {said[:300]}", flush=True)
    if args.markdown:
        from hf_sjd.files import atomic_write_text

        atomic_write_text(args.markdown, markdown(outcomes, checks))
    return 0 if all(o.status != "failed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
