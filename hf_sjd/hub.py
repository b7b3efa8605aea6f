"""Hub requests that fail in seconds when the Hub cannot be reached or does not answer.

huggingface_hub retries a request that fails on the network 5 times with backoff (about 23 s for one file,
more for a model's several files) before it falls back to its cache, and there is no per-call setting for
it. :func:`unreachable` sends one HEAD without retries first; a caller that gets a reason back reads the
cache only (``local_files_only=True``) or stops with a message that says what to do.

Uploads (``create_repo``, ``upload_folder``: what ``push_to_hub`` sends) have no timeout at all in
huggingface_hub, so an endpoint that accepts the connection and never answers holds them for good.
:func:`bounded_requests` gives every request made inside it, in this thread, a timeout. Nothing in
huggingface_hub is patched: its shared HTTP client gets one request hook (httpx's public ``event_hooks``)
that does nothing outside :func:`bounded_requests`.
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
    """httpx request hook: inside :func:`bounded_requests`, a request that has no timeout of its own gets one
    (httpx reads ``request.extensions["timeout"]`` when it sends the request, after the hooks ran)."""
    timeout = _TIMEOUT.get()
    if timeout is None or any(v is not None for v in request.extensions.get("timeout", {}).values()):
        return
    request.extensions["timeout"] = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}


@contextlib.contextmanager
def bounded_requests(timeout: float | None, action: str) -> Iterator[None]:
    """Every huggingface_hub request made inside, in this thread, waits at most ``timeout`` seconds to connect
    and for each next byte (``None``: unbounded). A request that times out raises ``TimeoutError``, one that
    cannot connect ``ConnectionError``; both say ``action`` and name the endpoint.

    (Requests huggingface_hub sends from worker threads -- parallel LFS parts -- and Xet transfers, which
    do not go through its HTTP client, keep their own limits.)"""
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


def unreachable(repo_id: str, filename: str, revision: str | None = None, token: str | bool | None = None
                ) -> str | None:
    """Why the Hub cannot be asked for ``repo_id/filename`` (``None``: it answered, or look-ups are off anyway).

    An HTTP error (missing repo, revision or file, a gated repo) is an answer: the caller's own download then
    reports it as huggingface_hub words it. Offline mode (``HF_HUB_OFFLINE=1``) returns ``None`` too: the
    library itself goes straight to the cache there."""
    return head(repo_id, filename, revision, token)[1]


def head(repo_id: str, filename: str, revision: str | None = None, token: str | bool | None = None
         ) -> tuple[object | None, str | None]:
    """One HEAD of ``repo_id/filename`` without retries: ``(HfFileMetadata or None, why the Hub cannot be asked
    or None)``. Metadata is ``None`` when the Hub answered with an HTTP error or look-ups are off (see
    :func:`unreachable`); its ``size`` lets a caller refuse a file before downloading it."""
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
