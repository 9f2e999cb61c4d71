"""Elastic Keras training (``horovod.tensorflow.keras.elastic``'s names)::

    state = hvd.elastic.KerasState(model, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, initial_epoch=state.epoch, epochs=epochs, callbacks=[
            hvd.elastic.UpdateEpochStateCallback(state),
            hvd.elastic.CommitStateCallback(state, batches_per_commit=100)])

Commits happen at the start of a batch (or epoch, or at the end of training) once the
previous one has ended, so they see what the update callbacks recorded whatever their order
in the list.
"""
from typing import Any

from hvdlike.elastic import ObjectState, State, is_replacement, run  # noqa: F401 - re-exported
from hvdlike.tensorflow import compat
from hvdlike.tensorflow.elastic import TensorFlowKerasState

keras = compat.keras()  # Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1


class KerasState(TensorFlowKerasState):
    """The model's weights, its optimizer's variables and picklable attributes
    (``epoch``, ``batch``, ...)."""


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and after every epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if int(batches_per_commit) < 1:
            raise ValueError(f"batches_per_commit must be at least 1, got {batches_per_commit}")
        self.state, self.batches_per_commit = state, int(batches_per_commit)
        self._ended = 0  # batches ended since the last commit

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._ended >= self.batches_per_commit:
            self._commit()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._ended += 1

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self._ended:
            self._commit()

    def on_train_end(self, logs: Any = None) -> None:
        if self._ended:
            self._commit()

    def _commit(self) -> None:
        self.state.commit()
        self._ended = 0


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` = the batches of this epoch done (0 again after each epoch)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` = the next epoch to run: pass it as ``fit(initial_epoch=...)``."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = epoch + 1
