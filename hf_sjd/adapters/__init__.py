"""Model adapters: everything model-specific that the Jacobi loop must not know about."""

from .base import ADAPTERS, CausalLMAdapter, ImageGenerationAdapter, detect_adapter
from .llamagen import LlamaGenAdapter

__all__ = ["ADAPTERS", "CausalLMAdapter", "ImageGenerationAdapter", "LlamaGenAdapter", "detect_adapter"]
