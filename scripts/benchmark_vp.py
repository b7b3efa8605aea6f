"""SJD-VP on the shipped reference model: where does the verification prior pay?

Every setting samples the same prompts with the same seeds (batch ``i`` starts from seed ``seed + i``), so
step compression can be compared batch by batch: each row reports the mean paired difference to its base
strategy (``sjd`` or ``mc-sjd`` with the same guidance and window) and its standard error over batches.
Sections:

1. strategies: sjd, sjd-vp (lossless and paper mode), and the combinations with coupling, LANTERN and GSD,
   with quality proxies (mean token log-likelihood under the model, token-frequency TV to vanilla);
2. the sweep of (N, strength, beta) with guidance off/on and with coupled redrafting;
3. bounded variants (``vp_max_gain``, ``vp_min_prob``) and window sizes;
4. the paper's growth statistic: share of accepted drafts whose token grew in each of the last N
   observations, and the precision of growth as a predictor of acceptance (plain SJD, prior at strength 0);
5. the prior's cost per iteration;
6. a confirmation of the defaults (and of the sweep's best cell) on other seeds (``--seed``).

    python scripts/benchmark_vp.py                 # -> docs/results/vp.md (about 20 min on 1 thread)
    python scripts/benchmark_vp.py --per-prompt 1 --sections 1 --out /tmp/vp.md
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_verifiers import open_reference  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-prompt", type=int, default=2, help="images per reference prompt (16 prompts)")
    parser.add_argument("--batch", type=int, default=4, help="rows per generate call (one paired sample per batch)")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--guidance", type=float, default=3.0, help="the CFG scale of the 'CFG on' settings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sections", default="1,2,3,4,5")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "results" / "vp.md"))
    return parser.parse_args(argv)


class Runner:
    """Samples the prompt set with one setting; caches results by setting."""

    def __init__(self, ref, args) -> None:
        self.ref, self.args = ref, args
        self.ids = ref.prompt_ids([p for p in ref.conditions for _ in range(args.per_prompt)])
        self.cache: dict = {}

    def run(self, method: str | None, guidance: float = 1.0, window: int | None = None, **knobs) -> dict:
        key = (method, guidance, window, tuple(sorted(knobs.items())))
        if key in self.cache:
            return self.cache[key]
        args, ref = self.args, self.ref
        window = window or args.window
        if method is not None and __import__("hf_sjd.sampling").sampling.wants_knob(method, "latent_embeddings"):
            knobs = {**knobs, "latent_embeddings": ref.latent_embeddings}
        sequences, compression, accepted, verified = [], [], 0, 0
        start = time.perf_counter()
        for index, chunk in enumerate(self.ids.split(args.batch)):
            torch.manual_seed(args.seed + index)
            common = dict(do_sample=True, top_k=args.top_k, max_new_tokens=256)
            if method is None:
                extra = {} if guidance == 1 else {"guidance_scale": guidance,
                                                  "negative_prompt_ids": ref.unconditional_ids(len(chunk))}
                sequences.append(ref.model.generate(chunk, **common, **extra))
                continue
            out = ref.model.generate(chunk, custom_generate=method, jacobi_window=window, guidance_scale=guidance,
                                     return_dict_in_generate=True, **common, **knobs)
            sequences.append(out.sequences)
            compression.append(out.stats.step_compression)
            accepted += out.stats.num_accepted
            verified += out.stats.num_accepted + out.stats.num_recovered
        result = {"sequences": torch.cat(sequences), "compression": torch.tensor(compression or [1.0]),
                  "acceptance": accepted / max(verified, 1), "seconds": time.perf_counter() - start}
        self.cache[key] = result
        label = f"{method} g={guidance} L={window} {knobs if 'latent_embeddings' not in knobs else '...'}"
        print(f"{label:70.70s} {float(result['compression'].mean()):.3f}x  {result['seconds']:.0f}s",
              file=sys.stderr, flush=True)
        return result


def paired(result: dict, base: dict) -> str:
    diff = result["compression"] - base["compression"]
    se = float(diff.std()) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    return f"{float(diff.mean()):+.3f} ± {se:.3f}"


def quality(runner: Runner, result: dict, vanilla: dict) -> tuple[float, float]:
    from hf_sjd.quality import mean_token_loglik, token_frequency_tv
    from hf_sjd.reference import NUM_CODES

    if "loglik" not in result:
        result["loglik"] = mean_token_loglik(runner.ref.model, result["sequences"], prompt_len=1)
        result["tv"] = token_frequency_tv(result["sequences"][:, 1:], vanilla["sequences"][:, 1:], NUM_CODES)
    return result["loglik"], result["tv"]


def section_strategies(runner: Runner, args) -> list[str]:
    lines = ["## 1. Strategies (defaults: N = 3, strength 1, beta 0.5, gain bounded to [0, 1], lossless)", "",
             "| guidance | method | knobs | compression | vs base (paired) | acceptance | d loglik vs vanilla | "
             "TV to vanilla |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for guidance in (1.0, args.guidance):
        vanilla = runner.run(None, guidance)
        van_loglik, _ = quality(runner, vanilla, vanilla)
        rows = [("sjd", "sjd", {}), ("sjd-vp", "sjd", {}), ("sjd-vp", "sjd", {"vp_verify": "paper"}),
                ("mc-sjd", "sjd", {}), ("mc-sjd-vp", "mc-sjd", {}),
                ("lantern", "sjd", {}), ("lantern-vp", "lantern", {}), ("gsd", "sjd", {}), ("gsd-vp", "gsd", {})]
        for method, base, knobs in rows:
            result = runner.run(method, guidance, **knobs)
            loglik, tv = quality(runner, result, vanilla)
            lines.append(f"| {guidance:g} | {method} | {fmt(knobs)} | {float(result['compression'].mean()):.2f}x | "
                         f"{paired(result, runner.run(base, guidance))} (vs {base}) | {result['acceptance']:.2f} | "
                         f"{loglik - van_loglik:+.3f} | {tv:.3f} |")
    return lines + [""]


def fmt(knobs: dict) -> str:
    return ", ".join(f"{k.removeprefix('vp_')}={v}" for k, v in knobs.items()) or "-"


def section_sweep(runner: Runner, args) -> list[str]:
    lines = ["## 2. Sweep: growth steps N x strength x beta (lossless, unbounded log gain as in the paper)", "",
             "Paired difference of step compression to the base strategy (same seeds), mean ± standard error "
             "over batches.", "",
             "| N | strength | beta | sjd-vp, CFG off | sjd-vp, CFG on | mc-sjd-vp, CFG off |",
             "|---|---|---|---:|---:|---:|"]
    contexts = [("sjd-vp", "sjd", 1.0), ("sjd-vp", "sjd", args.guidance), ("mc-sjd-vp", "mc-sjd", 1.0)]
    bases = [runner.run(base, g) for _, base, g in contexts]
    lines.insert(4, "Base compression: " + ", ".join(
        f"{base} CFG {'on' if g != 1 else 'off'} {float(r['compression'].mean()):.2f}x"
        for (_, base, g), r in zip(contexts, bases)) + ".")
    lines.insert(5, "")
    for steps, strength, beta in itertools.product((1, 2, 3), (0.5, 1.0, 2.0), (0.3, 0.7)):
        knobs = {"vp_growth_steps": steps, "vp_strength": strength, "vp_beta": beta, "vp_max_gain": None}
        cells = [paired(runner.run(method, g, **knobs), base) for (method, _, g), base in zip(contexts, bases)]
        lines.append(f"| {steps} | {strength:g} | {beta:g} | " + " | ".join(cells) + " |")
    return lines + [""]


def section_variants(runner: Runner, args) -> list[str]:
    lines = ["## 3. Bounded variants and window size (from the paper's N = 3, strength 1, beta 0.5, unbounded)", "",
             "| variant | knobs | CFG off: vs sjd | CFG on: vs sjd |", "|---|---|---:|---:|"]
    raw = {"vp_growth_steps": 3, "vp_strength": 1.0, "vp_beta": 0.5, "vp_max_gain": None}  # the paper's formula
    variants = [("unbounded (paper)", {}), ("clip gain", {"vp_max_gain": 0.5}), ("clip gain", {"vp_max_gain": 1.0}),
                ("min prob", {"vp_min_prob": 0.05}), ("clip + min prob", {"vp_max_gain": 1.0, "vp_min_prob": 0.05}),
                ("N=1, clipped", {"vp_growth_steps": 1, "vp_max_gain": 0.5}),
                ("top-K 10", {"vp_top_k": 10})]
    for name, knobs in variants:
        cells = [paired(runner.run("sjd-vp", g, **{**raw, **knobs}), runner.run("sjd", g))
                 for g in (1.0, args.guidance)]
        lines.append(f"| {name} | {fmt(knobs)} | " + " | ".join(cells) + " |")
    lines += ["", "| window | sjd | sjd-vp | vs sjd | mc-sjd | mc-sjd-vp | vs mc-sjd |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for window in (8, 16, 32):
        sjd, vp = runner.run("sjd", 1.0, window), runner.run("sjd-vp", 1.0, window, **raw)
        mc, mcvp = runner.run("mc-sjd", 1.0, window), runner.run("mc-sjd-vp", 1.0, window, **raw)
        lines.append(f"| {window} | {float(sjd['compression'].mean()):.2f}x | {float(vp['compression'].mean()):.2f}x | "
                     f"{paired(vp, sjd)} | {float(mc['compression'].mean()):.2f}x | "
                     f"{float(mcvp['compression'].mean()):.2f}x | {paired(mcvp, mc)} |")
    return lines + [""]


def section_confirm(runner: Runner, args) -> list[str]:
    """The defaults (and the sweep's best cell) against their base strategy, on the seeds given by --seed."""
    lines = [f"## 6. Confirmation on seeds {args.seed}.. (defaults, and the sweep's best cell)", "",
             "| setting | CFG | vs base (paired) |", "|---|---|---:|"]
    settings = [("sjd-vp defaults", "sjd-vp", "sjd", 1.0, {}), ("sjd-vp defaults", "sjd-vp", "sjd", args.guidance, {}),
                ("mc-sjd-vp defaults", "mc-sjd-vp", "mc-sjd", 1.0, {}),
                ("mc-sjd-vp N=3, strength 0.5, beta 0.3, unbounded", "mc-sjd-vp", "mc-sjd", 1.0,
                 {"vp_strength": 0.5, "vp_beta": 0.3, "vp_max_gain": None})]
    for name, method, base, guidance, knobs in settings:
        result, reference = runner.run(method, guidance, **knobs), runner.run(base, guidance)
        lines.append(f"| {name} | {guidance:g} | {paired(result, reference)} |")
    return lines + [""]


# -- growth statistics and prior cost: probes plugged in through the registries ---------------------------
def install_probes():
    import hf_sjd
    from hf_sjd.jacobi.priors import VerificationPredictionPrior, VPOptions

    state = {"prior": None, "counts": None, "prior_seconds": 0.0, "prior_calls": 0}

    class TimedPrior(VerificationPredictionPrior):
        def __call__(self, input_ids, scores, positions, rows, carried):
            start = time.perf_counter()
            out = super().__call__(input_ids, scores, positions=positions, rows=rows, carried=carried)
            state["prior_seconds"] += time.perf_counter() - start
            state["prior_calls"] += 1
            self.batch = len(rows.unique_consecutive())
            return out

    class Factory:
        options_class = VPOptions

        @staticmethod
        def from_config(config, adapter, draft_ids, options):
            state["prior"] = TimedPrior(config.jacobi_window, **dataclasses.asdict(options))
            return state["prior"]

    class GrowthProbe(hf_sjd.SpeculativeVerifier):
        """Did each verified draft's token grow over its last N observations? (from the prior's last call)."""

        def __call__(self, drafts, draft_probs, target_probs, uniforms):
            result = super().__call__(drafts, draft_probs, target_probs, uniforms)
            prior = state["prior"]
            if prior is not None and prior.last_growth is not None and prior.last_growth.shape[0] == drafts.numel():
                grew = prior.last_growth.view(*drafts.shape, -1).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
                slot = torch.arange(drafts.shape[1])
                verified = slot <= result.num_accepted[:, None]
                accepted = slot < result.num_accepted[:, None]
                counts = torch.tensor([int((grew & accepted).sum()), int((grew & verified).sum()),
                                       int(accepted.sum()), int(verified.sum())])
                state["counts"] = counts if state["counts"] is None else state["counts"] + counts
            return result

    hf_sjd.DRAFT_PRIORS["vp-timed"] = Factory
    hf_sjd.VERIFIERS["growth-probe"] = GrowthProbe
    return state


def section_growth(runner: Runner, args, state) -> list[str]:
    lines = ["## 4. The paper's growth statistic on the reference model", "",
             "Plain SJD drafts (prior at strength 0, so sampling is unchanged). A verified draft *grew* if its "
             "token's probability at that position rose in each of the last N observations before it was drafted. "
             "Share = accepted drafts that grew / accepted drafts; precision = grew and accepted / grew (among "
             "verified drafts); base rate = acceptance of all verified drafts.", "",
             "| redraft | CFG | N | share of accepted that grew | precision of growth | base acceptance | "
             "verified drafts that grew |", "|---|---|---|---:|---:|---:|---:|"]
    for (coupling, method), guidance, steps in itertools.product(
            (("independent", "sjd"), ("maximal", "mc-sjd")), (1.0, args.guidance), (1, 2, 3)):
        state["counts"] = None
        runner.run(method, guidance, draft_prior="vp-timed", verifier="growth-probe", vp_strength=0.0,
                   vp_growth_steps=steps)
        grew_acc, grew_ver, acc, ver = state["counts"].tolist()
        lines.append(f"| {coupling} | {guidance:g} | {steps} | {grew_acc / max(acc, 1):.3f} | "
                     f"{grew_acc / max(grew_ver, 1):.3f} | {acc / max(ver, 1):.3f} | {grew_ver / max(ver, 1):.3f} |")
    return lines + [""]


def section_cost(runner: Runner, args, state) -> list[str]:
    state["prior_seconds"], state["prior_calls"] = 0.0, 0
    result = runner.run("sjd-vp", 1.0, draft_prior="vp-timed", vp_strength=1.0)
    ms = 1000 * state["prior_seconds"] / max(state["prior_calls"], 1)
    total_ms = 1000 * result["seconds"] / max(state["prior_calls"], 1)
    return ["## 5. Cost of the prior", "",
            f"{ms:.2f} ms per iteration (batch {args.batch}, window {args.window}, vocabulary 530, N = 3) out of "
            f"{total_ms:.1f} ms per iteration in total ({100 * ms / total_ms:.0f}%).", ""]


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from hf_sjd.files import atomic_write_text

    start, command, ref = open_reference("benchmark_vp.py", argv)
    runner = Runner(ref, args)
    state = install_probes()
    sections = {s.strip() for s in args.sections.split(",")}
    lines = ["# SJD-VP on the reference model", "", f"Command: `{command}`", "",
             f"Reference model, 16 prompts x {args.per_prompt} images, batch {args.batch}, top-k {args.top_k}, "
             f"window {args.window} unless stated, CFG on = {args.guidance:g}, seeds {args.seed}.. (one per batch, "
             f"shared by all settings), {args.threads} CPU thread(s).", ""]
    with torch.no_grad():
        if "1" in sections:
            lines += section_strategies(runner, args)
        if "2" in sections:
            lines += section_sweep(runner, args)
        if "3" in sections:
            lines += section_variants(runner, args)
        if "4" in sections:
            lines += section_growth(runner, args, state)
        if "5" in sections:
            lines += section_cost(runner, args, state)
        if "6" in sections:
            lines += section_confirm(runner, args)
    lines.append(f"Total {(time.perf_counter() - start) / 60:.1f} min.")
    text = "\n".join(lines) + "\n"
    atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
