"""A local Hugging Face Hub over real HTTP, for tests: the endpoints huggingface_hub 2.4 and transformers 5 call.

Clients reach it the way they reach huggingface.co: ``HfApi(endpoint=hub.url)`` / ``snapshot_download(...,
endpoint=hub.url)`` in this process, or ``HF_ENDPOINT=hub.url`` in a subprocess's environment
(``huggingface_hub.constants.ENDPOINT`` is read once, at import). Nothing in huggingface_hub is patched.

Endpoints (``{type}`` = ``models`` | ``datasets``; ``{repo}`` = ``owner/name``; ``{rev}`` = branch, tag or
40-hex commit, URL-quoted)::

    POST /api/repos/create                       create_repo (409 when it exists)
    POST /api/validate-yaml                      the card's front matter (upload_folder sends README.md)
    GET  /api/whoami-v2                          whoami
    GET  /api/agent-harnesses                    the hf CLI's user-agent registry (served empty)
    POST /api/{type}/{repo}/preupload/{rev}      upload mode per file: always "regular" (inline base64 in
                                                 the commit), as the Hub answers for small untracked files;
                                                 the LFS / Xet transfer is never asked for
    POST /api/{type}/{repo}/commit/{rev}         create_commit: ndjson header + file / deletedFile /
                                                 deletedFolder lines; ``rev`` must be a branch
    POST /api/{type}/{repo}/branch/{branch}      create_branch (``startingPoint`` optional)
    POST /api/{type}/{repo}/tag/{rev}            create_tag
    GET  /api/{type}/{repo}[/revision/{rev}]     repo_info / model_info: id, sha, siblings
    GET  /api/{type}/{repo}/tree/{rev}[/{path}]  list_repo_tree (one page)
    GET  /api/{type}/{repo}/refs                 list_repo_refs
    HEAD|GET /[datasets/]{repo}/resolve/{rev}/{file}
                                                 hf_hub_download: X-Repo-Commit, ETag (git blob sha1),
                                                 Content-Length; 404s carry X-Error-Code (RepoNotFound,
                                                 RevisionNotFound, EntryNotFound) as the Hub's do

Storage: blobs in ``root/blobs/<sha256>``; repositories (commits = full file maps, branches, tags) in
memory. Only 127.0.0.1 is bound and only loopback peers are served. Writes need an ``Authorization``
header (any token). Every request is recorded in ``hub.requests``; a route this server does not know
is answered 404 and recorded in ``hub.unknown_routes`` (tests assert it stays empty).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
_COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hub's ETag) gives a regular file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    oid: str
    parent: str | None
    files: dict[str, str]  # path -> sha256 of the blob
    title: str


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        oid = self.branches.get(revision) or self.tags.get(revision)
        if oid is None and _COMMIT_HASH.match(revision):
            oid = revision
        return self.commits.get(oid) if oid is not None else None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.commit = status, message, code, commit


class LocalHub:
    """``with LocalHub(tmp_path) as hub: HfApi(endpoint=hub.url, token="t").create_repo("me/x")``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.unknown_routes: list[tuple[str, str]] = []
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LocalHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="local-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ storage
    def _put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / "blobs" / digest
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return digest

    def blob(self, digest: str) -> bytes:
        return (self.root / "blobs" / digest).read_bytes()

    def repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def commit_of(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Test helper: the files of a revision, as bytes."""
        with self._lock:
            commit = self.commit_of(self.repo(repo_type, repo_id), revision)
            return {path: self.blob(digest) for path, digest in commit.files.items()}

    def _new_commit(self, repo: Repo, parent: Commit | None, files: dict[str, str], title: str) -> Commit:
        seed = json.dumps([parent.oid if parent else None, sorted(files.items()), title, time.time_ns()])
        commit = Commit(hashlib.sha1(seed.encode()).hexdigest(), parent.oid if parent else None, files, title)
        repo.commits[commit.oid] = commit
        return commit

    # ------------------------------------------------------------------ API
    def create_repo(self, body: dict, base: str) -> tuple[int, dict]:
        repo_type = body.get("type") or "model"
        name, organization = body.get("name"), body.get("organization")
        if not name or repo_type not in ("model", "dataset"):
            raise HubError(400, f"invalid create request {body}")
        repo_id = f"{organization}/{name}" if organization else f"tester/{name}"
        prefix = "" if repo_type == "model" else "datasets/"
        url = f"{base}/{prefix}{repo_id}"
        if (repo_type, repo_id) in self.repos:
            return 409, {"error": "You already created this repo", "url": url}
        repo = Repo(repo_type, repo_id)
        first = self._new_commit(repo, None, {".gitattributes": self._put_blob(GITATTRIBUTES)}, "initial commit")
        repo.branches["main"] = first.oid
        self.repos[(repo_type, repo_id)] = repo
        return 200, {"url": url, "name": repo_id}

    def commit(self, repo: Repo, branch: str, lines: list[dict], base: str) -> dict:
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit payload must start with a header line")
        if branch not in repo.branches:
            raise HubError(404, f"Invalid rev id: {branch} (commits go to a branch)", "RevisionNotFound")
        header = lines[0]["value"]
        parent = repo.commits[repo.branches[branch]]
        if header.get("parentCommit") not in (None, parent.oid):
            raise HubError(412, f"parentCommit {header['parentCommit']} is not the head of {branch}")
        files = dict(parent.files)
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value", {})
            path = value.get("path", "")
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"unsupported encoding {value.get('encoding')!r} for {path}")
                files[path] = self._put_blob(base64.b64decode(value["content"]))
            elif key == "deletedFile":
                if files.pop(path, None) is None:
                    raise HubError(404, f"{path} does not exist", "EntryNotFound")
            elif key == "deletedFolder":
                folder = path.rstrip("/") + "/"
                files = {p: d for p, d in files.items() if not p.startswith(folder)}
            else:  # lfsFile: never requested, preupload always answers "regular"
                raise HubError(400, f"unsupported commit operation {key!r} (this hub only takes regular files)")
        commit = self._new_commit(repo, parent, files, header.get("summary", ""))
        repo.branches[branch] = commit.oid
        prefix = "" if repo.repo_type == "model" else "datasets/"
        return {"commitUrl": f"{base}/{prefix}{repo.repo_id}/commit/{commit.oid}", "commitOid": commit.oid,
                "pullRequestUrl": None}

    def info(self, repo: Repo, commit: Commit) -> dict:
        return {"id": repo.repo_id, "modelId": repo.repo_id, "sha": commit.oid, "private": False,
                "disabled": False, "gated": False, "tags": [], "downloads": 0, "likes": 0,
                "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": [{"rfilename": path} for path in sorted(commit.files)]}

    def tree(self, commit: Commit, path: str, recursive: bool) -> list[dict]:
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        entries, folders = [], set()
        for file_path in sorted(commit.files):
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix):]
            parts = rest.split("/")
            for depth in range(1, len(parts) if recursive else min(2, len(parts))):
                folders.add(prefix + "/".join(parts[:depth]))
            if recursive or len(parts) == 1:
                data = self.blob(commit.files[file_path])
                entries.append({"type": "file", "path": file_path, "size": len(data), "oid": git_blob_sha1(data)})
        if prefix and not entries and not folders:
            raise HubError(404, f"{path} does not exist", "EntryNotFound", commit.oid)
        oid = lambda p: hashlib.sha1(p.encode()).hexdigest()  # noqa: E731 (a stable tree id)
        return [{"type": "directory", "path": p, "oid": oid(p)} for p in sorted(folders)] + entries


def validate_card(content: str) -> tuple[list[dict], list[dict]]:
    """The card checks of ``/api/validate-yaml`` this hub makes: YAML front matter that is a mapping,
    ``tags`` a list of strings, ``library_name`` a string. Returns (errors, warnings) as the Hub does."""
    import yaml

    match = re.match(r"^---\n(.*?)\n---(\n|$)", content, re.S)
    if match is None:
        return [], [{"message": "empty or missing yaml metadata in repo card"}]
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as error:
        return [{"message": f"invalid YAML: {error}"}], []
    errors = []
    if not isinstance(data, dict):
        return [{"message": "metadata must be a YAML mapping"}], []
    tags = data.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        errors.append({"message": f'"tags" must be a list of strings, got {tags!r}'})
    if "library_name" in data and not isinstance(data["library_name"], str):
        errors.append({"message": '"library_name" must be a string'})
    return errors, []


_API = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # quiet: requests are recorded in hub.requests
        pass

    # ------------------------------------------------------------------ plumbing
    def _body(self) -> bytes:
        return self._raw

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json", head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)
        self.hub.requests.append((self.command, self.path, status))

    def _json(self, status: int, data, head: bool = False) -> None:
        self._send(status, json.dumps(data).encode(), head=head)

    def _error(self, error: HubError, head: bool = False) -> None:
        headers = {"X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        if error.commit:
            headers["X-Repo-Commit"] = error.commit
        self._send(error.status, json.dumps({"error": error.message}).encode(), headers, head=head)

    def _dispatch(self, head: bool = False) -> None:
        if self.client_address[0] not in ("127.0.0.1", "::1"):
            self._send(403, b'{"error": "loopback only"}')
            return
        self._raw = self._read_body() if self.command == "POST" else b""  # always drain: keep-alive
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        base = f"http://{self.headers.get('Host')}"
        try:
            with self.hub._lock:
                self._route(parts.path, query, base, head)
        except HubError as error:
            self._error(error, head)

    def _require_auth(self) -> None:
        if not self.headers.get("Authorization"):
            raise HubError(401, "Invalid credentials in Authorization header")

    # ------------------------------------------------------------------ routes
    def _route(self, path: str, query: dict, base: str, head: bool) -> None:
        hub, method = self.hub, self.command
        if method == "GET" and path == "/api/whoami-v2":
            self._require_auth()
            self._json(200, {"type": "user", "name": "tester", "orgs": [],
                             "auth": {"accessToken": {"displayName": "test", "role": "write"}}})
            return
        if method == "GET" and path == "/api/agent-harnesses":  # the hf CLI's user-agent registry: empty
            self._json(200, {"standardEnvVars": [], "harnesses": {}})
            return
        if method == "POST" and path == "/api/validate-yaml":
            errors, warnings = validate_card(json.loads(self._body() or b"{}").get("content", ""))
            self._json(400 if errors else 200, {"errors": errors, "warnings": warnings})
            return
        if method == "POST" and path == "/api/repos/create":
            self._require_auth()
            status, data = hub.create_repo(json.loads(self._body() or b"{}"), base)
            self._json(status, data)
            return
        if match := _RESOLVE.match(path):
            if method not in ("GET", "HEAD"):
                raise HubError(405, f"{method} not allowed on resolve")
            repo = hub.repo("dataset" if match.group(1) else "model", match.group(2))
            commit = hub.commit_of(repo, unquote(match.group(3)))
            filename = "/".join(unquote(p) for p in match.group(4).split("/"))
            if filename not in commit.files:
                raise HubError(404, f"Entry not found: {filename}", "EntryNotFound", commit.oid)
            data = hub.blob(commit.files[filename])
            self._send(200, data, {"X-Repo-Commit": commit.oid, "ETag": f'"{git_blob_sha1(data)}"',
                                   "Accept-Ranges": "none"}, content_type="application/octet-stream", head=head)
            return
        if match := _API.match(path):
            repo_type = match.group(1)[:-1]
            repo = hub.repo(repo_type, match.group(2))
            rest = [unquote(p) for p in (match.group(3) or "").split("/") if p]
            self._repo_route(method, repo, rest, query, base)
            return
        hub.unknown_routes.append((method, path))
        raise HubError(404, f"no route {method} {path} in the local test hub")

    def _repo_route(self, method: str, repo: Repo, rest: list[str], query: dict, base: str) -> None:
        hub = self.hub
        action = rest[0] if rest else ""
        if method == "GET" and action in ("", "revision"):
            commit = hub.commit_of(repo, rest[1] if action == "revision" and len(rest) > 1 else "main")
            self._json(200, hub.info(repo, commit))
        elif method == "GET" and action == "tree" and len(rest) >= 2:
            commit = hub.commit_of(repo, rest[1])
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            self._json(200, hub.tree(commit, "/".join(rest[2:]), recursive))
        elif method == "GET" and action == "refs":
            ref = lambda kind, name, oid: {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": oid}  # noqa
            self._json(200, {"branches": [ref("heads", n, o) for n, o in repo.branches.items()],
                             "tags": [ref("tags", n, o) for n, o in repo.tags.items()], "converts": []})
        elif method == "POST" and action == "preupload" and len(rest) == 2:
            self._require_auth()
            hub.commit_of(repo, rest[1])
            files = json.loads(self._body()).get("files", [])
            self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                       for f in files]})
        elif method == "POST" and action == "commit" and len(rest) == 2:
            self._require_auth()
            lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
            self._json(200, hub.commit(repo, rest[1], lines, base))
        elif method == "POST" and action == "branch" and len(rest) == 2:
            self._require_auth()
            body = json.loads(self._body() or b"{}")
            if rest[1] in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{rest[1]}")
            repo.branches[rest[1]] = hub.commit_of(repo, body.get("startingPoint") or "main").oid
            self._json(200, {})
        elif method == "POST" and action == "tag" and len(rest) == 2:
            self._require_auth()
            body = json.loads(self._body() or b"{}")
            if body.get("tag") in repo.tags:
                raise HubError(409, f"Tag already exists: {body.get('tag')}")
            repo.tags[body["tag"]] = hub.commit_of(repo, rest[1]).oid
            self._json(200, {})
        else:
            hub.unknown_routes.append((method, self.path))
            raise HubError(404, f"no route {method} {self.path} in the local test hub")

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_POST(self) -> None:
        self._dispatch()


def hub_env(hub: LocalHub, home: Path) -> dict[str, str]:
    """Environment for a subprocess that should use ``hub`` as its Hub, with a fresh cache under ``home``."""
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) or k.startswith("HF_SJD_")}  # hf_sjd's own settings stay
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_TOKEN="hf_local_test_token",
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_IMPLICIT_TOKEN="0", NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env
