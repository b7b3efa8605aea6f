"""The transformers versions hf_sjd runs on, checked once on import: ``setup.cfg`` and
``custom_generate/requirements.txt`` state the same range (``tests/test_packaging.py``), but miss a transformers
changed after hf_sjd or a checkout on ``PYTHONPATH``, where 5.0-5.23 would fail later about the KV cache.
"""

from __future__ import annotations

from packaging.version import Version

#: the first release whose model forwards take ``cache=`` (before it: ``past_key_values=``), which the Jacobi loop
#: and the adapters pass
MIN_TRANSFORMERS = "5.24"
#: exclusive: hf_sjd reads transformers internals (GenerationConfig._pad_token_tensor / _eos_token_tensor set by
#: _prepare_special_tokens, PreTrainedModel._supports_logits_to_keep, the GenerationMixin._sample signature)
MAX_TRANSFORMERS = "6"


def check_transformers(installed: str) -> None:
    """Raise ImportError unless ``installed`` (a transformers version; its dev and rc builds count as the release)
    is in ``[MIN_TRANSFORMERS, MAX_TRANSFORMERS)``.

    >>> check_transformers("5.24.0"); check_transformers("5.30.0.dev0")
    >>> check_transformers("5.17.0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ImportError: hf_sjd needs transformers>=5.24,<6 (model forwards take cache= from 5.24 on), found 5.17.0: pip ...
    """
    release = Version(Version(installed).base_version)
    if not Version(MIN_TRANSFORMERS) <= release < Version(MAX_TRANSFORMERS):
        wanted = f"transformers>={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS}"
        raise ImportError(f"hf_sjd needs {wanted} (model forwards take cache= from {MIN_TRANSFORMERS} on), found "
                          f"{installed}: pip install '{wanted}'")
