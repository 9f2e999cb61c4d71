"""The result cache reuses an array only once nothing else refers to it (in-process)."""
import numpy as np

from hvdlike.engine.buffers import ResultCache, size_class

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


def test_small_arrays_bypass_the_cache_and_the_budget_caps_what_it_keeps():
    cache = ResultCache(min_bytes=1024, max_bytes=4096)
    small = cache.empty((4,), F32)  # 16 bytes: below min_bytes
    del small
    assert cache._bytes == 0
    kept = cache.empty((1024,), F32)  # 4096 bytes: fills the budget
    over = cache.empty((512,), F32)  # no room while ``kept`` is held: not kept
    assert cache._bytes == 4096 and not np.shares_memory(kept, over)
    del over
    assert np.shares_memory(cache.empty((1024,), F32), kept) is False  # kept is still held


def test_results_of_changing_shapes_reuse_the_memory_of_their_size_class():
    # a fusion bucket holds other tensors from step to step: its slab changes length
    cache = ResultCache(min_bytes=0)
    first = cache.empty((100_000,), F32)
    address = first.ctypes.data
    del first
    for n in (99_000, 100_000, 114_000):  # 396,000 to 456,000 bytes: one class
        a = cache.empty((n,), F32)
        assert a.ctypes.data == address and a.shape == (n,)
        del a
    other = cache.empty((50, 1000), np.dtype(np.float64))  # 400,000 bytes: the same class
    assert other.ctypes.data == address and other.dtype == np.float64
    assert cache._bytes == size_class(400_000)


def test_idle_memory_of_other_classes_makes_room_over_the_budget():
    cache = ResultCache(min_bytes=0, max_bytes=1 << 20)
    for n in (60_000, 80_000, 100_000, 120_000):  # four classes, all let go at once
        cache.empty((n,), F32)
    held = cache.empty((200_000,), F32)  # 800,000 bytes: room only once idle ones go
    assert cache._bytes <= 1 << 20
    again = cache.empty((200_000,), F32)  # ``held`` is the cache's: a second buffer,
    assert not np.shares_memory(held, again)  # never the held one
    del held, again
    assert cache.empty((200_000,), F32) is not None and cache._bytes <= 1 << 20


def test_size_classes_waste_at_most_a_quarter():
    for n in list(range(1, 5000)) + [65_537, 1 << 20, (1 << 20) + 1, 15_832_064, 10**9]:
        c = size_class(n)
        assert n <= c <= n * 1.25 + 1
