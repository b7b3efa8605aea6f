"""Every registry of hf_sjd, spelled out in one place: verifiers, draft priors, named strategies.

Components are plain classes in their own modules; nothing registers itself on import. Adding a verifier or
a prior is one class plus one line below; adding a strategy is one :func:`register_strategy` call (a preset of
knob values selected by ``custom_generate="name"``; the components it selects bring their own knobs). Users
may extend the dicts at run time (``hf_sjd.VERIFIERS["mine"] = Mine``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .priors import VerificationPredictionPrior
from .verify import BlockVerifier, GSDVerifier, LanternVerifier, PhraseVerifier, SpeculativeVerifier, Verifier

# name -> verifier class (``from_config(config, adapter, draft_token_ids)`` if it has one, else ``cls()``)
VERIFIERS: dict[str, type[Verifier]] = {
    "speculative": SpeculativeVerifier,
    "block": BlockVerifier,
    "lantern": LanternVerifier,
    "gsd": GSDVerifier,
    "phrase": PhraseVerifier,
}

# name -> ``LogitsProcessor`` class with ``from_config(config, adapter, draft_token_ids)`` (see ``Drafter``)
DRAFT_PRIORS: dict[str, type] = {
    "verification-prediction": VerificationPredictionPrior,
}


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    preset: dict = field(default_factory=dict)  # knob values: SJDConfig fields and component options


STRATEGIES: dict[str, Strategy] = {}


def register_strategy(name: str, description: str, **preset) -> Strategy:
    strategy = Strategy(name, description, preset)
    STRATEGIES[name] = strategy
    return strategy


register_strategy("sjd", "Speculative Jacobi decoding (Teng et al. 2024): exact verification, independent redraft",
                  verifier="speculative", draft_coupling="independent")
register_strategy("mc-sjd", "SJD with maximally coupled redrafting (So et al. 2025, MC-SJD) and block verification "
                  "(Sun et al. 2025, verifier='block': the window's prefixes weighed jointly, docs/results/"
                  "frontier_block); fresh drafts from the distribution one grid row up (draft_init='auto', "
                  "docs/results/frontier.md); window and siblings of the first draft picked by the forward cost "
                  "model on CUDA (jacobi_window='auto', jacobi_siblings='auto'; 16 and 0 elsewhere), and picked "
                  "again for the rows left as a batch's rows finish (jacobi_window_rule='auto'), the siblings drawn "
                  "from the first draft's q mixed with the last committed position's target "
                  "(jacobi_sibling_law='mixture'); lossless",
                  verifier="block", draft_coupling="maximal", draft_init="auto", jacobi_window="auto",
                  jacobi_siblings="auto", jacobi_sibling_law="mixture", jacobi_window_rule="auto")
register_strategy("lantern", "LANTERN relaxed verification (Jang et al. 2024): drafts borrow the target mass of their "
                  "latent-space neighbours; lossy. Needs latent_embeddings=...",
                  verifier="lantern", draft_coupling="independent")
register_strategy("gsd", "Grouped speculative decoding (So et al. 2025, GSD): accept a draft as a member of a group "
                  "of close-in-rank, -probability and -embedding tokens; lossy",
                  verifier="gsd", draft_coupling="independent")
register_strategy("mc-lantern", "LANTERN verification with maximally coupled redrafting (MC-SJD + LANTERN); lossy",
                  verifier="lantern", draft_coupling="maximal")
register_strategy("mc-gsd", "GSD verification with maximally coupled redrafting (MC-SJD + GSD); lossy",
                  verifier="gsd", draft_coupling="maximal")

# Each component's knobs come with its options (vp_* with the prior, pv_* with phrase verification, ...).
register_strategy("sjd-vp", "SJD with the verification-prediction draft prior (SJD-VP, arXiv 2603.27115); lossless "
                  "with vp_verify='lossless' (default)", verifier="speculative", draft_coupling="independent",
                  draft_prior="verification-prediction")
register_strategy("mc-sjd-vp", "SJD-VP prior with maximally coupled redrafting (coupled with the fused p'); lossless",
                  verifier="speculative", draft_coupling="maximal", draft_prior="verification-prediction")
register_strategy("lantern-vp", "LANTERN verification of SJD-VP drafts; lossy",
                  verifier="lantern", draft_coupling="independent", draft_prior="verification-prediction")
register_strategy("gsd-vp", "GSD verification of SJD-VP drafts; lossy",
                  verifier="gsd", draft_coupling="independent", draft_prior="verification-prediction")

# SJD-PV (arXiv 2603.06666): phrase verification over a base per-token verifier (pv_base_verifier); lossy.
# phrase_library= defaults to the adapter's (the reference model ships its own).
register_strategy("sjd-pv", "SJD with phrase verification (SJD-PV): drafted runs matching a library phrase are "
                  "verified jointly by their summed log ratio; lossy", verifier="phrase",
                  draft_coupling="independent")
register_strategy("mc-sjd-pv", "SJD-PV with maximally coupled redrafting; lossy", verifier="phrase",
                  draft_coupling="maximal")
register_strategy("lantern-pv", "phrase verification over LANTERN per-token verification; lossy",
                  verifier="phrase", draft_coupling="independent",
                  pv_base_verifier="lantern")
register_strategy("gsd-pv", "phrase verification over GSD per-token verification; lossy",
                  verifier="phrase", draft_coupling="independent",
                  pv_base_verifier="gsd")
register_strategy("sjd-vp-pv", "SJD-VP drafts with phrase verification (no published method combines them); lossy",
                  verifier="phrase", draft_coupling="independent", draft_prior="verification-prediction")
register_strategy("lantern-vp-pv", "SJD-VP drafts, phrase verification over LANTERN; lossy",
                  verifier="phrase", draft_coupling="independent",
                  draft_prior="verification-prediction", pv_base_verifier="lantern")
