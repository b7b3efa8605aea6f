"""hf_sjd.files: a multi-file artifact appears whole or not at all, and killed writes are cleaned up."""

import os
import subprocess
import sys

import pytest

from hf_sjd import files
from hf_sjd.files import atomic_folder, clean_leftovers, looks_local


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write(folder, **contents):
    for name, text in contents.items():
        (folder / name).write_text(text)


def snapshot(folder):
    return {p.name: p.read_text() for p in folder.iterdir()}


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_success_replaces_the_folder_as_a_whole(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    with atomic_folder(tmp_path / "out") as tmp:
        write(tmp, a="1", b="1")
    with atomic_folder(tmp_path / "out") as tmp:
        assert list(tmp.iterdir()) == []  # a fresh folder: nothing of the old run leaks into the new one
        write(tmp, a="2")
    assert snapshot(tmp_path / "out") == {"a": "2"}  # the old b is gone with the old folder
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left
    assert oct((tmp_path / "out").stat().st_mode & 0o777) == oct(0o777 & ~files._umask())


def test_renameat2_is_used_on_linux(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write(tmp_path / "a", x="a")
    if sys.platform.startswith("linux"):
        assert files._exchange(tmp_path / "a", tmp_path / "b")
        assert snapshot(tmp_path / "b") == {"x": "a"} and snapshot(tmp_path / "a") == {}


def test_failure_leaves_the_old_folder_and_no_temporary(tmp_path):
    with atomic_folder(tmp_path / "out") as tmp:
        write(tmp, a="old", b="old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_folder(tmp_path / "out") as tmp:
            write(tmp, a="new")
            raise KeyboardInterrupt  # an interrupt during the output phase
    assert snapshot(tmp_path / "out") == {"a": "old", "b": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(OSError):
        with atomic_folder(tmp_path / "fresh") as tmp:
            raise OSError("disk full")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # a failed first write leaves no folder at all


def test_leftovers_of_killed_writes_are_removed_and_a_half_swap_is_undone(tmp_path):
    pid = dead_pid()
    with atomic_folder(tmp_path / "out") as tmp:
        write(tmp, a="old")
    killed = tmp_path / f".out.tmp-{pid}-abc"  # a write killed while filling its temporary folder
    killed.mkdir()
    write(killed, a="half")
    alive = tmp_path / f".out.tmp-{os.getpid()}-live"  # a write still running in this process: kept
    alive.mkdir()
    with atomic_folder(tmp_path / "out") as tmp:
        write(tmp, a="new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name, "out"]
    assert snapshot(tmp_path / "out") == {"a": "new"}
    alive.rmdir()
    # Killed between "old folder aside" and "new folder in" (the fallback without renameat2): the old
    # folder is complete under .out.old-*; the next write (or clean_leftovers) puts it back first.
    os.rename(tmp_path / "out", tmp_path / f".out.old-{pid}-xyz")
    clean_leftovers(tmp_path / "out")
    assert snapshot(tmp_path / "out") == {"a": "new"} and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(NotADirectoryError, match="exists and is not a folder"):
        with atomic_folder(tmp_path / "out"):
            pass


@pytest.mark.parametrize("name, local", [
    ("./x", True), ("../x", True), ("/x", True), ("~/x", True), (".x/y", True), ("a/b/c", True),
    ("org/lib", False), ("lib", False), ("gpt2", False),
])
def test_looks_local(name, local):
    assert looks_local(name) is local
