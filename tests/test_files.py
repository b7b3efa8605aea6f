"""hf_sjd.files: a multi-file artifact appears whole or not at all, and killed writes are cleaned up."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_sjd import files
from hf_sjd.files import atomic_folder, check_parent_writable, clean_leftovers, looks_local


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write(folder, **contents):
    for name, text in contents.items():
        (folder / name).write_text(text)


def snapshot(folder):
    return {p.name: p.read_text() for p in folder.iterdir() if p.name != files.MARKER_FILE}


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


# -- check_output_folder: --out / --overwrite ------------------------------------------------------------
from hf_sjd.files import MARKER_FILE, check_output_folder  # noqa: E402


def test_overwrite_replaces_only_a_folder_this_program_wrote(tmp_path):
    out = tmp_path / "out"
    check_output_folder(out, overwrite=False)  # missing: fine
    out.mkdir()
    check_output_folder(out, overwrite=False)  # empty: fine
    with atomic_folder(out, mark=True) as tmp:
        write(tmp, a="1")
    assert sorted(p.name for p in out.iterdir()) == [MARKER_FILE, "a"]
    with pytest.raises(ValueError, match="--out .*not empty.*--overwrite"):
        check_output_folder(out, overwrite=False)
    check_output_folder(out, overwrite=True)  # ours, nothing added
    write(out, notes="mine")
    with pytest.raises(ValueError, match="--out .*did not write \\(notes\\)"):
        check_output_folder(out, overwrite=True)
    other = tmp_path / "photos"
    other.mkdir()
    write(other, img="x")
    with pytest.raises(ValueError, match="--out .*did not write"):
        check_output_folder(other, overwrite=True)
    write(other, **{MARKER_FILE: "{not json"})  # a broken marker is no marker
    with pytest.raises(ValueError, match="--out .*did not write"):
        check_output_folder(other, overwrite=True)
    assert snapshot(out) == {"a": "1", "notes": "mine"} and snapshot(other)["img"] == "x"  # nothing touched



def test_overwrite_refuses_a_file_added_inside_a_run_folder(tmp_path):
    """A finished run's marker lists every file it wrote, so a file added in one of its subfolders is refused too."""
    out = tmp_path / "out"
    with atomic_folder(out, mark=True) as tmp:
        (tmp / "sjd").mkdir()
        write(tmp / "sjd", **{"coffee-0.png": "img"})
    check_output_folder(out, overwrite=True)
    write(out / "sjd", notes="mine")
    with pytest.raises(ValueError, match=r"--out .*did not write \(sjd/notes\)"):
        check_output_folder(out, overwrite=True)


def test_a_failed_first_write_removes_the_parent_folders_it_made(tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        with atomic_folder(tmp_path / "runs" / "today" / "out"):
            raise SystemExit(143)  # what hf-sjd makes of SIGTERM
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    real_fdopen = os.fdopen

    class DiskFull:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: DiskFull(real_fdopen(fd, mode)))
    with pytest.raises(OSError, match="No space"):  # one file (a cost profile, a bench record)
        files.atomic_write_text(tmp_path / "kept" / "profiles" / "cpu" / "costs.json", "{}")
    assert [p.name for p in tmp_path.rglob("*")] == ["kept"]


def test_sigterm_stops_a_command_as_ctrl_c_does(tmp_path):
    """SIGTERM (kill, timeout, a scheduler) exits 143 and leaves nothing partial: no temporary folder, no parents."""
    import signal
    import time

    root = tmp_path / "runs"
    child = subprocess.Popen([sys.executable, "-m", "hf_sjd", "generate", "coffee", "--num-images", "64", "--method",
                              "ar", "--threads", "1", "--out", str(root / "today" / "out")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(tmp_path.rglob("*.png")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 143
    assert list(tmp_path.iterdir()) == []


def test_overwrite_refuses_root_home_and_the_current_folder_or_above(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for path, what in ((".", "the current folder"), (str(work), "the current folder"), ("..", "above"),
                       (str(tmp_path), "above"), ("/", "the root folder"), ("~", "the home folder"),
                       (str(tmp_path / "home"), "the home folder")):
        for overwrite in (False, True):
            with pytest.raises(ValueError, match=f"--out '{re.escape(path)}' is .*{what}"):
                check_output_folder(path, overwrite=overwrite)
    check_output_folder("sub", overwrite=True)  # a folder below the current one is fine
    with pytest.raises(ValueError, match="--model-out .*not a folder"):
        (work / "file").write_text("x")
        check_output_folder("file", overwrite=True, flag="--model-out")


def test_a_parent_the_file_system_refuses_is_found_before_any_work(tmp_path, monkeypatch):
    """``os.access`` reads the mode bits, which root passes where the file system refuses a new folder (/proc,
    a root-squashed NFS): the check makes one, as the save will."""
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda *args, **kwargs: (_ for _ in ()).throw(
        FileNotFoundError(2, "No such file or directory")))
    with pytest.raises(ValueError, match="--out .*out' is not writable"):
        check_parent_writable(tmp_path / "out")
    monkeypatch.undo()
    check_parent_writable(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing
    if os.access("/proc", os.W_OK) and Path("/proc/self").is_dir():  # root on Linux: the real case
        with pytest.raises(ValueError, match="not writable"):
            check_parent_writable("/proc/hf_sjd-out")


def test_save_into_a_folder_whose_parent_is_not_writable_says_why(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()

    def refuse(*args, **kwargs):  # tests run as root, where chmod cannot make a folder read-only
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkdtemp", refuse)
    with pytest.raises(PermissionError, match=f"cannot write {re.escape(str(out))}: .*parent folder "
                                              f"{re.escape(str(tmp_path))} is not writable"):
        with atomic_folder(out):
            pass


def test_an_atomic_write_leaves_the_usual_permissions(tmp_path):
    import os
    import stat
    from hf_sjd.files import atomic_write_bytes

    umask = os.umask(0o022)
    os.umask(umask)
    atomic_write_bytes(tmp_path / "out.bin", b"x")
    assert stat.S_IMODE(os.stat(tmp_path / "out.bin").st_mode) == 0o666 & ~umask
