"""Verifiers, one module per method: ``speculative`` (exact, token by token; SJD), ``block`` (exact, the window's
prefixes weighed jointly; the MC-SJD preset's), ``lantern`` and ``gsd`` (relaxed, lossy), ``phrase`` (SJD-PV, over a
per-token one). The interface, the shape table and the accept walk written once are in
:mod:`~hf_sjd.jacobi.verify.base`; the registry is :data:`hf_sjd.jacobi.registry.VERIFIERS`.
"""

from .base import VerificationResult, Verifier, at_position, first_rejection, gather_tokens
from .block import BlockVerifier
from .gsd import GSDOptions, GSDVerifier
from .lantern import LanternOptions, LanternVerifier, lantern_defaults
from .phrase import PhraseIndex, PhraseOptions, PhraseVerifier
from .speculative import SpeculativeVerifier

__all__ = ["BlockVerifier", "GSDOptions", "GSDVerifier", "LanternOptions", "LanternVerifier", "PhraseIndex",
           "PhraseOptions", "PhraseVerifier", "SpeculativeVerifier", "VerificationResult", "Verifier", "at_position",
           "first_rejection", "gather_tokens", "lantern_defaults"]
