"""hf_sjd: speculative Jacobi decoding for autoregressive image models inside ``model.generate``.

    >>> import hf_sjd
    >>> model = hf_sjd.enable(model)                      # doctest: +SKIP
    >>> out = model.generate(ids, custom_generate="sjd", do_sample=True, top_k=100)  # doctest: +SKIP
"""

import transformers as _transformers

from .compat import check_transformers as _check_transformers

_check_transformers(_transformers.__version__)  # before anything that calls a model (hf_sjd/compat.py)

from .calibration import CostProfile  # noqa: E402
from .checks import UnsupportedModelError
from .jacobi.config import SJDConfig
from .jacobi.drafting import Drafter, DraftWindow, maximal_coupling
from .jacobi.options import ComponentOptions
from .jacobi.priors import VerificationPredictionPrior, VPOptions
from .jacobi.registry import DRAFT_PRIORS, STRATEGIES, VERIFIERS, Strategy, register_strategy
from .jacobi.stats import CommitMap, JacobiStats, TokenKind
from .jacobi.verify import (BlockVerifier, GSDOptions, GSDVerifier, LanternOptions, LanternVerifier, PhraseIndex,
                           PhraseOptions, PhraseVerifier, SpeculativeVerifier, VerificationResult, Verifier)
from .mixin import SJDGenerateOutput, SJDGenerationMixin, enable
from .phrases import PhraseLibrary

__version__ = "0.1.0"

__all__ = ["BlockVerifier", "CommitMap", "ComponentOptions", "CostProfile", "DRAFT_PRIORS", "Drafter", "DraftWindow",
           "GSDOptions", "GSDVerifier", "JacobiStats", "LanternOptions", "LanternVerifier", "PhraseIndex",
           "PhraseLibrary", "PhraseOptions", "PhraseVerifier", "SJDConfig", "SJDGenerateOutput", "SJDGenerationMixin",
           "STRATEGIES", "SpeculativeVerifier", "Strategy", "TokenKind", "UnsupportedModelError", "VERIFIERS",
           "VPOptions", "VerificationPredictionPrior", "VerificationResult", "Verifier", "enable", "maximal_coupling",
           "register_strategy"]
