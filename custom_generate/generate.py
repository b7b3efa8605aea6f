"""Hub entry point: ``model.generate(..., custom_generate="<this repo id or path>", trust_remote_code=True,
sjd_method="sjd")`` runs hf_sjd's Jacobi strategies on a decoder-only transformers model (docs/models.md: which
classes are token-identical, which are refused before any forward).

The algorithms live in the ``hf_sjd`` package (``requirements.txt``; transformers checks it is installed,
it does not install it): this file only picks the strategy. transformers calls
``generate(model=..., **generate_arguments)`` with every argument of its own ``generate``; they are
passed on unchanged, so every hf_sjd knob (``jacobi_window``, ``phrase_library``, ``pv_*``, ...) works here
as with ``custom_generate="<strategy name>"`` on an enabled model.
"""

import hf_sjd
from hf_sjd.checks import check_choice
from hf_sjd.mixin import jacobi_generate


def generate(model, sjd_method: str | None = None, **kwargs):
    """``sjd_method``: a registered strategy name (``hf_sjd.STRATEGIES``), checked before any work; a keyword, else
    the ``generation_config`` passed's, else the model's (transformers' precedence), else ``"sjd"``."""
    if sjd_method is None:
        sjd_method = (getattr(kwargs.get("generation_config"), "sjd_method", None)
                      or getattr(model.generation_config, "sjd_method", None) or "sjd")
    check_choice("sjd_method", sjd_method, tuple(sorted(hf_sjd.STRATEGIES)))
    return jacobi_generate(model, hf_sjd.STRATEGIES[sjd_method], **kwargs)
