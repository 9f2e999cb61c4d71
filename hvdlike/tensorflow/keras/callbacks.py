"""Keras callbacks for hvdlike (names and behaviour follow horovod.keras.callbacks)."""
import contextlib
import numbers
import os
import shutil
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

import hvdlike as _core
from hvdlike import ProcessSet, global_process_set
from hvdlike.base.log import logger
from hvdlike.tensorflow import compat
from hvdlike.tensorflow.functions import broadcast_variables
from hvdlike.tensorflow.gradients import variable_key

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback", "MetricAverageCallback", "ModelCheckpoint",
           "UnevenDataCallback"]

_keras = compat.keras()

Logs = Optional[Dict[str, Any]]  # what Keras passes its callbacks


def _optimizer_variables(optimizer: Any) -> List[Any]:
    if optimizer is None:
        return []
    v = getattr(optimizer, "variables", [])
    return list(v() if callable(v) else v)


class BroadcastGlobalVariablesCallback(_keras.callbacks.Callback):
    """Make every rank start training from ``root_rank``'s model and optimizer state.

    At the beginning of every ``fit`` (so also after ``load_weights``/restoring a
    checkpoint between fits) the model's variables and the optimizer's variables
    (iterations, slots, loss scale) are broadcast from ``root_rank``.  If the optimizer
    creates its variables only during the first step, they are broadcast again after
    that step.  A model that is not built yet (a ``Sequential`` without an input shape,
    built by its first batch) is broadcast right after that first batch, as Horovod does.
    ``local_variables`` are left out.  Every rank must use this callback.
    """

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: Optional[Sequence[Any]] = None,
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        # variables every rank keeps its own value of (e.g. a PartialDistributedOptimizer's
        # local layers): not broadcast
        self._local = {variable_key(v) for v in (local_variables or [])}
        self._opt_count = None
        self._after_first_batch = False

    def _broadcast(self) -> int:
        opt_vars = _optimizer_variables(getattr(self.model, "optimizer", None))
        variables = [v for v in list(self.model.variables) + opt_vars
                     if variable_key(v) not in self._local]
        broadcast_variables(variables, self.root_rank, process_set=self.process_set)
        return len(opt_vars)

    def on_train_begin(self, logs: Logs = None) -> None:
        # every rank builds the same model, so every rank takes the same branch
        self._after_first_batch = not getattr(self.model, "built", True)
        self._opt_count = None if self._after_first_batch else self._broadcast()

    def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
        if self._after_first_batch:
            self._after_first_batch = False
            self._opt_count = self._broadcast()
        elif self._opt_count is not None and self._opt_count != len(
                _optimizer_variables(getattr(self.model, "optimizer", None))):
            self._opt_count = self._broadcast()


class MetricAverageCallback(_keras.callbacks.Callback):
    """Average the epoch's metrics (``logs``, including ``val_*``) over ranks at epoch end.

    Put it before callbacks that read the metrics (checkpointing, early stopping,
    learning-rate on plateau); Keras's progress bar and History run after user
    callbacks and so show and record the averaged values.  Every rank must use it.
    """

    def __init__(self, device: str = "",
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.process_set = process_set

    def _average(self, logs: Logs) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and
                      np.issubdtype(np.asarray(v).dtype, np.number))
        if not keys:
            return
        vals = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        avg = _core.allreduce(vals, op=_core.Average, name="MetricAverageCallback",
                              process_set=self.process_set)
        for k, v in zip(keys, avg):
            logs[k] = float(v)

    def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
        uneven = _UNEVEN.get(self.model)
        if uneven is not None:  # wherever it is in the list, ranks join before averaging
            uneven.join(epoch)
        self._average(logs)


# model -> its UnevenDataCallback in the running fit (other callbacks join through it first)
_UNEVEN: "weakref.WeakKeyDictionary[Any, UnevenDataCallback]" = weakref.WeakKeyDictionary()


class UnevenDataCallback(_keras.callbacks.Callback):
    """Let ranks run different numbers of steps in an epoch (uneven data).

    A rank whose data ends before the others' calls ``hvdlike.join()`` at the end of its
    epoch: until every rank has joined, it adds zeros to the others' gradient all-reduces
    (Average still divides by the number of ranks). Once every rank has joined, the model's
    and the optimizer's variables are broadcast from the rank that joined last (it ran the
    most steps, so it applied every update), and every rank goes on together. Rank 0 warns
    once per ``fit`` when the step counts differed, naming them. Without this callback such
    ranks end in a ``DeadlockError`` that names the counts. Put it first in ``callbacks``
    (``MetricAverageCallback`` joins through it wherever it is); every rank must use it.
    Global process set only, as ``join``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._steps = 0
        self._joined = -1  # the last epoch this rank joined at
        self._warned = False

    def on_train_begin(self, logs: Logs = None) -> None:
        _UNEVEN[self.model] = self
        self._joined, self._warned = -1, False

    def on_train_end(self, logs: Logs = None) -> None:
        _UNEVEN.pop(self.model, None)

    def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
        self._steps = 0

    def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
        self._steps = batch + 1

    def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
        self.join(epoch)

    def join(self, epoch: int) -> None:
        """Join the other ranks at the end of ``epoch`` (once an epoch)."""
        if self._joined == epoch:
            return
        self._joined = epoch
        last = _core.join()
        variables = list(self.model.variables) + _optimizer_variables(
            getattr(self.model, "optimizer", None))
        broadcast_variables(variables, last)
        steps = _core.allgather(np.array([self._steps], np.int64),
                                name="UnevenDataCallback.steps")
        if _core.rank() == 0 and not self._warned and len(set(steps.tolist())) > 1:
            self._warned = True
            logger.warning(
                f"epoch {epoch + 1}: the ranks ran different numbers of steps (per rank: "
                f"{steps.tolist()}); the ranks whose data ended first added zeros to the "
                "others' last gradient all-reduces and took the weights of the rank that ran "
                "the most (UnevenDataCallback). Shard so that every rank gets the same number "
                "of batches to avoid it.")


def _set_lr(optimizer: Any, lr: float) -> None:
    try:
        optimizer.learning_rate = lr
    except Exception as e:  # LearningRateSchedule or read-only learning rate
        raise ValueError("hvdlike learning-rate callbacks need an optimizer with a plain "
                         "(variable) learning rate, not a LearningRateSchedule; use one or "
                         f"the other ({e}).") from e


def _get_lr(optimizer: Any) -> float:
    return float(np.asarray(optimizer.learning_rate))


class LearningRateScheduleCallback(_keras.callbacks.Callback):
    """Set ``lr = initial_lr * multiplier(epoch)`` for epochs in ``[start_epoch, end_epoch)``.

    ``multiplier`` is a number or a function of the (fractional, when
    ``staircase=False``) epoch.  ``steps_per_epoch`` defaults to Keras's count.
    ``initial_lr`` defaults to the optimizer's learning rate at train begin.
    ``momentum_correction`` is accepted for Horovod compatibility; Keras 3 optimizers
    compile momentum as a constant, so it is not applied.
    """

    def __init__(self, initial_lr: Optional[float] = None,
                 multiplier: Union[float, Callable[[float], float]] = 1.0, start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0) -> None:
        super().__init__()
        where = type(self).__name__
        if not callable(multiplier) and (isinstance(multiplier, bool)
                                         or not isinstance(multiplier, numbers.Real)):
            raise TypeError(f"{where}: multiplier= takes a number or a function of the epoch, "
                            f"got {type(multiplier).__name__} {multiplier!r}")
        if end_epoch is not None and end_epoch < start_epoch:
            raise ValueError(f"{where}: end_epoch={end_epoch} is before start_epoch="
                             f"{start_epoch}, so the schedule would never apply; the epochs "
                             "it covers are [start_epoch, end_epoch)")
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"{where}: steps_per_epoch={steps_per_epoch}; pass at least 1, "
                             "or None for Keras's count")
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = None

    def _active(self, epoch: int) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def on_train_begin(self, logs: Logs = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")

    def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
        self.current_epoch = epoch
        if self._active(epoch) and (self.staircase or not self.steps_per_epoch):
            _set_lr(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_train_batch_begin(self, batch: int, logs: Logs = None) -> None:
        if self.staircase or not self.steps_per_epoch or not self._active(self.current_epoch):
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        _set_lr(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
        if logs is not None:
            logs["learning_rate"] = _get_lr(self.model.optimizer)
        if self.verbose and _core.rank() == 0:
            print(f"\nEpoch {epoch + 1}: learning rate {_get_lr(self.model.optimizer):.6g}")


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size()`` to ``initial_lr`` over
    ``warmup_epochs`` (per batch), as recommended for large global batches (Goyal et al.).
    """

    def __init__(self, initial_lr: Optional[float] = None, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0) -> None:
        if warmup_epochs < 0:
            raise ValueError(f"LearningRateWarmupCallback: warmup_epochs={warmup_epochs}; pass "
                             "0 (no warmup) or more")
        n = _core.size()

        def multiplier(epoch: float) -> float:
            epoch = min(epoch, warmup_epochs)
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr=initial_lr, multiplier=multiplier, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1:
            _set_lr(self.model.optimizer, self.initial_lr)
            if self.verbose and _core.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{self.initial_lr:.6g}.")


def _replace(tmp: str, path: str) -> None:
    """Put the finished ``tmp`` where ``path`` is: one atomic rename for a file; for a
    directory (a SavedModel) the old one is moved aside first, so ``path`` always holds a
    whole checkpoint or, for that moment, none."""
    if os.path.isdir(tmp) and os.path.exists(path):
        old = f"{tmp}.old"
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_saves(model: Any) -> Iterator[None]:
    """Within the block, ``model.save`` and ``model.save_weights`` write to a temporary name
    in the same directory (same ending, so Keras accepts the format) and rename it into place
    when it is complete: a process killed while writing leaves the previous file intact."""
    names = ("save", "save_weights")
    for name in names:
        original = getattr(model, name)

        def atomic(filepath: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            path = os.fspath(filepath)
            head, tail = os.path.split(path)
            tmp = os.path.join(head, f".tmp{os.getpid()}.{tail}")
            result = _original(tmp, *args, **kwargs)
            _replace(tmp, path)
            return result
        object.__setattr__(model, name, atomic)
    try:
        yield
    finally:
        for name in names:
            object.__delattr__(model, name)


class ModelCheckpoint(_keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint`` that writes only on rank 0, atomically.

    Every rank may use it (the others do nothing), so the same script runs on all
    ranks.  Use it after MetricAverageCallback when monitoring a metric.  Each checkpoint is
    written under a temporary name and renamed into place once complete, so a rank killed
    while writing leaves the previous checkpoint intact.
    """

    def __init__(self, *args: Any, root_rank: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hvd_writer = _core.rank() == root_rank

    def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
        if self._hvd_writer:
            with atomic_saves(self.model):
                super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
        if self._hvd_writer:
            with atomic_saves(self.model):
                super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs: Logs = None) -> None:
        if self._hvd_writer and hasattr(super(), "on_train_end"):
            with atomic_saves(self.model):
                super().on_train_end(logs)


class BestModelCheckpoint(ModelCheckpoint):
    """Rank-0 checkpoint of the best model so far (``save_best_only=True``)."""

    def __init__(self, filepath: Any, monitor: str = "val_loss", verbose: int = 0,
                 mode: str = "auto", save_freq: Union[str, int] = "epoch",
                 **kwargs: Any) -> None:
        super().__init__(filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         mode=mode, save_freq=save_freq, **kwargs)
