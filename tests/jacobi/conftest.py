"""Fixtures of the loop's exactness tests: the toy model, and the exact laws of its first 5 new tokens."""

import pytest

from toy import toy_laws, toy_model

NUM_NEW = 5  # new tokens of the chi-square tests: 243 sequences over the toy model's top-3


@pytest.fixture(scope="module")
def model():
    return toy_model()


@pytest.fixture(scope="module")
def laws(model):
    """The exact laws of ``NUM_NEW`` tokens, top-3, without CFG (key None) and with CFG 3 (``toy_laws``)."""
    return toy_laws(model, NUM_NEW)
