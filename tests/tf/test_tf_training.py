"""DistributedOptimizer, DistributedGradientTape, Keras callbacks and saving.

Each rank also trains the single-process reference (global batch) and compares:
equivalence to rtol 1e-5 in float32 for SGD and Adam, with fit and a custom loop; at np=4
with every all-reduce through the on-node shared-memory transport.
"""
import json
import os
import subprocess
import sys

import pytest

from mpi_harness import REPO, run_script_once

CHECKS = [
    "fit_sgd_np_equals_single_process_global_batch",
    "custom_loop_sgd_tape_equals_single_process_global_batch",
    "fit_adam_np_equals_single_process_global_batch",
    "optimizer_options_and_steps_per_execution_equals_single_process_global_batch",
    "custom_loop_adam_tape_equals_single_process_global_batch",
    "tape_as_context_manager_eager_nested_sources",
    "gradients_none_on_some_ranks_only_raise_with_a_hint_on_every_rank",
    "backward_passes_per_step_2_equals_one_step_with_doubled_batch",
    "op_sum_predivide_and_num_groups_variants",
    "compression_fp16_and_bf16_stay_within_tolerance",
    "broadcast_callback_keeps_weights_and_slots_identical_every_step",
    "broadcast_callback_on_a_model_built_by_its_first_batch",
    "metric_average_callback_averages_epoch_logs",
    "learning_rate_warmup_and_schedule_callbacks",
    "load_model_restores_wrapped_optimizer_with_state",
    "bad_inputs_give_clear_errors",
    "tape_results_given_to_a_distributed_optimizer_warn_once",
    "adasum_gradients_match_the_pairwise_tree_in_tape_optimizer_and_allreduce",
    "embedding_indexed_slices_gradients_match_reference",
    "mixed_precision_loss_scale_inside_outside_and_compile_wrapped",
    "xla_fit_matches_one_process_on_the_global_batch",
    "keras3_optimizers_answer_to_the_tf_keras_names_horovod_examples_use",
    "shard_dataset_data_and_file_policies",
    "sync_batch_norm_equals_one_process_on_the_global_batch",
    "process_set_gradients_are_averaged_in_the_set_and_others_keep_their_own",
]

# the checks whose gradients go through DistributedOptimizer / DistributedGradientTape
GRADIENT_CHECKS = [c for c in CHECKS if "equals" in c or c.startswith((
    "op_sum", "compression", "embedding", "mixed_precision"))]
# np4_shm: every all-reduce takes the on-node shared-memory transport (threshold 0); np2 keeps
# the default (small messages through MPI). np2_no_overlap: the gradients of a compiled step
# go to the engine together after backprop; np2_single_copy: every all-reduce goes through
# single copy (cross-memory attach; by default only buckets of 8 MiB and more, which these
# small models never make). Those two worlds change only the gradients' path, so they run
# only the gradient checks.
WORLDS = {"np1_without_mpirun": (1, False, {}), "np2": (2, True, {}),
          "np4_shm": (4, True, {"HVDLIKE_SHM_THRESHOLD": "0"}),
          "np2_no_overlap": (2, True, {"HVDLIKE_OVERLAP": "0"}),
          "np2_single_copy": (2, True, {"HVDLIKE_SHM_THRESHOLD": "0",
                                        "HVDLIKE_CMA_THRESHOLD": "0"})}
GRADIENT_WORLDS = ("np2_no_overlap", "np2_single_copy")


def _job(world):
    nranks, mpi, env = WORLDS[world]
    if world in GRADIENT_WORLDS:
        env = dict(env, HVDLIKE_TEST_CHECKS=",".join(GRADIENT_CHECKS))
    return run_script_once(nranks, "train_checks.py", timeout=300, env=env, mpi=mpi)


@pytest.mark.parametrize("world,check", [
    (w, c) for w in WORLDS for c in (GRADIENT_CHECKS if w in GRADIENT_WORLDS else CHECKS)])
def test_tf_training_check_passes_on_every_rank(world, check):
    res = _job(world)
    assert res.passed(check, WORLDS[world][0]), res.output[-6000:]


@pytest.mark.parametrize("world", list(WORLDS))
def test_tf_training_job_exits_cleanly(world):
    res = _job(world)
    assert res.returncode == 0, res.output[-6000:]


NOT_INITIALIZED = """
import json
import numpy as np, keras, tensorflow as tf
import hvdlike.keras as hvd
import hvdlike.tensorflow as hvd_tf

def tape():
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(w * w)
    hvd.DistributedGradientTape(t).gradient(loss, [w])

def fit():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    m.fit(np.ones((8, 3)), np.ones((8, 1)), verbose=0)

steps = {"tape": tape, "fit": fit,
         "sync_batch_norm": lambda: hvd.SyncBatchNormalization()(tf.ones([4, 3]), training=True),
         "shard_dataset": lambda: hvd.shard_dataset(tf.data.Dataset.range(4)),
         "size_op": lambda: hvd_tf.size_op()}
seen = {}
for what, step in steps.items():
    try:
        step()
        seen[what] = "no error"
    except hvd.NotInitializedError as e:
        seen[what] = str(e)
print(json.dumps(seen))
"""


def test_calls_before_init_raise_not_initialized_instead_of_running_apart():
    """Without hvd.init() the tape and the optimizer used to hand back each rank's own
    gradients, so ranks trained apart with no error; SyncBatchNormalization failed with an
    unrelated TypeError, shard_dataset with TensorFlow's zero shards. Horovod raises."""
    done = subprocess.run([sys.executable, "-c", NOT_INITIALIZED], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                                          PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    before = "hvdlike has not been initialized: call hvdlike.init() before "
    assert seen == {
        "tape": before + "hvdlike.tensorflow.DistributedGradientTape.",
        "fit": before + "hvdlike.tensorflow.DistributedOptimizer.",
        "sync_batch_norm": seen["sync_batch_norm"],  # Keras adds the layer's call around it
        "shard_dataset": before + "hvdlike.tensorflow.shard_dataset.",
        "size_op": before + "hvdlike.tensorflow.size_op."}, seen
    assert before + "hvdlike.allreduce()." in seen["sync_batch_norm"]
    assert "SyncBatchNormalization.call()" in seen["sync_batch_norm"]
