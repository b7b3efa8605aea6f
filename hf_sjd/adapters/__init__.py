"""Model adapters: everything model-specific that the Jacobi loop must not know about."""

from .base import ADAPTERS, CausalLMAdapter, ImageGenerationAdapter, detect_adapter
from .chameleon import ChameleonAdapter
from .emu3 import Emu3Adapter
from .janus import JanusAdapter
from .layout import TokenGrid
from .llamagen import LlamaGenAdapter
from .support import UnsupportedModelError
from .vq_grid import VQGridAdapter

__all__ = ["ADAPTERS", "CausalLMAdapter", "ChameleonAdapter", "Emu3Adapter", "ImageGenerationAdapter", "JanusAdapter",
           "LlamaGenAdapter", "TokenGrid", "UnsupportedModelError", "VQGridAdapter",
           "detect_adapter"]
