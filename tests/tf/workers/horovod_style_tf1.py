# A training script in the style of Horovod's README (TF1 API through tf.compat.v1, a
# MonitoredTrainingSession, checkpoints on rank 0 only). Only the import line differs:
# `import horovod.tensorflow as hvd` -> `import hvdlike.tensorflow as hvd`.
# Arguments: CHECKPOINT_DIR LAST_STEP. Prints each rank's weights when its session has
# started (after the broadcast hook) and when it ends, for the test to compare.
import sys

import numpy as np
import tensorflow as tf
import hvdlike.tensorflow as hvd

tf.compat.v1.disable_eager_execution()

hvd.init()

# a linear model on rank-dependent random batches
rng = np.random.RandomState(hvd.rank())
x = tf.compat.v1.placeholder(tf.float32, [None, 4])
y = tf.compat.v1.placeholder(tf.float32, [None, 1])
w = tf.compat.v1.get_variable("w", [4, 1])
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))

# the learning rate scaled by the number of ranks, gradients averaged over them
opt = tf.compat.v1.train.AdagradOptimizer(0.01 * hvd.size())
opt = hvd.DistributedOptimizer(opt)

# every rank starts from rank 0's variables
hooks = [hvd.BroadcastGlobalVariablesHook(0),
         tf.compat.v1.train.StopAtStepHook(last_step=int(sys.argv[2]))]


class Report(tf.compat.v1.train.SessionRunHook):
    def after_create_session(self, session, coord):
        print(f"START rank={hvd.rank()} w={session.run(w).ravel().tolist()}", flush=True)

    def end(self, session):
        print(f"END rank={hvd.rank()} w={session.run(w).ravel().tolist()}", flush=True)


hooks.append(Report())

train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())

# only rank 0 writes (and restores) checkpoints
checkpoint_dir = sys.argv[1] if hvd.rank() == 0 else None

with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir,
                                                 hooks=hooks) as mon_sess:
    while not mon_sess.should_stop():
        xb = rng.randn(8, 4).astype(np.float32)
        mon_sess.run(train_op, feed_dict={x: xb, y: xb.sum(axis=1, keepdims=True)})
