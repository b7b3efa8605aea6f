"""``jacobi_compile``: the loop's tensor step fused by ``torch.compile``.

Eagerly every torch op between two forwards is one kernel launch (``hf-sjd loop-cost`` counts ~120-260 per
iteration at batch 8); on a GPU each costs a few microseconds of launch latency whatever its size, so the
launches, not the arithmetic, bound the loop. Inductor fuses the pure tensor step of verify + commit
(:meth:`~hf_sjd.jacobi.loop.JacobiDecoder._verify_step`: acceptance, first rejection, residual, the
recovered/bonus sample, the committed block and its count) into a few kernels.

    what                 how
    shapes               ``dynamic=True``: batch, window and support width are symbolic, so rows leaving the batch
                         and the window shrinking at the end do not recompile (sizes 0 and 1 are specialisations)
    random numbers       ``fallback_random``: ``exponential_`` runs as the eager op, so a seeded compiled call
                         draws exactly what the eager one draws
    host reads           none inside the step: the loop's reads stay where they are (``commit_cache``)
    eager path           the default (``jacobi_compile=False``)
    compile time         on first use, per process (CPU: ~1 minute for a strategy's shapes; cached after)

The compiled step is the same function, so it is exact whenever the eager one is; the tests compare their
tokens, greedy and seeded sampling (``tests/jacobi/test_compiled.py``).
"""

from __future__ import annotations

from typing import Callable

import torch


class CompiledStep:
    """``step`` compiled with inductor for dynamic shapes, drawing its random numbers from torch's generator
    (a class, so ``hf-sjd loop-cost`` can find the compiled calls and count their kernels)."""

    def __init__(self, step: Callable) -> None:
        self.step = step
        self.compiled = torch.compile(step, dynamic=True, options={"fallback_random": True})

    def __call__(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)
