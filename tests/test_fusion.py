"""Fusion buffers: bucket planning, packing and unpacking (in-process, no MPI)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from hvdlike.engine import fusion

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def test_buckets_respect_threshold_and_order_per_dtype():
    keys = [F32, F32, F64, F32, F32, F64]
    sizes = [40, 40, 100, 30, 10, 8]
    assert fusion.plan_buckets(keys, sizes, 100) == [[0, 1], [2], [3, 4], [5]]


def test_tensor_larger_than_threshold_travels_alone():
    assert fusion.plan_buckets([F32] * 3, [10, 500, 10], 64) == [[0], [1], [2]]


def test_threshold_zero_disables_fusion():
    assert fusion.plan_buckets([F32] * 3, [4, 4, 4], 0) == [[0], [1], [2]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([F32, F64]), st.integers(0, 300)), max_size=30),
       st.integers(0, 600))
def test_every_tensor_lands_in_exactly_one_bucket_of_its_dtype(items, threshold):
    keys = [k for k, _ in items]
    sizes = [s for _, s in items]
    buckets = fusion.plan_buckets(keys, sizes, threshold)
    assert sorted(i for b in buckets for i in b) == list(range(len(items)))
    for b in buckets:
        assert len({keys[i] for i in b}) == 1
        assert b == sorted(b)
        assert len(b) == 1 or sum(sizes[i] for i in b) <= threshold


@settings(max_examples=200, deadline=None)
@given(st.lists(arrays(np.float32, array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
                       elements=st.floats(-1e3, 1e3, width=32)), max_size=6))
def test_pack_then_unpack_round_trips(arrays_):
    total = sum(a.size for a in arrays_)
    buf = np.full(total + 3, np.nan, np.float32)  # larger than needed, like a pooled buffer
    fusion.pack(arrays_, buf)
    out = fusion.unpack(buf, [a.shape for a in arrays_], [a.dtype for a in arrays_])
    for a, b in zip(arrays_, out):
        assert b.shape == a.shape and b.dtype == a.dtype
        np.testing.assert_array_equal(a, b)
        assert not np.shares_memory(b, buf)


def test_pack_casts_and_scales_into_the_buffer_dtype():
    buf = np.empty(5, np.float32)
    fusion.pack([np.array([1, 2], np.float16), np.array([3, 4, 5], np.float64)], buf, 0.5)
    np.testing.assert_array_equal(buf, [0.5, 1.0, 1.5, 2.0, 2.5])
    ints = np.empty(3, np.int32)
    fusion.pack([np.array([-3, 3, 5], np.int32)], ints, 0.5)
    np.testing.assert_array_equal(ints, [-1, 1, 2])  # truncated toward zero


def test_pool_reuses_released_buffers():
    pool = fusion.BufferPool()
    a = pool.acquire(F32, 100)
    pool.release(a)
    assert pool.acquire(F32, 50) is a
    assert pool.acquire(F32, 10) is not a  # a is in use again
