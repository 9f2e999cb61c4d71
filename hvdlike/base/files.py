"""Files hvdlike writes: ones that survive a kill (the elastic state, the parameter servers'
checkpoints), and ones in folders other users may write to (``/tmp``), opened so that a file
or link planted there by someone else is refused rather than written through or loaded."""
import os
import pickle
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def write_atomically(path: str, snapshot: Any) -> None:
    """Write ``snapshot`` to ``path`` so that a kill at any moment leaves the previous file
    or the new one, never a torn one: a temporary file in the same folder, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def private_folder(path: PathLike) -> Path:
    """``path``, created (mode 0700) if missing, checked to be this user's own: a folder, not
    a symbolic link, owned by this user and writable by no one else. PermissionError saying
    what is wrong and what to do otherwise (another user may have made it to plant files)."""
    folder = Path(path)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{folder} is a symbolic link or a file, not a folder: remove it")
    _check_owned(folder, st)
    return folder


def is_own_file(path: PathLike) -> bool:
    """Whether ``path`` is a regular file (not a link) owned by this user and writable by no
    one else; False when it is missing. PermissionError when it exists but is someone else's
    or others may write it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise PermissionError(f"{path} is not a regular file: remove it")
    _check_owned(Path(path), st)
    return True


def open_for_writing(path: PathLike, newline: Optional[str] = None,
                     mode: int = 0o666) -> IO[str]:
    """``path`` opened to write text from its start, created with ``mode`` (less the umask)
    when missing. A symbolic link, a file of another user or anything but a regular file
    there is refused with PermissionError (never written through), so a path in a shared
    folder such as ``/tmp`` cannot be turned into a write to someone else's file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise PermissionError(f"{path} is a symbolic link; hvdlike does not write through "
                                  "links (another user may have planted it): remove it or "
                                  "choose a path in a folder of your own") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path} is not a regular file: choose another path")
        _check_owned(Path(path), st, others_may_write=True)
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "w", newline=newline)


def _check_owned(path: Path, st: os.stat_result, others_may_write: bool = False) -> None:
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): "
            "another user may have made it; remove it or choose a path in a folder of your own")
    if not others_may_write and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is writable by other users (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}): run chmod go-w on it")
