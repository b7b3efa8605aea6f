"""Hub entry point: ``model.generate(..., custom_generate="<this repo or path>", trust_remote_code=True,
sjd_method="sjd")`` runs hf_sjd's Jacobi strategies on any decoder-only transformers model.

transformers calls ``generate(model=..., **generate_arguments)`` with every argument of its own
``generate``; they are passed on unchanged.
"""

import hf_sjd
from hf_sjd.mixin import jacobi_generate


def generate(model, sjd_method: str = "sjd", **kwargs):
    if sjd_method not in hf_sjd.STRATEGIES:
        raise ValueError(f"sjd_method={sjd_method!r} is not registered; registered strategies: "
                         f"{', '.join(sorted(hf_sjd.STRATEGIES))}")
    return jacobi_generate(model, hf_sjd.STRATEGIES[sjd_method], **kwargs)
