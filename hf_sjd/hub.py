"""Hub look-ups that fail in seconds when the Hub cannot be reached.

huggingface_hub retries a request that fails on the network 5 times with backoff (about 23 s for one file,
more for a model's several files) before it falls back to its cache, and there is no per-call setting for
it. :func:`unreachable` sends one HEAD without retries first; a caller that gets a reason back reads the
cache only (``local_files_only=True``) or stops with a message that says what to do. Nothing in
huggingface_hub is patched.
"""

from __future__ import annotations


def unreachable(repo_id: str, filename: str, revision: str | None = None, token: str | bool | None = None
                ) -> str | None:
    """Why the Hub cannot be asked for ``repo_id/filename`` (``None``: it answered, or look-ups are off anyway).

    An HTTP error (missing repo, revision or file, a gated repo) is an answer: the caller's own download then
    reports it as huggingface_hub words it. Offline mode (``HF_HUB_OFFLINE=1``) returns ``None`` too: the
    library itself goes straight to the cache there."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, is_offline_mode
    from huggingface_hub.errors import HfHubHTTPError

    if is_offline_mode():
        return None
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token,
                             timeout=constants.HF_HUB_ETAG_TIMEOUT, retry_on_errors=False)
    except HfHubHTTPError:
        return None
    except Exception as error:  # the network: connection refused, DNS, timeout
        return f"cannot reach {constants.ENDPOINT} ({type(error).__name__}: {error})"
    return None
