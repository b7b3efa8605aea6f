import pytest

import hf_sjd
from hf_sjd.reference import load


@pytest.fixture(scope="session")
def reference():
    """The shipped reference model, enabled for Jacobi strategies (loaded once for all reference tests)."""
    ref = load()
    hf_sjd.enable(ref.model)
    return ref
