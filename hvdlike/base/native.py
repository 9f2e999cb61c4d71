"""Shared libraries hvdlike builds from its own sources on first use.

Built once per source (the file name carries a hash of the source and of the build command)
into ``~/.cache/hvdlike`` (``$XDG_CACHE_HOME/hvdlike``), or ``hvdlike-<uid>`` in the temporary
folder where that cannot be used. Either folder is used only while it is this user's own and
writable by no one else, and a library is loaded only from a file of this user's: the file
name can be computed in advance, so another user of the machine could otherwise plant a
library there that this user's processes (root's launcher included) would load. Ranks of one
job that need it at once wait for one build (a file lock) instead of each compiling.
"""
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, List

from . import files


class BuildError(RuntimeError):
    """The library could not be built here (the reason is the message)."""


def cache_dir() -> Path:
    """The per-user directory hvdlike builds into."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hvdlike"


def file_name(source: Path, stem: str, command: Callable[[str, str], List[str]]) -> str:
    """The library's file name: ``stem``, a hash of the source and the build command."""
    probe = command(str(source), "OUT")
    digest = hashlib.sha256(source.read_bytes() + "\0".join(probe).encode()).hexdigest()[:12]
    return f"{stem}-{digest}.so"


def build(source: Path, stem: str, command: Callable[[str, str], List[str]],
          timeout: float = 300.0) -> str:
    """Path of the shared library built from ``source`` by ``command(source, output)``,
    building it on first use; raises ``BuildError`` saying why it cannot be built."""
    if not sys.platform.startswith("linux"):
        raise BuildError(f"hvdlike builds its native parts on Linux only, not {sys.platform}")
    name = file_name(source, stem, command)
    reasons = []
    for directory in (cache_dir(), Path(tempfile.gettempdir()) / f"hvdlike-{os.getuid()}"):
        target = directory / name
        try:
            files.private_folder(directory)
            if files.is_own_file(target):
                return str(target)
            lock = os.open(directory / f"{name}.lock",
                           os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it
                if not files.is_own_file(target):
                    _compile(command, source, directory, target, timeout)
            finally:
                os.close(lock)
            return str(target)
        except OSError as exc:
            reasons.append(f"{directory}: {exc}")
    raise BuildError("no private folder of this user's to build in (" + "; ".join(reasons)
                     + "); set XDG_CACHE_HOME to a folder of your own")


def _compile(command: Callable[[str, str], List[str]], source: Path, directory: Path,
             target: Path, timeout: float) -> None:
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        built = Path(scratch) / target.name
        argv = command(str(source), str(built))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise BuildError(f"no compiler {argv[0]!r} (install one, or set $CC / $CXX)")
        except subprocess.TimeoutExpired:
            raise BuildError(f"compiling {source.name} took over {timeout:.0f} s")
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line]
            raise BuildError(f"compiling {source.name} failed ({argv[0]}): "
                             + ("\n".join(errors[:5]) or done.stderr[-2000:]))
        os.chmod(built, 0o755)  # whatever the umask: writable by this user alone
        os.replace(built, target)  # atomic: other jobs see a whole file or none
