"""hvdlike.native: libraries built from hvdlike's sources once, under a lock, or a BuildError
saying why not."""
import ctypes
import multiprocessing
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from hvdlike.base import native

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc or gcc) on this machine")


def _source(tmp_path: Path, value: int = 7) -> Path:
    source = tmp_path / "answer.c"
    source.write_text(f"int answer(void) {{ return {value}; }}\n")
    return source


def _command(source: str, out: str):
    return [CC, "-shared", "-fPIC", "-o", out, source]


def _build_in(cache: str, source: str, queue) -> None:
    import os
    os.environ["XDG_CACHE_HOME"] = cache
    queue.put(native.build(Path(source), "answer", _command))


@needs_cc
def test_racing_processes_share_one_build_and_a_new_source_gets_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = _source(tmp_path)
    queue = multiprocessing.get_context("fork").Queue()
    racers = [multiprocessing.get_context("fork").Process(
        target=_build_in, args=(str(tmp_path / "cache"), str(source), queue)) for _ in range(3)]
    for p in racers:
        p.start()
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    paths = {queue.get(timeout=5) for _ in racers}
    assert len(paths) == 1
    built = paths.pop()
    assert Path(built).parent == tmp_path / "cache" / "hvdlike"
    assert [p.name for p in Path(built).parent.glob("*.so")] == [Path(built).name]
    assert ctypes.CDLL(built).answer() == 7
    _source(tmp_path, 8)
    rebuilt = native.build(source, "answer", _command)
    assert rebuilt != built and ctypes.CDLL(rebuilt).answer() == 8


def test_a_missing_compiler_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(native.BuildError, match="no compiler '/nonexistent/cc'"):
        native.build(_source(tmp_path), "answer",
                     lambda source, out: ["/nonexistent/cc", "-o", out, source])


@needs_cc
def test_a_failed_compile_says_what_the_compiler_said(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = tmp_path / "broken.c"
    source.write_text("int answer(void) { return }\n")
    with pytest.raises(native.BuildError, match="compiling broken.c failed .*error"):
        native.build(source, "broken", _command)
    assert not list((tmp_path / "hvdlike").glob("*.so"))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user (a file "
                                "owned by uid 65534) needs root")
OTHER_UID = 65534  # nobody: the other local user


@needs_cc
@needs_root
def test_a_library_planted_by_another_user_in_the_temporary_folder_is_never_loaded(
        tmp_path, monkeypatch):
    shared_tmp = tmp_path / "tmp"  # like /tmp: anyone may create files, sticky
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    unusable_cache = tmp_path / "not-a-folder"
    unusable_cache.write_text("")  # so the build falls back to the temporary folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(unusable_cache))
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    source = _source(tmp_path)
    # the other user made hvdlike-<uid> first, with a library of the computed name in it and
    # the lock file a link to a file of this user's
    planted = shared_tmp / f"hvdlike-{os.getuid()}"
    planted.mkdir(mode=0o777)
    name = native.file_name(source, "answer", _command)
    (tmp_path / "theirs").mkdir()
    subprocess.run(_command(str(_source(tmp_path / "theirs", 666)), str(planted / name)),
                   check=True)
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    (planted / f"{name}.lock").symlink_to(victim)
    for path in (planted, planted / name, planted / f"{name}.lock"):
        os.lchown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(native.BuildError, match=f"{planted}: .*belongs to uid {OTHER_UID}"):
        native.build(source, "answer", _command)
    assert victim.read_text() == "root's file"


@needs_cc
@needs_root
def test_a_cache_folder_of_another_user_is_passed_over_for_a_private_one(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "hvdlike").mkdir(parents=True)
    os.chown(cache / "hvdlike", OTHER_UID, OTHER_UID)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    built = Path(native.build(_source(tmp_path), "answer", _command))
    assert built.parent == tmp_path / "tmp" / f"hvdlike-{os.getuid()}"
    assert stat.S_IMODE(built.parent.stat().st_mode) == 0o700
    assert ctypes.CDLL(str(built)).answer() == 7
    assert not list((cache / "hvdlike").iterdir())
