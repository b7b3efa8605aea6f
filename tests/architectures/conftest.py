"""The matrix's full sweep is marked ``slow``: it runs with ``HF_SJD_SLOW=1`` (the default run covers every
configuration with two checks, :data:`architectures.matrix.DEFAULT_CHECKS`)."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("HF_SJD_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="the full sweep: set HF_SJD_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
