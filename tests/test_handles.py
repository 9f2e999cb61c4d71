"""Handle.add_done_callback (what the TensorFlow wait kernel is told a request is done by), and
what synchronize and poll say when given something else."""
import threading

import pytest

import hvdlike as hvd
from hvdlike.handles import Handle, complete, succeed


def test_a_callback_runs_once_on_the_thread_that_completes_the_handle():
    handle, calls = Handle(None), []
    handle.add_done_callback(lambda: calls.append(threading.current_thread().name))
    handle.add_done_callback(lambda: calls.append("second"))
    assert calls == [] and not handle.poll()
    completer = threading.Thread(target=succeed, args=(handle, [1, 2]), name="completer")
    completer.start()
    completer.join()
    assert calls == ["completer", "second"]
    assert handle.synchronize() == [1, 2] and calls == ["completer", "second"]


def test_a_callback_added_after_completion_runs_at_once_also_after_an_error():
    handle, calls = Handle(None), []
    complete(handle, None, ValueError("bad input on rank 1"))
    handle.add_done_callback(lambda: calls.append(handle.poll()))
    assert calls == [True]


def test_synchronize_and_poll_of_something_else_than_a_handle_say_what_they_take():
    for fn in (hvd.synchronize, hvd.poll):
        for wrong in (None, 123, [1, 2]):
            with pytest.raises(TypeError, match=r"takes the handle that an \*_async call "
                                                r"returned .* got " + type(wrong).__name__):
                fn(wrong)
