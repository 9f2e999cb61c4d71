"""Elastic training on MPI: keep training when ranks die (Horovod's ``hvd.elastic`` API).

Under an MPI with ULFM (``hvdlikerun --elastic``, Open MPI 5 ``--with-ft ulfm``) a dead rank
does not end the job: the survivors' collectives raise ``RanksFailedError``. ``run`` catches
it, restores the state last committed, shrinks the world to the survivors
(``MPI_Comm_shrink``), with ``HVDLIKE_ELASTIC_MAX_NP`` (``hvdlikerun --max-np``) starts new
processes of the same program in place of the dead (``MPI_Comm_spawn``; they join in
``hvd.init()`` and take the state in their first ``sync()``), restarts hvdlike on that
world, calls the state's reset callbacks, syncs the state from the new rank 0 and calls the
training function again::

    state = hvd.elastic.ObjectState(step=0, weights=w)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            ...
            state.step += 1
            state.commit()

    train(state)

``HVDLIKE_STATE_DIR`` (``hvdlikerun --state-dir``): ``commit()`` also writes the state there
(rank 0, under a temporary name renamed into place), and ``run`` starts from that file when
it exists, so a job relaunched by ``hvdlikerun --restarts K``, on any MPI, resumes from its
last commit. TensorFlow states (``TensorFlowKerasState``, ``KerasState``, ...) load with
TensorFlow on first use.
"""
import copy
import functools
import importlib
import os
import pickle
from typing import Any, Callable, Dict, List, Optional, TypeVar

from . import control_collectives, runtime
from .base import files
from .base.errors import HostsUpdatedInterrupt, RanksFailedError  # noqa: F401 - Horovod's names
from .base.log import logger
from .runtime import recovery_deadline, shrink

_STATE_FILE = "elastic_state.pkl"

HorovodInternalError = RanksFailedError

_F = TypeVar("_F", bound=Callable[..., Any])


class State:
    """What training must keep across a failure. Subclasses say what a snapshot is.

    ``commit()`` keeps a snapshot (and writes it under ``HVDLIKE_STATE_DIR``); ``restore()``
    goes back to it; ``sync()`` gives every rank rank 0's state. Commit often enough that
    little work is lost, seldom enough that the copies cost little (Horovod's advice too).
    """

    def __init__(self) -> None:
        self._reset_callbacks: List[Callable[[], None]] = []
        self._saved: Optional[Dict[str, Any]] = None

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called after the world changed and before the state is synced, e.g. to
        scale the learning rate to the new ``size()`` or register process sets again."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def save(self) -> None:
        """Keep a snapshot in memory."""
        self._saved = self._snapshot()

    def restore(self) -> None:
        """Go back to the last snapshot (the one ``__init__`` took, before any commit)."""
        if self._saved is not None:
            self._apply(self._saved)

    def commit(self) -> None:
        """Save, and write the snapshot under ``HVDLIKE_STATE_DIR`` (rank 0) when it is set."""
        self.save()
        self.check_host_updates()
        directory = os.environ.get("HVDLIKE_STATE_DIR")
        if directory and runtime.rank() == 0:
            files.write_atomically(os.path.join(directory, _STATE_FILE), self._saved)

    def check_host_updates(self) -> None:
        """Horovod raises HostsUpdatedInterrupt here when hosts joined; hvdlike has no host
        discovery (it replaces dead ranks during the reset instead), so there is nothing to
        check."""

    def sync(self) -> None:
        """Every rank takes rank 0's state (collective), then saves it."""
        snapshot = control_collectives.broadcast_object(
            self._snapshot() if runtime.rank() == 0 else None, root_rank=0,
            name="hvdlike.elastic.sync")
        self._apply(snapshot)
        self.save()

    def _snapshot(self) -> Dict[str, Any]:
        raise NotImplementedError

    def _apply(self, snapshot: Dict[str, Any]) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Picklable Python values as attributes: ``ObjectState(epoch=0, batch=0)``, then
    ``state.epoch += 1``. Snapshots are deep copies."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.save()

    def _snapshot(self) -> Dict[str, Any]:
        return {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def _apply(self, snapshot: Dict[str, Any]) -> None:
        for name, value in snapshot.items():
            setattr(self, name, copy.deepcopy(value))


def run(func: _F) -> _F:
    """Decorate the training function ``func(state, ...)``: it is called again on the
    survivors (and the ranks started in place of the dead), from the last committed state,
    each time ranks die. Without ULFM a failure
    ends the job as usual; with ``HVDLIKE_STATE_DIR`` the first call starts from the
    committed state on disk."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(f"hvdlike.elastic.run: {func.__name__} must be called with an "
                            "hvdlike.elastic State first (ObjectState, or a framework's "
                            f"TensorFlowKerasState / TensorFlowState), got {type(state).__name__}")
        # bad values: an error now, not later
        min_size, max_size = _min_size(), _max_size()
        deadline = recovery_deadline.seconds(os.environ)
        _load_committed(state)
        reset = False
        while True:
            try:
                if reset:
                    shrink.shrink_after_failure(min_size, max_size, deadline)
                    state.on_reset()
                state.sync()
                return func(state, *args, **kwargs)
            except BaseException as exc:
                if runtime.failure() is None:
                    raise
                ender = runtime.ended_by()
                if ender is not None:  # a bug, not a crash: recovering would only repeat it
                    raise RuntimeError(
                        f"hvdlike.elastic: rank {ender} ended the job on an uncaught exception "
                        "(its traceback is in its output); the survivors end too instead of "
                        "recovering") from exc
                logger.info(f"elastic: {type(exc).__name__} after ranks died; restoring the "
                            "last committed state and going on with the survivors")
                state.restore()
                reset = True

    return wrapper  # type: ignore[return-value]


def is_replacement() -> bool:
    """True in a process started in place of a dead rank (``hvdlikerun --max-np``): it runs
    the script from its start and joins the survivors in ``hvd.init()``."""
    return runtime.is_replacement()


def _min_size() -> int:
    return max(1, _whole_number("HVDLIKE_ELASTIC_MIN_NP", "1"))


def _max_size() -> int:
    """``hvdlikerun --max-np``: replace dead ranks up to this many (0: never)."""
    return _whole_number("HVDLIKE_ELASTIC_MAX_NP", "0")


def _whole_number(variable: str, default: str) -> int:
    value = os.environ.get(variable, default)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{variable}={value!r} is not a whole number") from None


def _load_committed(state: State) -> None:
    """Rank 0 loads the committed state from ``HVDLIKE_STATE_DIR`` when there is one (the
    job was restarted); ``sync()`` then hands it to every rank."""
    directory = os.environ.get("HVDLIKE_STATE_DIR")
    if not directory or runtime.rank() != 0:
        return
    path = os.path.join(directory, _STATE_FILE)
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # written by this job's rank 0 (docs/security.md)
    state._apply(snapshot)
    state.save()
    logger.warning(f"elastic: resuming from the state committed in {path}")


_LAZY_NAMES = {  # loaded on first use: TensorFlow
    "hvdlike.tensorflow.elastic": ("TensorFlowKerasState", "TensorFlowState"),
    "hvdlike.tensorflow.keras.elastic": ("KerasState", "CommitStateCallback",
                                         "UpdateBatchStateCallback", "UpdateEpochStateCallback"),
}
_LAZY_MODULE_OF = {name: module for module, names in _LAZY_NAMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _LAZY_MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'hvdlike.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
