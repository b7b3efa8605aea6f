"""``jacobi_compile``: the loop's tensor step fused by ``torch.compile``.

Eagerly every torch op between two forwards is one kernel launch; on a GPU each costs a few microseconds of
launch latency whatever its size, so the launches, not the arithmetic, bound the loop. Inductor fuses the loop's two
pure tensor steps into a few kernels each: verify + commit (:meth:`~hf_sjd.jacobi.loop.JacobiDecoder._verify_step`:
acceptance, first rejection, residual, the recovered/bonus sample, the committed block and its count) and the
redraft (:meth:`~hf_sjd.jacobi.loop.JacobiDecoder._redraft_step`: positions, coupled redraft, fresh drafts, the
first draft's siblings). ``docs/results/loop_cost_compiled.md`` counts the launches of both paths.

    what                 how
    shapes               ``dynamic=True``: batch, window and support width are symbolic, so rows leaving the batch
                         and the window shrinking at the end do not recompile (sizes 0 and 1 are specialisations)
    random numbers       ``fallback_random``: ``exponential_`` runs as the eager op, so a seeded compiled call
                         draws exactly what the eager one draws
    host reads           none inside the step: the loop's reads stay where they are (``commit_cache``)
    eager path           the default (``jacobi_compile=False``)
    compile time         on first use, per process (CPU: ~1 minute for a strategy's shapes; cached after)

The compiled steps are the same functions, so they are exact whenever the eager ones are; the tests compare
their seeded tokens (``tests/jacobi/test_compiled.py``).
"""

from __future__ import annotations

from typing import Callable

import torch


class CompiledStep:
    """``step`` compiled with inductor for dynamic shapes, drawing its random numbers from torch's generator."""

    def __init__(self, step: Callable) -> None:
        self.step = step
        self.compiled = torch.compile(step, dynamic=True, options={"fallback_random": True})

    def __call__(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)
