"""The README and docs/ say what the code does: the strategy table is the registry, the knob reference is the
knobs ``generate`` reads with their defaults and presets, every relative link lands on a file, the README's two
commands are the ones CI runs and the CLI parses, and the README's and docs' code examples run."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

import hf_sjd
from hf_sjd.jacobi.config import KNOB_PREFIXES, SJDConfig, known_knobs
from hf_sjd.jacobi.options import options_class
from hf_sjd.jacobi.registry import DRAFT_PRIORS, VERIFIERS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
KNOBS = DOCS / "knobs.md"
MAX_README_LINES = 250
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
BACKTICKED = re.compile(r"`([^`\n]+)`")
IDENTIFIER = re.compile(r"([a-z][a-z0-9_-]*)(?:=.*)?")  # a whole code span that is a name, or name=value
# misspelt knobs that docs/errors.md shows as bad input (tests/test_mixin.py refuses the same two)
MISSPELT_EXAMPLES = {"jacobi_windw", "vp_strenght"}


# -- parsing helpers ------------------------------------------------------------------------------------------------
def prose(text: str) -> str:
    """``text`` without its fenced code blocks (links and tables there are not the page's)."""
    return FENCE.sub("", text)


def code_blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == language]


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a markdown page (up to the next heading of level <= 2)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^#{{1,2}} |\Z)", text, re.S | re.M)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table of ``text`` (outside code blocks): ``(header cells, body rows of cells)``."""
    found, lines = [], prose(text).splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            header, rows, i = cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            found.append((header, rows))
        else:
            i += 1
    return found


def cells(line: str) -> list[str]:
    """A table row's cells; ``\\|`` inside a cell is a literal bar, not a separator."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def names_in(cell: str) -> list[str]:
    """The names a table's first cell presents: each of its code spans (``name`` or ``name=value``)."""
    return [match.group(1) for span in BACKTICKED.findall(cell) if (match := IDENTIFIER.fullmatch(span))]


def knob_rows(text: str) -> list[tuple[str, list[str]]]:
    """``(knob, row cells)`` of every table whose first column is headed ``knob``."""
    return [(name, row) for header, rows in tables(text) if header and header[0] == "knob"
            for row in rows for name in names_in(row[0])]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(page.read_text()).splitlines() if re.match(r"^#{1,6} ", line)}


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# -- the README -----------------------------------------------------------------------------------------------------
def test_readme_is_a_short_users_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


def test_the_readme_counts_models_as_models_md_does():
    """The README's model row is docs/models.md's summary line (the matrix regenerates that page, not the README)."""
    models = (DOCS / "models.md").read_text()
    classes = int(re.search(r"\((?:[^:]*): (\d+) classes", models).group(1))
    identical, refused, mixed = map(int, re.search(
        r"\*\*(\d+)\*\* classes are token-identical in every configuration, \*\*(\d+)\*\* are refused .*?"
        r"\*\*(\d+)\*\* are identical in some", models).groups())
    assert identical + refused + mixed == classes
    assert f"{identical + mixed} of transformers' {classes} causal-LM classes" in README.read_text()
    assert f"{identical} of them in every configuration" in README.read_text()


def test_the_readme_strategy_table_is_the_registry():
    (header, rows), = [t for t in tables(section(README.read_text(), "Strategies")) if t[0][0] == "strategy"]
    assert header[-1] == "lossless"
    names = [name for row in rows for name in names_in(row[0])]
    assert sorted(names) == sorted(hf_sjd.STRATEGIES), "the table must name exactly hf_sjd.STRATEGIES, once each"
    for row in rows:
        assert row[-1].split()[0] in ("yes", "no"), f"lossless column of {row[0]}: {row[-1]!r}"


def test_the_readme_knob_table_names_only_knobs():
    rows = knob_rows(section(README.read_text(), "Knobs"))
    names = [name for name, _ in rows]
    assert 8 <= len(names) <= 10 and len(set(names)) == len(names), names
    assert set(names) <= known_knobs(), set(names) - known_knobs()


def test_one_knob_away_examples_name_strategies_and_knobs():
    text = section(README.read_text(), "Strategies")
    examples = re.findall(r'custom_generate="([^"]+)",\s*(\w+)=', text)
    assert len(examples) >= 3, "the strategies section shows compositions one knob away"
    for strategy, knob in examples:
        assert strategy in hf_sjd.STRATEGIES and knob in known_knobs(), (strategy, knob)


def ci_commands() -> list[list[str]]:
    """The commands ``.ci/run`` runs (pip via ``python -m``, ``--quiet`` dropped): what the README must say."""
    commands = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words[:3] in (["python", "-m", "pip"], ["python", "-m", "pytest"]):
            words = words[2:] if words[2] == "pip" else words
            commands.append([word for word in words if word != "--quiet"])
    return commands


def readme_command(marker: str) -> list[list[str]]:
    """The README's one shell line containing ``marker``, split at ``&&`` into words."""
    lines = [line for block in code_blocks(README.read_text(), "bash") for line in block.splitlines()
             if marker in line]
    assert len(lines) == 1, f"expected one README command with {marker!r}, found {lines}"
    return [shlex.split(part) for part in lines[0].split("&&")]


def test_the_readme_test_command_is_what_ci_runs():
    commands = ci_commands()
    assert len(commands) == 3 and commands[-1][:3] == ["python", "-m", "pytest"], commands
    assert readme_command("pytest") == commands


def test_the_readme_main_command_parses_with_the_cli():
    from hf_sjd.cli import build_parser
    from hf_sjd.sampling import registered_methods

    torch_install, package_install, main = readme_command("hf-sjd generate")
    assert torch_install == ci_commands()[0]  # the same torch pin as the test command
    assert package_install == ["pip", "install", "-e", "."]
    assert main[0] == "hf-sjd"
    args = build_parser().parse_args(main[1:])  # an unknown flag exits here
    assert args.command == "generate" and args.out is not None
    methods = args.method.split(",")
    assert "ar" in methods and set(methods) <= set(registered_methods()), methods


def test_the_readme_python_example_runs():
    """The README's example, as written, on the shipped reference model."""
    (example,) = code_blocks(section(README.read_text(), "In Python"), "python")
    assert len(example.strip().splitlines()) <= 12
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    out, images = scope["out"], scope["images"]
    assert len(images) == out.sequences.shape[0] == 2
    assert out.stats.step_compression > 1 and out.stats.num_forward_passes < 256


def shell_commands(page: Path, program: str) -> list[str]:
    """The complete ``program`` commands a page shows: code spans that name an ``--out``, and the lines of its bash
    blocks (continuations joined, comments dropped)."""
    text = page.read_text()
    found = [span for span in BACKTICKED.findall(prose(text)) if span.startswith(program + " ") and "--out" in span]
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            found += [part.strip() for part in line.split("&&") if part.strip().startswith(program + " ")]
    return found


def test_every_hf_sjd_command_in_the_docs_parses_with_the_cli():
    from hf_sjd.cli import build_parser

    commands = [command for page in pages() for command in shell_commands(page, "hf-sjd")]
    assert {shlex.split(c)[1] for c in commands} >= {"generate", "bench", "build-phrases"}, commands
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"the docs show a command the CLI refuses: {command}")


def test_every_study_command_in_results_md_parses_with_the_harness():
    from benchmarks.driver import build_parser
    from benchmarks.loop_cost import build_parser as loop_cost_parser
    from benchmarks.suites import SUITES

    text = prose((DOCS / "results.md").read_text())
    commands = [span for span in BACKTICKED.findall(text) if span.startswith("python -m benchmarks ")
                and "SUITE" not in span]
    assert len(commands) >= 15
    suites = set()
    for command in commands:
        words = shlex.split(command.replace("--seeds S", "--seeds 0").replace("--out ...", "--out /tmp/out"))[3:]
        try:
            if words[0] == "loop-cost":
                loop_cost_parser().parse_args(words[1:])
                continue
            args = build_parser().parse_args(words)
        except SystemExit:
            pytest.fail(f"docs/results.md shows a command the harness refuses: {command}")
        suite = SUITES[args.suite]
        suites.add(suite.name)
        for name in (args.sections or "").split(","):
            assert not name or name in suite.section_names(), f"{command}: no section {name!r}"
    assert suites == set(SUITES), f"suites without a command: {set(SUITES) - suites}"


# -- docs/knobs.md ------------------------------------------------------------------------------------------------
def test_every_knob_has_one_row_and_nothing_else_is_presented_as_a_knob():
    names = [name for name, _ in knob_rows(KNOBS.read_text())]
    duplicates = {name for name in names if names.count(name) > 1}
    assert not duplicates, f"knobs with more than one row: {duplicates}"
    assert set(names) == known_knobs(), (f"missing: {sorted(known_knobs() - set(names))}; "
                                         f"not knobs: {sorted(set(names) - known_knobs())}")


@pytest.mark.parametrize("page", ["README.md", "docs/knobs.md", "docs/design.md", "docs/errors.md",
                                  "docs/models-usage.md"])
def test_knob_like_names_in_the_docs_are_knobs(page):
    """A code span shaped like a knob (``jacobi_...``, ``vp_...``) is one: deleted knobs appear only in
    docs/results.md, which lists the modes that did not pay."""
    spans = BACKTICKED.findall(prose((ROOT / page).read_text()))
    for block in FENCE.findall((ROOT / page).read_text()):
        spans += re.findall(r"\b([a-z][a-z0-9_]*)=", block[1])  # keyword arguments in the examples
    knob_like = {match.group(1) for span in spans if (match := IDENTIFIER.fullmatch(span.strip()))
                 and match.group(1).startswith(KNOB_PREFIXES)}
    allowed = known_knobs() | (MISSPELT_EXAMPLES if page == "docs/errors.md" else set())
    assert knob_like <= allowed, f"{page} presents as knobs: {sorted(knob_like - allowed)}"


def knob_defaults() -> dict[str, object]:
    """Each knob's default where it has one (``None`` means "decided at run time": the adapter's, the model's)."""
    defaults = {f.name: f.default for f in dataclasses.fields(SJDConfig) if f.name in SJDConfig.field_names()}
    for component in (*VERIFIERS.values(), *DRAFT_PRIORS.values()):
        options = options_class(component)
        defaults.update({options.knob(f): f.default for f in dataclasses.fields(options) if f.init})
    return {knob: value for knob, value in defaults.items() if value is not None}


def shown(value) -> str:
    return f'`"{value}"`' if isinstance(value, str) else f"`{value}`" if isinstance(value, bool) else str(value)


def test_the_default_column_starts_with_the_code_default():
    rows = dict(knob_rows(KNOBS.read_text()))
    defaults = knob_defaults()
    assert len(defaults) >= 15
    for knob, value in defaults.items():
        assert rows[knob][1].startswith(shown(value)), f"{knob}: code default {value!r}, docs {rows[knob][1]!r}"


def test_the_preset_table_is_each_strategys_preset():
    (header, rows), = [t for t in tables(section(KNOBS.read_text(), "Strategy presets")) if t[0][0] == "strategy"]
    columns = [names_in(cell)[0] for cell in header[1:]]
    assert set(columns) <= known_knobs()
    table = {names_in(row[0])[0]: row[1:] for row in rows}
    assert sorted(table) == sorted(hf_sjd.STRATEGIES)
    for name, strategy in hf_sjd.STRATEGIES.items():
        assert set(strategy.preset) <= set(columns), f"{name} presets knobs the table has no column for"
        for knob, cell in zip(columns, table[name]):
            expected = shown(strategy.preset[knob]) if knob in strategy.preset else ""
            assert cell == expected, f"{name}.{knob}: preset {expected!r}, table {cell!r}"


def test_the_extension_example_registers_a_working_strategy(reference):
    (example,) = [block for block in code_blocks(KNOBS.read_text(), "python") if "register_strategy" in block]
    try:
        exec(compile(example, "docs/knobs.md", "exec"), {})
        assert "tempered_power" in known_knobs()
        out = reference.model.generate(reference.prompt_ids(["coffee"]), custom_generate="tempered-sjd",
                                       tempered_power=0.5, do_sample=True, top_k=100, return_dict_in_generate=True)
        assert out.sequences.shape[1] == 1 + 256 and out.stats.num_accepted > 0
        with pytest.raises(ValueError, match="tempered_power must be a finite number >= 0.0"):
            reference.model.generate(reference.prompt_ids(["coffee"]), custom_generate="tempered-sjd",
                                     tempered_power=-1.0, do_sample=True)
    finally:  # the registries are process-wide: leave them as the other tests expect
        hf_sjd.STRATEGIES.pop("tempered-sjd", None)
        VERIFIERS.pop("tempered", None)
    assert "tempered_power" not in known_knobs()


# -- links ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_file():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_link_checker_finds_a_broken_link(tmp_path):
    """The link test has power: a missing file and a missing heading are both caught by the same code."""
    (tmp_path / "other.md").write_text("# Title\n\n## A section (`x`)\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section-x) [gone](missing.md) [bad anchor](other.md#nope)\n"
                    "```\n[in code](ignored.md)\n```\n")
    found = [target for target in LINK.findall(prose(page.read_text()))]
    assert found == ["other.md#a-section-x", "missing.md", "other.md#nope"]
    assert "a-section-x" in anchors(tmp_path / "other.md") and "nope" not in anchors(tmp_path / "other.md")
    assert not (tmp_path / "missing.md").is_file()
