"""Hub requests that fail in seconds when the Hub cannot be reached or does not answer.

huggingface_hub retries a request that fails on the network 5 times with backoff (about 23 s per file) before
it falls back to its cache, with no per-call setting; :func:`head` sends one HEAD without retries first. Uploads
have no timeout at all: :func:`bounded_requests` gives them one, through one request hook on huggingface_hub's
shared HTTP client (httpx's public ``event_hooks``) that does nothing outside it. Nothing is patched.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import threading
from collections.abc import Iterator

_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar("hf_sjd_hub_timeout", default=None)
_HOOK_LOCK = threading.Lock()


def _apply_timeout(request) -> None:
    """httpx request hook: inside :func:`bounded_requests`, a request without a timeout of its own gets one."""
    timeout = _TIMEOUT.get()
    if timeout is None or any(v is not None for v in request.extensions.get("timeout", {}).values()):
        return
    request.extensions["timeout"] = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}


@contextlib.contextmanager
def bounded_requests(timeout: float | None, action: str) -> Iterator[None]:
    """Every huggingface_hub request made inside, in this thread, waits at most ``timeout`` seconds to connect
    and for each next byte (``None``: unbounded); then ``TimeoutError``, or ``ConnectionError`` for one that
    cannot connect, both saying ``action`` and the endpoint. (Worker-thread LFS parts and Xet transfers, outside
    its HTTP client, keep their own limits.)"""
    from huggingface_hub import get_session

    session = get_session()
    http = importlib.import_module(type(session).__module__.split(".")[0])  # httpx, or httpx2 (huggingface_hub 2)
    with _HOOK_LOCK:
        hooks = session.event_hooks["request"]
        if _apply_timeout not in hooks:
            hooks.append(_apply_timeout)
    token = _TIMEOUT.set(timeout)
    try:
        yield
    except http.TimeoutException as error:
        within = f" within {timeout:g} s" if timeout is not None else ""
        raise TimeoutError(f"{action}: the Hub at {_endpoint(error)} did not answer{within} "
                           f"({type(error).__name__}); check HF_ENDPOINT and the connection, or allow a longer "
                           "timeout") from error
    except http.TransportError as error:
        raise ConnectionError(f"{action}: cannot reach the Hub at {_endpoint(error)} ({type(error).__name__}: "
                              f"{error}); check HF_ENDPOINT and the connection") from error
    finally:
        _TIMEOUT.reset(token)


def _endpoint(error: Exception) -> str:
    from huggingface_hub import constants

    try:
        url = error.request.url  # httpx errors carry the request that failed
    except (AttributeError, RuntimeError):
        return constants.ENDPOINT
    return f"{url.scheme}://{url.netloc.decode() if isinstance(url.netloc, bytes) else url.netloc}"


def head(repo_id: str, filename: str, revision: str | None = None, token: str | bool | None = None
         ) -> tuple[object | None, str | None]:
    """One HEAD of ``repo_id/filename`` without retries: ``(HfFileMetadata or None, why the Hub cannot be asked
    or None)``. An HTTP error (missing repo or file, gated repo) is an answer: ``(None, None)``, and the caller's
    own download reports it; so is offline mode (``HF_HUB_OFFLINE=1``), where callers read the cache anyway."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, is_offline_mode
    from huggingface_hub.errors import HfHubHTTPError

    if is_offline_mode():
        return None, None
    try:
        metadata = get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token,
                                        timeout=constants.HF_HUB_ETAG_TIMEOUT, retry_on_errors=False)
    except HfHubHTTPError:
        return None, None
    except Exception as error:  # the network: connection refused, DNS, timeout
        return None, f"cannot reach {constants.ENDPOINT} ({type(error).__name__}: {error})"
    return metadata, None
