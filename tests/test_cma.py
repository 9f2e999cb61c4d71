"""The cross-memory copier (hvdlike/transport/cma.py) within one process, which may always
attach to itself: more spans than one system call takes, and calls that the kernel ends part
way (at a span's end, or inside one), still copy every byte exactly once. The all-reduce over
it runs in real MPI jobs: tests/test_shm.py and the *-cma configs of tests/test_collectives.py."""
import os

import numpy as np
import pytest

from hvdlike.transport import cma

pytestmark = pytest.mark.skipif(cma._CALLS is None, reason="no process_vm_readv here (not Linux)")


def _spans(src: np.ndarray, dst: np.ndarray, count: int):
    """``count`` spans of 1..13 bytes each, from src into dst, in a shuffled order."""
    spans, at = [], 0
    for i in range(count):
        n = i % 13 + 1
        spans.append((dst.ctypes.data + at, src.ctypes.data + at, n))
        at += n
    order = np.random.default_rng(0).permutation(count)
    return [spans[i] for i in order], at


@pytest.mark.parametrize("which", ["read", "write"])
def test_more_spans_than_one_call_takes_are_all_copied(which):
    src = np.random.default_rng(1).integers(0, 256, 40_000, dtype=np.uint8)
    dst = np.zeros_like(src)
    spans, used = _spans(src, dst, 3 * cma._IOV_MAX + 5)
    if which == "write":  # write: here is the source, there the destination
        spans = [(there, here, n) for here, there, n in spans]
    cma._Copier(cma._CALLS[0 if which == "read" else 1])(os.getpid(), spans)
    np.testing.assert_array_equal(dst[:used], src[:used])
    assert not dst[used:].any()


@pytest.mark.parametrize("cut", ["at_a_span_end", "inside_a_span"])
def test_a_call_the_kernel_ends_part_way_is_finished(cut):
    read = cma._CALLS[0]
    calls = []

    def partial(pid, local, n, remote, m, flags):
        """Copies only the first span (or half of it), as the kernel may."""
        calls.append(n)
        whole = local[0].len
        if cut == "inside_a_span" and whole > 1:
            local[0].len = remote[0].len = whole // 2
        done = read(pid, local, 1, remote, 1, flags)
        local[0].len = remote[0].len = whole
        return done

    src = np.arange(200, dtype=np.uint8)
    dst = np.zeros_like(src)
    spans, used = _spans(src, dst, 20)
    cma._Copier(partial)(os.getpid(), spans)
    np.testing.assert_array_equal(dst[:used], src[:used])
    assert len(calls) > 20 if cut == "inside_a_span" else len(calls) == 20


def test_a_refused_copy_raises_with_the_reason():
    def refused(*args):
        import ctypes
        import errno
        ctypes.set_errno(errno.EPERM)
        return -1

    buf = np.zeros(8, np.uint8)
    with pytest.raises(cma.CopyFailed, match="Operation not permitted"):
        cma._Copier(refused)(os.getpid(), [(buf.ctypes.data, buf.ctypes.data, 8)])


def test_address_is_the_first_bytes_address_for_every_kind_of_array():
    base = np.arange(64, dtype=np.float32)
    readonly = base[8:16].copy()
    readonly.flags.writeable = False
    for a in (base, base[8:16], readonly, np.empty(0, np.float64), np.zeros((3, 4), np.int8)):
        assert cma._address(a) == a.ctypes.data
