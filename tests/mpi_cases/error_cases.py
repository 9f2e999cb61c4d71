"""Bad input on one or all ranks: each case must raise the same clear error on every rank and
leave the job usable (the next collective still works)."""
from typing import Any, Callable, Dict, Tuple

import numpy as np

import hvdlike as hvd
from hvdlike.collectives import packed_allreduce_async


def _packed(arrays: Any, parts: Any) -> Any:
    """A grouped all-reduce of arrays carrying several tensors (the TensorFlow frontend's);
    ``parts`` None: each array is one tensor."""
    if parts is None:
        return hvd.grouped_allreduce(arrays, op=hvd.Sum)
    return packed_allreduce_async(arrays, parts, hvd.Sum, 1.0, 1.0, None,
                                  hvd.global_process_set).synchronize()


def _cases(rank: int, size: int) -> Dict[str, Callable[[], Any]]:
    odd = rank % 2 == 1
    return {
        "shape_mismatch": lambda: hvd.allreduce(np.ones(3 + rank, np.float32)),
        "dtype_mismatch": lambda: hvd.allreduce(np.ones(3, np.float64 if odd else np.float32)),
        "op_mismatch": lambda: hvd.allreduce(np.ones(3), op=hvd.Max if odd else hvd.Sum),
        "same_name_shape_mismatch": lambda: hvd.allreduce(np.ones(3 + rank), name="grad"),
        "root_mismatch": lambda: hvd.broadcast(np.ones(2), root_rank=rank % 2),
        "root_out_of_range": lambda: hvd.broadcast(np.ones(2), root_rank=size + 3),
        "root_out_of_range_one_rank": lambda: hvd.broadcast(np.ones(2), root_rank=-1 if odd else 0),
        "unsupported_dtype_one_rank": lambda: hvd.allreduce(
            np.ones(2, np.complex64 if odd else np.float32)),
        "unsupported_dtype_allgather": lambda: hvd.allgather(np.array(["a", "b"])),
        "bool_average": lambda: hvd.allreduce(np.ones(2, bool), op=hvd.Average),
        "unknown_op": lambda: hvd.allreduce(np.ones(2), op=17),
        "adasum_reducescatter": lambda: hvd.reducescatter(np.ones(2 * size), op=hvd.Adasum),
        "adasum_integers": lambda: hvd.allreduce(np.ones(2, np.int32), op=hvd.Adasum),
        "adasum_on_some_ranks": lambda: hvd.allreduce(np.ones(2),
                                                      op=hvd.Adasum if odd else hvd.Sum),
        "alltoall_bad_splits": lambda: hvd.alltoall(np.ones((size + 1, 2)), splits=[1] * size),
        "alltoall_indivisible": lambda: hvd.alltoall(np.ones((size + 1, 2))),
        # splits whose NumPy sum wraps around to the rows (uint64; int64 at 3 ranks or more)
        "alltoall_splits_wrapping_uint64": lambda: hvd.alltoall(np.ones((4, 2)), splits=np.array(
            [2**64 - 1, 5] + [0] * (size - 2) if odd else [4] + [0] * (size - 1), np.uint64)),
        "alltoall_splits_wrapping_int64": lambda: hvd.alltoall(np.ones((6, 2)), splits=np.array(
            [2**63 - 1, 2**63 - 1, 8] + [0] * (size - 3) if rank == size - 1 and size > 2
            else [6] + [0] * (size - 1), np.int64)),
        "allgather_trailing_shape": lambda: hvd.allgather(np.ones((2, 2 + rank))),
        "grouped_length_mismatch": lambda: hvd.grouped_allreduce([np.ones(2)] * (1 + rank)),
        # the same number of elements in another shape, among tensors packed into one array
        "packed_shape_mismatch": lambda: _packed(
            [np.ones(10, np.float32), np.ones(3)], (((3, 2) if odd else (2, 3), (4,)), None)),
        "packed_differently": lambda: _packed(
            [np.ones(6, np.float32), np.ones(4, np.float32)] if odd else [np.ones(10, np.float32)],
            None if odd else (((6,), (4,)),)),
        "reducescatter_scalar": lambda: hvd.reducescatter(np.float32(1.0)),
        "different_collectives": lambda: (hvd.allgather(np.ones(2)) if odd
                                          else hvd.allreduce(np.ones(2))),
        "named_dtype_mismatch_async": lambda: hvd.allreduce_async(
            np.ones(2, np.int32 if odd else np.int64), name="g").synchronize(),
        "broadcast_object_unpicklable_on_root": lambda: hvd.broadcast_object(
            (lambda: 0) if rank == 0 else None, root_rank=0),
        "allgather_object_unpicklable_one_rank": lambda: hvd.allgather_object(
            (lambda: 0) if odd else rank),
        "set_not_registered": lambda: hvd.allreduce(np.ones(2), process_set=hvd.ProcessSet([0])),
        "set_given_as_ranks": lambda: hvd.allreduce(np.ones(2), process_set=[0, 1]),
        "name_not_a_string": lambda: hvd.allreduce(np.ones(2), name=123),
        "factor_not_a_number": lambda: hvd.allreduce(np.ones(2), prescale_factor="a"),
        "grouped_given_one_array": lambda: hvd.grouped_allreduce(np.ones(3)),
    }


def run(only: str = "") -> Dict[str, Tuple[str, str]]:
    """{case: (exception type, message)} as seen on this rank, plus a check after each case
    that the job still works; ``only``: the cases whose name starts so."""
    rank, size = hvd.rank(), hvd.size()
    seen: Dict[str, Tuple[str, str]] = {}
    for name, call in _cases(rank, size).items():
        if not name.startswith(only):
            continue
        try:
            call()
            seen[name] = ("no error", "")
        except Exception as exc:  # noqa: BLE001 - recording what was raised is the point
            seen[name] = (type(exc).__name__, str(exc))
        ok = hvd.allreduce(np.array([rank], np.int64), op=hvd.Sum)
        seen[name + "/after"] = ("ok" if ok[0] == size * (size - 1) // 2 else "broken", "")
    return seen


def not_a_member() -> Tuple[str, str]:
    """Ranks outside a process set calling a collective on it get a local error; members work."""
    ps = hvd.add_process_set([0])
    try:
        out = hvd.allreduce(np.ones(2), process_set=ps)
        return ("ok", str(out.tolist()))
    except ValueError as exc:
        return (type(exc).__name__, str(exc))


def mismatch_on_a_set() -> Dict[str, Tuple[str, str]]:
    """np=4: ranks 2 and 3, a process set, disagree on a shape, then rank 3 alone passes an
    unsupported dtype; the messages must name them by their world ranks."""
    rank = hvd.rank()
    ps = hvd.add_process_set([2, 3])
    seen: Dict[str, Tuple[str, str]] = {}
    if rank in (2, 3):
        calls = {"shape": lambda: hvd.allreduce(np.ones(3 + rank), process_set=ps),
                 "dtype": lambda: hvd.allreduce(np.ones(2, np.complex64 if rank == 3 else
                                                         np.float32), process_set=ps)}
        for name, call in calls.items():
            try:
                call()
                seen[name] = ("no error", "")
            except Exception as exc:  # noqa: BLE001
                seen[name] = (type(exc).__name__, str(exc))
    hvd.remove_process_set(ps)
    return seen


def before_init() -> Tuple[str, str]:
    hvd.shutdown()
    try:
        hvd.allreduce(np.ones(2))
        result = ("no error", "")
    except Exception as exc:  # noqa: BLE001
        result = (type(exc).__name__, str(exc))
    hvd.init()
    return result
