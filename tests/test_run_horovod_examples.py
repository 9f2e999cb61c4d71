"""scripts/run_horovod_examples.py changes only what it says: the imports, the TensorFlow 1
session setup and Keras 2 imports of the examples/keras files, and puts its prelude (synthetic
data, a cap on length) after the example's leading comments."""
import sys

import pytest

from mpi_harness import REPO

sys.path.insert(0, str(REPO / "scripts"))
import run_horovod_examples as examples  # noqa: E402

TF2 = '''# Copyright Horovod
import sys
import tensorflow as tf
import horovod
import horovod.tensorflow.keras as hvd
from horovod.tensorflow.data.compute_service import TfDataServiceConfig
hvd.init()
'''


def test_imports_become_hvdlikes_and_the_rest_stays():
    text, said = examples.port("tensorflow2_keras_mnist.py", TF2)
    body = text[text.index("# --- the example"):]
    assert "import hvdlike as horovod\n" in body
    assert "import hvdlike.tensorflow.keras as hvd\n" in body
    assert "from hvdlike.tensorflow.data.compute_service import TfDataServiceConfig\n" in body
    assert "horovod." not in body.replace("import hvdlike as horovod", "")
    assert body.endswith("hvd.init()\n") and said == []
    assert text.startswith("# Copyright Horovod\n# --- added by hvdlike")  # after the comments


def test_a_keras_2_example_runs_on_tf_keras_with_tensorflow_2_gpu_pinning():
    source = ("import keras\nfrom keras.datasets import mnist\nfrom keras import backend as K\n"
              "import tensorflow as tf\nimport horovod.keras as hvd\nhvd.init()\n"
              + examples._TF1_SESSION + "print(K.image_data_format())\n")
    text, said = examples.port("keras_mnist.py", source)
    body = text[text.index("# --- the example"):]
    assert "import tf_keras as keras\nfrom tf_keras.datasets import mnist\n" in body
    assert "from tf_keras import backend as K\n" in body
    assert "ConfigProto" not in body and examples._TF2_PINNING in body
    assert said == [examples._KERAS2_WHY, examples._SESSION_WHY]


def test_a_change_that_no_longer_applies_stops_the_run_naming_it():
    with pytest.raises(SystemExit, match="keras_mnist.py: .* is not in this version"):
        examples.port("keras_mnist.py", "import keras\nimport horovod.keras as hvd\n")


def test_the_data_service_example_runs_once_per_dispatcher_side_and_its_parts_through_it(
        tmp_path, monkeypatch):
    """Its two train_fn files are modules it imports: they are written beside it, not run;
    it runs twice, each time beside a compute job with the dispatchers on one side."""
    folder = tmp_path / "horovod" / "examples" / "tensorflow2"
    folder.mkdir(parents=True)
    (tmp_path / "horovod" / "examples" / "keras").mkdir()
    for name in (examples.DATA_SERVICE, *examples.DATA_SERVICE_PARTS, "tensorflow2_mnist.py"):
        (folder / name).write_text("import horovod.tensorflow as hvd\n")
    runs = []

    def run_one(name, text, where, np_, timeout, steps, side=None):
        runs.append((name, side, sorted(p.name for p in where.iterdir())))
        return "ran", 1.0, ""
    monkeypatch.setattr(examples, "run_one", run_one)
    assert examples.main(["--horovod", str(tmp_path / "horovod"),
                          "--out", str(tmp_path / "out")]) == 0
    assert [(name, side) for name, side, _ in runs] == [
        ("tensorflow2_mnist.py", None), (examples.DATA_SERVICE, "compute"),
        (examples.DATA_SERVICE, "training")]
    assert all(set(examples.DATA_SERVICE_PARTS) <= set(files) for _, _, files in runs)
