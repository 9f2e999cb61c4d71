#!/usr/bin/env python
"""Run every example of Horovod's examples/tensorflow2 and examples/keras against hvdlike.

    python scripts/run_horovod_examples.py --horovod /path/to/horovod [--ref HEAD] [--np 2]
        [--timeout 600] [--steps 4] [--only NAME] [--out results/horovod_examples]

``--horovod`` is a clone of horovod/horovod (a bare git directory works: the files are read at
``--ref`` with ``git show``). Nothing of Horovod's enters this repository: each example is
written into a temporary folder, changed there as the table below says, and run as
``hvdlikerun -np N python EXAMPLE ARGS`` with a hard timeout, in that folder (its checkpoints
and logs stay there). Every example gets:

* **its imports changed**: ``horovod.X`` becomes ``hvdlike.X`` (``import horovod`` becomes
  ``import hvdlike as horovod``);
* **synthetic data**: a few lines put before it make ``mnist.load_data()`` (Keras's,
  ``tf.keras``'s) return random arrays of MNIST's shapes and dtypes instead of downloading
  it, and ``ImageDataGenerator.flow_from_directory`` yield random images of the asked size
  and one of ImageNet's 1,000 labels instead of reading ImageNet;
* **a cap on its length** (``--steps``): ``Model.fit`` runs at most 2 epochs of at most that
  many steps (and as many validation steps), a ``Dataset.take(n)`` takes at most that many
  elements, and the synthetic benchmarks get small ``--num-*`` arguments. The examples train
  for hours as written; this checks that they run, not what they reach.

Anything else an example needed is in ``KERAS2`` and ``CHANGES`` below, with why: that is
what a Horovod user would change too (TensorFlow 2 and Keras 3 differences). An example
counts as run when its job exits 0. Prints a table, writes OUT.json. Needs tf_keras for the
examples/keras files, SciPy for keras_mnist_advanced.py (ImageDataGenerator's rotations and
zooms use it), TensorBoard for keras_imagenet_resnet50.py (its TensorBoard callback) and
filelock for the tf.data service example: ``pip install tf_keras scipy tensorboard filelock``.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_output import markdown_table, write_json  # noqa: E402

FOLDERS = ("examples/tensorflow2", "examples/keras")

# TensorFlow 1's way to pin a GPU per rank, in the examples/keras files
_TF1_SESSION = """config = tf.ConfigProto()
config.gpu_options.allow_growth = True
config.gpu_options.visible_device_list = str(hvd.local_rank())
K.set_session(tf.Session(config=config))
"""
# TensorFlow 2's, as Horovod's examples/tensorflow2 files write it
_TF2_PINNING = """gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')
"""
_SESSION_WHY = ("TensorFlow 2 has no ConfigProto or Session: the GPU pinned per rank the "
                "TensorFlow 2 way, as Horovod's tensorflow2 examples do")

# What each example needs beyond its imports: (text in the example, its replacement, why)
CHANGES: Dict[str, List[Tuple[str, str, str]]] = {
    name: [(_TF1_SESSION, _TF2_PINNING, _SESSION_WHY)]
    for name in ("keras_mnist.py", "keras_mnist_advanced.py", "keras_imagenet_resnet50.py")}

# Keras 2 scripts (examples/keras): Keras 3 removed what they use (ImageDataGenerator,
# backend sessions, the lr= argument), so they run on tf_keras, the Keras 2 API for
# TensorFlow 2: ``keras`` imported as ``tf_keras``, and TF_USE_LEGACY_KERAS=1 so that
# hvdlike.keras (and tf.keras) use it too
KERAS2 = ("keras_mnist.py", "keras_mnist_advanced.py", "keras_imagenet_resnet50.py")
_KERAS2_WHY = ("a Keras 2 script: run on tf_keras (`import tf_keras as keras`, "
               "TF_USE_LEGACY_KERAS=1), as Keras 3 removed ImageDataGenerator, backend sessions "
               "and the lr= argument")

# Arguments for the examples that take them (a short run)
ARGS: Dict[str, List[str]] = {
    "tensorflow2_synthetic_benchmark.py": [
        "--batch-size", "8", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
        "--num-iters", "2"],
    "tensorflow2_keras_synthetic_benchmark.py": [
        "--batch-size", "8", "--num-batches-per-iter", "2", "--num-iters", "2"],
    "keras_imagenet_resnet50.py": ["--batch-size", "8", "--val-batch-size", "8"],
}

# The tf.data service example runs beside a compute job (`python -m
# hvdlike.tensorflow.data.compute_worker CONFIG --dispatcher-side SIDE`, as Horovod's docs
# start it), once with the dispatchers on each side; its two train_fn files are modules it
# imports, run through it
DATA_SERVICE = "tensorflow2_mnist_data_service.py"
DATA_SERVICE_SIDES = ("compute", "training")
DATA_SERVICE_PARTS = ("tensorflow2_mnist_data_service_train_fn_compute_side_dispatcher.py",
                      "tensorflow2_mnist_data_service_train_fn_training_side_dispatcher.py")

PRELUDE = '''\
# --- added by hvdlike's scripts/run_horovod_examples.py: synthetic data, a cap on length ---
import os as _os
import numpy as _np


def _mnist(path="mnist.npz"):
    rng = _np.random.default_rng(0)
    return ((rng.integers(0, 256, (60000, 28, 28), dtype=_np.uint8),
             rng.integers(0, 10, 60000, dtype=_np.uint8)),
            (rng.integers(0, 256, (10000, 28, 28), dtype=_np.uint8),
             rng.integers(0, 10, 10000, dtype=_np.uint8)))


def _install(keras):
    import tensorflow as tf
    steps = int(_os.environ["EXAMPLE_STEP_CAP"])
    keras.datasets.mnist.load_data = _mnist
    fit = keras.Model.fit

    def short_fit(self, *args, **kwargs):  # (fit_generator too, in tf_keras)
        kwargs["epochs"] = min(kwargs.get("epochs", 1), 2)
        kwargs["steps_per_epoch"] = min(kwargs.get("steps_per_epoch") or steps, steps)
        if kwargs.get("validation_data") is not None:
            kwargs["validation_steps"] = min(kwargs.get("validation_steps") or steps, steps)
        return fit(self, *args, **kwargs)
    keras.Model.fit = short_fit
    if hasattr(keras.Model, "fit_generator"):
        keras.Model.fit_generator = short_fit

    class _Images:
        """What flow_from_directory gives: batches of random images and one-hot labels."""

        def __init__(self, target_size=(256, 256), batch_size=32, classes=1000):  # ImageNet
            self.batch_size, self.samples = batch_size, batch_size * steps
            self.num_classes = classes
            self._shape = (batch_size, *target_size, 3)

        def __len__(self):
            return steps

        def __iter__(self):
            return self

        def __next__(self):
            rng = _np.random.default_rng()
            return (rng.random(self._shape, dtype=_np.float32),
                    _np.eye(self.num_classes, dtype=_np.float32)[
                        rng.integers(0, self.num_classes, self.batch_size)])

    def from_directory(self, directory, target_size=(256, 256), batch_size=32, **kwargs):
        return _Images(target_size, batch_size)
    generator = getattr(keras.preprocessing.image, "ImageDataGenerator", None)
    if generator is not None:  # (tf_keras: Keras 3 has none)
        generator.flow_from_directory = from_directory


def _install_take():
    import tensorflow as tf
    steps = int(_os.environ["EXAMPLE_STEP_CAP"])
    take = tf.data.Dataset.take
    tf.data.Dataset.take = lambda self, count, name=None: take(self, min(int(count), steps),
                                                                 name=name)


import keras as _keras  # noqa: E402

_install(_keras)
if _os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras as _tf_keras
    _install(_tf_keras)
_install_take()
# --- the example, as Horovod wrote it (imports changed) ---
'''


def read_examples(horovod: Path, ref: str) -> Dict[str, str]:
    """Each example's file name and text, from a work tree or a (bare) git directory."""
    out = {}
    for folder in FOLDERS:
        if (horovod / folder).is_dir():
            for path in sorted((horovod / folder).glob("*.py")):
                out[path.name] = path.read_text()
            continue
        names = subprocess.run(["git", "-C", str(horovod), "ls-tree", "--name-only", ref,
                                f"{folder}/"], capture_output=True, text=True, check=True)
        for name in names.stdout.split():
            if name.endswith(".py"):
                out[Path(name).name] = subprocess.run(
                    ["git", "-C", str(horovod), "show", f"{ref}:{name}"],
                    capture_output=True, text=True, check=True).stdout
    return out


def port(name: str, text: str) -> Tuple[str, List[str]]:
    """The example with its imports changed and its CHANGES made; the changes made, said."""
    text = re.sub(r"^(\s*)import horovod$", r"\1import hvdlike as horovod", text, flags=re.M)
    text = re.sub(r"^(\s*)(import|from) horovod\.", r"\1\2 hvdlike.", text, flags=re.M)
    said = []
    if name in KERAS2:
        text = re.sub(r"^import keras$", "import tf_keras as keras", text, flags=re.M)
        text = re.sub(r"^from keras([. ])", r"from tf_keras\1", text, flags=re.M)
        said.append(_KERAS2_WHY)
    for old, new, why in CHANGES.get(name, []):
        if old not in text:
            raise SystemExit(f"{name}: {old!r} is not in this version of the example")
        text = text.replace(old, new)
        said.append(why)
    future = re.match(r"((?:\s*#.*\n|\s*\n)*(?:from __future__ import .*\n)*)", text)
    head = future.group(1) if future else ""
    return head + PRELUDE + text[len(head):], said


def run_one(name: str, text: str, folder: Path, np_: int, timeout: float,
            steps: int, side: Optional[str] = None) -> Tuple[str, float, str]:
    """(status, seconds, the output's tail) of one example's job; for the tf.data service
    example, with its compute job (dispatchers on ``side``) beside it."""
    script = folder / name
    script.write_text(text)
    env = dict(os.environ, EXAMPLE_STEP_CAP=str(steps), TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(folder), TF_USE_LEGACY_KERAS="1" if name in KERAS2 else "0")
    hvdlikerun = [sys.executable, "-m", "hvdlike.runner", "-np", str(np_)]
    args = ARGS.get(name, [])
    compute = None
    if side is not None:
        config = folder / f"compute-{side}.json"
        config.unlink(missing_ok=True)
        args = [str(config)]
        compute = subprocess.Popen(
            [*hvdlikerun, sys.executable, "-m", "hvdlike.tensorflow.data.compute_worker",
             str(config), "--dispatcher-side", side], cwd=folder, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    try:
        done = subprocess.run([*hvdlikerun, sys.executable, name, *args], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=timeout)
        status = "ran" if done.returncode == 0 else f"failed ({done.returncode})"
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        status = f"timed out ({timeout:g} s)"
        output = (exc.stdout or b"").decode(errors="replace") + \
            (exc.stderr or b"").decode(errors="replace")
    if compute is not None:  # the example's rank 0 ends it
        try:
            compute_output = compute.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            compute.kill()
            compute_output = compute.communicate()[0]
        if compute.returncode != 0 and status == "ran":
            status = f"its compute job failed ({compute.returncode})"
        output = f"{output}\n--- the compute job ---\n{compute_output}"
    return status, time.monotonic() - started, output[-3000:]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--horovod", required=True, type=Path, help="a clone of horovod/horovod")
    p.add_argument("--ref", default="HEAD", help="the commit to read (a git directory)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per example")
    p.add_argument("--steps", type=int, default=4, help="the cap on steps (see above)")
    p.add_argument("--only", action="append", help="run only this example (repeatable)")
    p.add_argument("--out", default="results/horovod_examples")
    args = p.parse_args(argv)
    examples = read_examples(args.horovod, args.ref)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvdlike-horovod-examples-") as tmp:
        folder = Path(tmp)
        ported = {name: port(name, text) for name, text in examples.items()}
        for name, (text, _) in ported.items():  # examples import each other
            (folder / name).write_text(text)
        for name, (text, said) in ported.items():
            if args.only and name not in args.only or name in DATA_SERVICE_PARTS:
                continue
            for side in DATA_SERVICE_SIDES if name == DATA_SERVICE else [None]:
                status, seconds, tail = run_one(name, text, folder, args.np, args.timeout,
                                                args.steps, side)
                shown = name if side is None else f"{name} (dispatchers on the {side} side)"
                print(f"{shown}: {status} in {seconds:.0f} s", flush=True)
                if status != "ran":
                    print(tail, flush=True)
                rows.append({"example": shown, "status": status, "seconds": round(seconds, 1),
                             "changes": "; ".join(said) or "imports only",
                             "output_tail": tail if status != "ran" else ""})
    print(markdown_table(["example", "status", "seconds", "changes"],
                         [[r["example"], r["status"], r["seconds"], r["changes"]]
                          for r in rows]))
    write_json(args.out + ".json", {"np": args.np, "steps": args.steps, "ref": args.ref,
                                    "examples": rows})
    return 0 if all(r["status"] == "ran" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
