"""The result cache reuses an array only once nothing else refers to it (in-process)."""
import numpy as np

from hvdlike.engine.buffers import ResultCache

F32 = np.dtype(np.float32)


def test_array_is_reused_after_the_caller_drops_it():
    cache = ResultCache(min_bytes=0)
    a = cache.empty((4, 4), F32)
    address = a.ctypes.data
    del a
    assert cache.empty((4, 4), F32).ctypes.data == address


def test_array_still_held_is_never_handed_out_again():
    cache = ResultCache(min_bytes=0)
    a = cache.empty((8,), F32)
    a[:] = 7
    b = cache.empty((8,), F32)
    assert not np.shares_memory(a, b)
    b[:] = 1
    assert (a == 7).all()


def test_views_keep_the_array_held():
    cache = ResultCache(min_bytes=0)
    for make_view in (lambda a: a[2:], lambda a: a.view(np.bool_), lambda a: a.reshape(2, 4)):
        a = cache.empty((8,), F32)
        view = make_view(a)
        del a
        assert not np.shares_memory(cache.empty((8,), F32), view)
        del view


def test_memoryviews_keep_the_array_held():
    cache = ResultCache(min_bytes=0)
    a = cache.empty((8,), F32)
    mem = memoryview(a)
    del a
    assert cache.empty((8,), F32).ctypes.data != np.frombuffer(mem, F32).ctypes.data


def test_small_arrays_and_arrays_over_budget_are_not_kept():
    cache = ResultCache(min_bytes=1024, max_bytes=4096)
    cache.empty((4,), F32)  # 16 bytes: below min_bytes
    kept = cache.empty((1024,), F32)  # 4096 bytes: fits the budget
    cache.empty((512,), F32)  # would exceed the budget
    assert ((4,), F32) not in cache._arrays
    assert [a is kept for a in cache._arrays[((1024,), F32)]] == [True]
    assert cache._arrays[((512,), F32)] == []
    assert cache._bytes == 4096
