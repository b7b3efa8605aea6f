"""Verifiers, one module per method (the interface: :mod:`~hf_sjd.jacobi.verify.base`)."""

from .base import VerificationResult, Verifier
from .block import BlockVerifier
from .gsd import GSDOptions, GSDVerifier
from .lantern import LanternOptions, LanternVerifier, lantern_defaults
from .phrase import PhraseIndex, PhraseOptions, PhraseVerifier
from .speculative import SpeculativeVerifier

__all__ = ["BlockVerifier", "GSDOptions", "GSDVerifier", "LanternOptions", "LanternVerifier", "PhraseIndex",
           "PhraseOptions", "PhraseVerifier", "SpeculativeVerifier", "VerificationResult", "Verifier",
           "lantern_defaults"]
