"""hf_sjd: speculative Jacobi decoding for autoregressive image models inside ``model.generate``.

    >>> import hf_sjd
    >>> model = hf_sjd.enable(model)                      # doctest: +SKIP
    >>> out = model.generate(ids, custom_generate="sjd", do_sample=True, top_k=100)  # doctest: +SKIP
"""

from .jacobi.config import SJDConfig
from .jacobi.drafting import Drafter, DraftWindow, maximal_coupling
from .jacobi.phrase_verification import PhraseIndex, PhraseVerifier
from .jacobi.priors import VerificationPredictionPrior
from .jacobi.registry import DRAFT_PRIORS, STRATEGIES, VERIFIERS, Strategy, register_strategy
from .jacobi.relaxed import GSDVerifier, LanternVerifier
from .jacobi.stats import JacobiStats
from .jacobi.verifiers import SpeculativeVerifier, VerificationResult, Verifier
from .mixin import SJDGenerateOutput, SJDGenerationMixin, enable
from .phrases import PhraseLibrary

__version__ = "0.1.0"

__all__ = ["DRAFT_PRIORS", "Drafter", "DraftWindow", "GSDVerifier", "JacobiStats", "LanternVerifier", "PhraseIndex",
           "PhraseLibrary", "PhraseVerifier", "SJDConfig", "SJDGenerateOutput", "SJDGenerationMixin", "STRATEGIES",
           "SpeculativeVerifier", "Strategy", "VERIFIERS", "VerificationPredictionPrior", "VerificationResult",
           "Verifier", "enable", "maximal_coupling", "register_strategy"]
