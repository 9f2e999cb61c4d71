import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("tensorflow", reason="TensorFlow is not installed; the TF frontend "
                    "tests need tensorflow (pip install tensorflow-cpu)")
