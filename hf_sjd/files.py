"""Atomic writes: every output of the CLI, the benchmarks, the scripts and the phrase library goes through here,
so an interrupted run never leaves a half-written file, or a mix of old and new files, under its final name.

* :func:`atomic_write_bytes` / :func:`atomic_write_text`: one file, written to a temporary name and renamed.
* :func:`atomic_folder`: a multi-file artifact, written into a sibling temporary folder that replaces the target
  *as a whole* on success. Invariant: the target always holds the complete old folder or the complete new one
  (one ``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two renames, the old folder kept under
  ``.NAME.old-PID-*`` until the next write puts it back or removes it).
* :func:`check_output_folder`: the early check of a command's ``--out`` (and ``--overwrite``).
* :func:`looks_local`: whether a name is clearly a local path (never to be sent to the Hub as a repo id).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _make_parents(path: Path) -> list[Path]:
    """Make ``path``'s missing parent folders; those made, deepest first (for :func:`_remove_made`)."""
    created = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    return created


def _remove_made(created: list[Path]) -> None:
    """A failed write leaves no folder it made either (those still empty)."""
    for folder in created:
        with contextlib.suppress(OSError):
            folder.rmdir()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file in the same folder, then rename it to ``path`` (with the usual
    ``0666 & ~umask`` permissions; ``mkstemp`` alone would leave it 0600)."""
    path = Path(path)
    created, tmp = _make_parents(path), None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        _remove_made(created)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


# -- folders ------------------------------------------------------------------------------------------------
def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported.

    Hand-written because ``os`` has no ``renameat2`` and no library in use wraps it."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    # nonzero: ENOSYS / EINVAL (a file system without exchange): the caller falls back to two renames
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    return True


def clean_leftovers(path: str | Path) -> None:
    """Remove what killed :func:`atomic_folder` writes to ``path`` left behind (``.NAME.tmp|old-PID-*`` of processes
    that are gone); if ``path`` itself is missing because a write died between its two renames, put the old
    folder back first."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(tmp|old)-(\d+)-")
    leftovers = [(match.group(1), entry) for entry in (path.parent.iterdir() if path.parent.is_dir() else ())
                 if (match := pattern.match(entry.name)) and not _pid_alive(int(match.group(2)))]
    olds = sorted((p for kind, p in leftovers if kind == "old"), key=lambda p: p.stat().st_mtime_ns)
    if olds and not os.path.lexists(path):
        os.rename(olds.pop(), path)
    for _, folder in leftovers:
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)


MARKER_FILE = ".hf_sjd-output.json"  # what atomic_folder(mark=True) wrote: the file names of that run


def mark_folder(folder: Path, names=None) -> None:
    """Write :data:`MARKER_FILE` into ``folder``: the top-level ``names`` a run writes (default: what it holds) and,
    for a finished run (``names`` not given), every file it holds: ``--overwrite`` then replaces nothing else, at
    any depth (:func:`check_output_folder`)."""
    marker = {"written_by": "hf_sjd", "files": sorted(names or (p.name for p in folder.iterdir()))}
    if names is None:
        marker["tree"] = _tree(folder)
    atomic_write_bytes(folder / MARKER_FILE, (json.dumps(marker) + "\n").encode())


def _tree(folder: Path) -> list[str]:
    """Every file below ``folder`` (links as files, not followed), as posix paths relative to it, the marker aside."""
    found = []
    for root, dirs, files in os.walk(folder):
        found += [Path(root, name).relative_to(folder).as_posix() for name in files]
        found += [Path(root, name).relative_to(folder).as_posix() for name in dirs if Path(root, name).is_symlink()]
    return sorted(set(found) - {MARKER_FILE})


@contextlib.contextmanager
def atomic_folder(path: str | Path, *, mark: bool = False) -> Iterator[Path]:
    """Yield an empty sibling temporary folder; on success it replaces ``path`` (symlinks resolved) as a whole,
    on failure it is removed. Callers decide whether replacing ``path`` is allowed (``--overwrite``). ``mark``:
    leave :data:`MARKER_FILE` listing the files, by which :func:`check_output_folder` knows a folder it wrote.

        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> with atomic_folder(root / "out") as tmp:
        ...     _ = (tmp / "a.txt").write_text("a")
        >>> sorted(p.name for p in (root / "out").iterdir())
        ['a.txt']
    """
    check_not_special(path, "the output folder")  # every caller checks its own flag first; this is the last guard
    path = Path(os.path.realpath(os.path.expanduser(path)))
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a folder")
    created = _make_parents(path)
    clean_leftovers(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    except OSError as error:
        raise PermissionError(
            f"cannot write {path}: it is replaced as a whole by a new folder built next to it, and its parent "
            f"folder {path.parent} is not writable ({error.strerror}). Save into a folder whose parent is "
            "writable") from None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700
        yield tmp
        if mark:
            mark_folder(tmp)
        if not path.exists():
            os.rename(tmp, path)
        elif _exchange(tmp, path):
            shutil.rmtree(tmp)  # now the old folder
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{os.getpid()}-", dir=path.parent))
            os.rmdir(old)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not path.exists():
            _remove_made(created)


def _marked_files(folder: Path) -> tuple[set[str], set[str] | None] | None:
    """(top-level names, every file or None) that a marked run wrote into ``folder`` (:func:`mark_folder`); None if
    it holds no valid marker."""
    try:
        marker = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(marker, dict) or marker.get("written_by") != "hf_sjd":
        return None
    names, tree = marker.get("files"), marker.get("tree")
    if not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in (names, tree or [])):
        return None
    return set(names), None if tree is None else set(tree)


def check_output_folder(path: str | Path, overwrite: bool, flag: str = "--out") -> None:
    """Refuse an output folder before any work (``ValueError`` naming ``flag``): ``path`` must be a missing or
    empty folder (``overwrite``: or one this program wrote that holds nothing else), not special
    (:func:`check_not_special`), and :func:`check_parent_writable`."""
    shown = str(path)
    target = Path(os.path.realpath(os.path.expanduser(path)))
    check_not_special(path, flag)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{flag} {shown!r} exists and is not a folder")
    if target.is_dir():
        entries = {p.name for p in target.iterdir()}
        if entries and not overwrite:
            raise ValueError(f"{flag} {shown!r} exists and is not empty; pass --overwrite to replace the outputs "
                             "of an earlier run as a whole")
        if entries:
            marked = _marked_files(target)
            if marked is None:
                raise ValueError(f"{flag} {shown!r} holds files this program did not write; --overwrite replaces "
                                 "only an earlier run's output folder. Pass a new or empty folder")
            written, tree = marked
            other = sorted(entries - written - {MARKER_FILE})
            if tree is not None:  # a finished run: any file it did not write, at any depth
                other += sorted(set(_tree(target)) - tree - set(other))
            if other:
                raise ValueError(f"{flag} {shown!r} holds files an earlier run did not write ("
                                 f"{', '.join(other[:5])}{' ...' if len(other) > 5 else ''}); --overwrite would "
                                 "delete them. Move them away or pass another folder")
    check_parent_writable(path, flag)


def check_not_special(path: str | Path, flag: str = "--out") -> None:
    """``ValueError`` naming ``flag`` if ``path`` is the root, the home folder, the current folder or a folder
    above it: replacing one of them as a whole would delete far more than outputs (and leave the process, or
    the shell that started it, in a deleted folder)."""
    target = Path(os.path.realpath(os.path.expanduser(path)))
    try:
        cwd = Path(os.path.realpath(os.getcwd()))
    except FileNotFoundError:  # the current folder was deleted: nothing to protect there
        cwd = None
    home = Path(os.path.realpath(os.path.expanduser("~")))
    if target == Path(target.anchor) or target == home or target == cwd or (cwd and target in cwd.parents):
        what = ("the root folder" if target == Path(target.anchor) else "the home folder" if target == home
                else "the current folder" if target == cwd else "a folder above the current folder")
        raise ValueError(f"{flag} {str(path)!r} is {what}; outputs replace their folder as a whole, so pass a "
                         "folder of their own (e.g. out/)")


def check_parent_writable(path: str | Path, flag: str = "--out") -> None:
    """``ValueError`` naming ``flag`` unless :func:`atomic_folder` can write ``path``: its nearest existing parent,
    where the new folder is built, must be writable (even when ``path`` itself is)."""
    shown = str(path)
    target = Path(os.path.realpath(os.path.expanduser(path)))
    parent = next((p for p in target.parents if p.exists()), Path(target.anchor))
    writable = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    if writable:  # os.access trusts the mode bits, which root passes where the file system refuses (/proc, NFS)
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".hf_sjd-probe-", dir=parent))
        except OSError:
            writable = False
    if not writable:
        raise ValueError(f"{flag} {shown!r} is not writable: its folder {str(parent)!r} is not a writable folder, "
                         "and the output is built next to it and swapped in whole (so an interrupted write never "
                         "leaves a half-written folder); pass a folder inside a writable one")


def looks_local(name: str) -> bool:
    """True for what can only be a local path: absolute, ``~``/``.``-prefixed (``./x``, ``../x``, ``.x/y``),
    more than one ``/`` or a non-``/`` separator, or ``a/b`` whose ``a`` exists here. A Hub repo id is
    ``name`` or ``namespace/name`` and starts with a letter or digit."""
    name = str(name)
    if os.path.isabs(name) or name.startswith(("~", ".")) or name.count("/") > 1:
        return True
    if os.sep != "/" and os.sep in name or os.altsep and os.altsep != "/" and os.altsep in name:
        return True
    return "/" in name and os.path.isdir(name.split("/")[0])
