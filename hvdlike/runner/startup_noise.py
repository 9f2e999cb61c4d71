"""TensorFlow's start-up lines, which every rank prints to stderr when it loads TensorFlow
(before its logging is set up, so ``TF_CPP_MIN_LOG_LEVEL`` does not silence them): the absl
notice, oneDNN's note, the CUDA probe and its failed ``cuInit`` on a machine without GPUs
(where a GPU machine's driver fails, TensorFlow then finds no GPU: set the variable below to
see why), the CPU-feature note.
``hvdlikerun`` leaves them out of a job's output unless ``HVDLIKE_TF_STARTUP_LOGS=1``."""
import re
from typing import Mapping

VARIABLE = "HVDLIKE_TF_STARTUP_LOGS"
_LINES = re.compile(
    rb"(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|I\d{4} [\d:.]+ +\d+ (port|cudart_stub|cpu_feature_guard)\.cc:\d+\] .*"
    rb"|E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: .*"
    rb"|To enable the following instructions: .* in other operations, rebuild TensorFlow with "
    rb"the appropriate compiler flags\.)\r?\n?\Z")


def is_startup_line(line: bytes) -> bool:
    """Whether ``line`` (one whole line of output) is one of them."""
    return _LINES.match(line) is not None


def kept(env: Mapping[str, str]) -> bool:
    """Whether the job's environment asks to keep them."""
    return env.get(VARIABLE, "").lower() in ("1", "true", "yes", "on")
