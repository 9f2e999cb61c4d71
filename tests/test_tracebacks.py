"""Errors about the caller's input are raised from the public function called
(hvdlike.base.tracebacks): one hvdlike frame below the caller's, no chained exception; other
errors, and every error under HVDLIKE_FULL_TRACEBACKS=1, keep their whole traceback."""
import subprocess
import sys
import traceback

import pytest

from hvdlike.base.tracebacks import mark, short

CASE = """
from hvdlike.base.tracebacks import short

def deep():
    try:
        raise KeyError("inside")
    except KeyError as exc:
        raise ValueError("bad input") from exc

@short
def public():
    deep()

public()
"""


def _deep(error):
    try:
        raise KeyError("inside")
    except KeyError as exc:
        raise error from exc


@pytest.mark.parametrize("error", [ValueError("bad input"), TypeError("a string"),
                                   mark(RuntimeError("ranks disagree"))])
def test_a_callers_error_leaves_one_frame_below_the_caller_and_no_chain(error):
    @short
    def public():
        _deep(error)

    with pytest.raises(type(error)) as raised:
        public()
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [f.name for f in frames] == [
        "test_a_callers_error_leaves_one_frame_below_the_caller_and_no_chain", "wrapper"]
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_other_errors_keep_their_traceback_and_cause():
    @short
    def public():
        _deep(RuntimeError("a bug in hvdlike"))

    with pytest.raises(RuntimeError) as raised:
        public()
    names = [f.name for f in traceback.extract_tb(raised.value.__traceback__)]
    assert "_deep" in names and isinstance(raised.value.__cause__, KeyError)


@pytest.mark.parametrize("full,shown", [("0", False), ("1", True)])
def test_full_tracebacks_keeps_the_frames_and_the_chain(full, shown):
    done = subprocess.run([sys.executable, "-c", CASE], capture_output=True, text=True,
                          env={"HVDLIKE_FULL_TRACEBACKS": full, "PATH": "/usr/bin:/bin"},
                          timeout=60)
    assert "ValueError: bad input" in done.stderr
    assert ("in deep" in done.stderr) == shown, done.stderr
    assert ("KeyError: 'inside'" in done.stderr) == shown, done.stderr
