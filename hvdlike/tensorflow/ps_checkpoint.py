"""A parameter server's checkpoint: its shard of the weights, its optimizer's state and its
counts, one file per server in ``checkpoint_dir``, written atomically."""
import os
import pickle
import tempfile
from typing import Any, Dict, List, Optional

from hvdlike.base.files import write_atomically


def path(checkpoint_dir: str, server_index: int, num_servers: int) -> str:
    return os.path.join(checkpoint_dir, f"ps_shard{server_index}_of{num_servers}.pkl")


def check_writable(checkpoint_dir: str, rank: int) -> None:
    """Raise a ValueError saying what to do unless this server can write ``checkpoint_dir``
    (made if missing)."""
    try:
        os.makedirs(checkpoint_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=checkpoint_dir):
            pass
    except OSError as e:
        raise ValueError(f"ParameterServerTraining: server rank {rank} cannot write "
                         f"checkpoint_dir {checkpoint_dir!r} ({e}); pass a folder that every "
                         "server can create and write") from e


def save(file: str, shard_vars: List[Any], optimizer: Any, updates: int,
         pushes_applied: int) -> None:
    snapshot = {"weights": [v.numpy() for v in shard_vars],
                "optimizer": [v.numpy() for v in _variables_of(optimizer)],
                "updates": updates, "pushes_applied": pushes_applied}
    write_atomically(file, snapshot)


def load(file: str, shard_vars: List[Any], optimizer: Any) -> Optional[Dict[str, int]]:
    """Assign the checkpoint's weights and optimizer state, if ``file`` exists; returns its
    ``updates`` and ``pushes_applied`` (None without a checkpoint)."""
    if not os.path.exists(file):
        return None
    with open(file, "rb") as f:
        snapshot = pickle.load(f)  # written by this job's server (docs/security.md)
    for v, value in zip(shard_vars, snapshot["weights"]):
        v.assign(value)
    if snapshot["optimizer"]:
        optimizer.build(shard_vars)
        for v, value in zip(_variables_of(optimizer), snapshot["optimizer"]):
            v.assign(value)
    return {"updates": snapshot["updates"], "pushes_applied": snapshot["pushes_applied"]}


def _variables_of(optimizer: Any) -> List[Any]:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)
