"""hvdlike.native: libraries built from hvdlike's sources once, under a lock, or a BuildError
saying why not."""
import ctypes
import multiprocessing
import shutil
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
