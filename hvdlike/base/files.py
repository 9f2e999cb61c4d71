"""Files that survive a kill: the elastic state and the parameter servers' checkpoints."""
import os
import pickle
import tempfile
from typing import Any


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
