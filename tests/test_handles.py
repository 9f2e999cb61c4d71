"""Handle.add_done_callback: what the TensorFlow wait kernel is told a request is done by."""
import threading

from hvdlike.handles import Handle


def test_a_callback_runs_once_on_the_thread_that_completes_the_handle():
    handle, calls = Handle(None), []
    handle.add_done_callback(lambda: calls.append(threading.current_thread().name))
    handle.add_done_callback(lambda: calls.append("second"))
    assert calls == [] and not handle.poll()
    completer = threading.Thread(target=handle._succeed, args=([1, 2],), name="completer")
    completer.start()
    completer.join()
    assert calls == ["completer", "second"]
    assert handle.synchronize() == [1, 2] and calls == ["completer", "second"]


def test_a_callback_added_after_completion_runs_at_once_also_after_an_error():
    handle, calls = Handle(None), []
    handle._complete(None, ValueError("bad input on rank 1"))
    handle.add_done_callback(lambda: calls.append(handle.poll()))
    assert calls == [True]
