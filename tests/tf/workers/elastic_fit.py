"""Elastic Keras ``fit`` across a rank's death: run with ``hvdlikerun --elastic -np 4``.

Every rank fits the same model on its own shard (a function of its rank and the world size)
with hvdlike.elastic's KerasState and callbacks, committing after every epoch. The last rank
kills itself with SIGKILL in the middle of epoch 1. The survivors go back to the state
committed after epoch 0, set a new learning rate as Horovod's elastic Keras example does
(``tf.keras.backend.set_value(model.optimizer.lr, ...)``) and fit epochs 1.. on three
ranks. Checks: training finishes, every survivor has the same weights, and they equal a
single process that fits epoch 0 on the four shards' global batches and the later epochs
on the three survivors' global batches at the new learning rate.
``--with-ft ulfm`` is what lets the survivors go on. Under ``hvdlikerun --max-np 4`` a new
rank starts in place of the dead one: it runs this script from the top, joins in
``hvd.init()``, takes the committed state from rank 0, and epochs 1.. run on four ranks.
"""
import os
import signal

from common import check, close, hvd, np, tf  # noqa: F401

from hvdlike.tensorflow import compat
import hvdlike.tensorflow.keras as hvdk

keras = compat.keras()
BATCH, STEPS, EPOCHS, KILL_EPOCH, KILL_BATCH = 4, 5, 4, 1, 2
LR, LR_AFTER = 0.05, 0.03  # the learning rate before and after the reset
FIRST_SIZE = hvd.size()
VICTIM = FIRST_SIZE - 1
REPLACED = "HVDLIKE_ELASTIC_MAX_NP" in os.environ  # hvdlikerun --max-np
AFTER = FIRST_SIZE if REPLACED else FIRST_SIZE - 1  # ranks after the death


def shard(rank, size):
    rng = np.random.default_rng(100 * size + rank)
    x = rng.standard_normal((BATCH * STEPS, 6)).astype(np.float32)
    y = (x @ np.arange(1, 7, dtype=np.float32)[:, None] / 6).astype(np.float32)
    return x, y


def build(distributed):
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                              keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(LR, momentum=0.5)
    model.compile(optimizer=hvdk.DistributedOptimizer(opt) if distributed else opt, loss="mse")
    return model


class Victim(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (hvd.size() == FIRST_SIZE and hvd.rank() == VICTIM and self.epoch == KILL_EPOCH
                and batch == KILL_BATCH and not sizes.get(-1) and not hvdk.elastic.is_replacement()):
            print(f"KILLING rank={hvd.rank()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


model = build(distributed=True)
state = hvdk.elastic.KerasState(model, epoch=0, batch=0)
sizes = {}  # world size per epoch started; -1: reset seen


def on_state_reset():
    sizes[-1] = True
    # as Horovod's elastic Keras example does (tf_keras names; Keras 3 dropped `lr`)
    tf.keras.backend.set_value(state.model.optimizer.lr, LR_AFTER)


state.register_reset_callbacks([on_state_reset])


@hvdk.elastic.run
def train(state):
    x, y = shard(hvd.rank(), hvd.size())
    sizes[state.epoch] = hvd.size()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, initial_epoch=state.epoch,
              epochs=EPOCHS, callbacks=[
                  hvdk.elastic.CommitStateCallback(state, batches_per_commit=1000),
                  hvdk.elastic.UpdateBatchStateCallback(state),
                  hvdk.elastic.UpdateEpochStateCallback(state),
                  Victim()])


train(state)


@check("elastic_fit_finishes_on_the_survivors")
def _():
    assert hvd.size() == AFTER, hvd.size()
    assert state.epoch == EPOCHS and state.batch == 0, (state.epoch, state.batch)
    sizes.pop(-1, None)
    want = {KILL_EPOCH: AFTER} if hvdk.elastic.is_replacement() else {0: FIRST_SIZE,
                                                                      KILL_EPOCH: AFTER}
    assert sizes == want, sizes


@check("elastic_fit_weights_equal_across_survivors")
def _():
    for w in model.get_weights():
        every = hvd.allgather_object(w)
        for other in every:
            np.testing.assert_array_equal(other, w)


@check("elastic_fit_equals_one_process_with_the_same_ranks_from_the_commit_on")
def _():
    reference = build(distributed=False)
    for epoch in range(EPOCHS):
        size = FIRST_SIZE if epoch < KILL_EPOCH else AFTER
        if epoch == KILL_EPOCH:
            reference.optimizer.learning_rate.assign(LR_AFTER)
        shards = [shard(r, size) for r in range(size)]
        x = np.concatenate([s[0][i * BATCH:(i + 1) * BATCH] for i in range(STEPS) for s in shards])
        y = np.concatenate([s[1][i * BATCH:(i + 1) * BATCH] for i in range(STEPS) for s in shards])
        reference.fit(x, y, batch_size=BATCH * size, shuffle=False, verbose=0,
                      initial_epoch=epoch, epochs=epoch + 1)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


close()
