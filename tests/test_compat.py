"""The transformers range hf_sjd runs on (hf_sjd/compat.py): stated alike where pip, transformers and the import
read it, and enforced on import."""

import configparser
import doctest
import subprocess
import sys
from pathlib import Path

import pytest

from hf_sjd import compat
from hf_sjd.compat import MAX_TRANSFORMERS, MIN_TRANSFORMERS, check_transformers

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_doctests():
    assert doctest.testmod(compat).failed == 0


def test_transformers_range_is_stated_once_in_three_places():
    """setup.cfg (pip), custom_generate/requirements.txt (its lines: tests/test_packaging.py) and the check on import
    (hf_sjd/compat.py) name the same range; the check refuses a transformers outside it by name."""
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    requires = [line.strip() for line in config["options"]["install_requires"].splitlines()]
    assert f"transformers>={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS}" in requires
    check_transformers(MIN_TRANSFORMERS)
    for outside in ("5.23.0", MAX_TRANSFORMERS):
        wanted = rf"transformers>={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS}"
        with pytest.raises(ImportError, match=rf"{wanted}.*found {outside}"):
            check_transformers(outside)


def test_an_older_transformers_is_refused_on_import():
    """In a fresh interpreter whose transformers says 5.23: ``import hf_sjd`` fails with the range, before any
    model could be called with a keyword that version ignores."""
    code = "import transformers; transformers.__version__ = '5.23.0'; import hf_sjd"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "hf_sjd needs transformers>=5.24,<6" in done.stderr
