"""Random mixes of collectives through the engine, the same mix on every rank (one seed) and
each rank submitting it in its own order from several threads: async calls of every kind on
the world and on overlapping process sets (Adasum among the float all-reduces on sets of 2^k
ranks), waited for in yet another order, with blocking calls in between. Every result is
checked on every rank against NumPy."""
import random
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

import hvdlike as hvd
import reference

KINDS = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
         "alltoall", "reducescatter", "grouped_reducescatter"]
GROUPED = ("grouped_allreduce", "grouped_allgather", "grouped_reducescatter")
DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8"]
OPS = ["Sum", "Average", "Min", "Max"]


class Op(NamedTuple):
    index: int
    kind: str
    name: str
    members: List[int]  # the ranks of its process set
    set_index: int  # 0: the world
    dtype: str
    sizes: List[int]  # elements per tensor (grouped: several)
    op: str
    root: int  # broadcast: the root's index in members
    scale: Tuple[float, float]  # allreduces: prescale and postscale factors
    bad: int  # the index in members of a rank that passes another dtype (-1: none)


def plan(seed: int, size: int, count: int, faults: bool = False) -> List[Op]:
    """The mix, the same on every rank, on the process sets of ``set_ranks``; with
    ``faults``, about one op in ten has a member that passes another dtype."""
    rng = random.Random(seed)
    adasum = random.Random(f"adasum {seed}")  # its own draws: the rest of the mix stays as is
    sets = set_ranks(size)
    ops = []
    for i in range(count):
        kind = rng.choice(KINDS)
        s = rng.randrange(len(sets)) if rng.random() < 0.3 else 0
        dtype = rng.choice(DTYPES if kind != "allreduce" else DTYPES + ["bool"])
        big = rng.random() < 0.15  # past HVDLIKE_SHM_THRESHOLD's 1 KiB in the tests
        sizes = [rng.choice([0, 1, 3, 40, 3000 if big else 7])
                 for _ in range(rng.randint(1, 5) if kind in GROUPED else 1)]
        op = rng.choice(OPS) if dtype != "bool" else rng.choice(["Sum", "Min"])
        scale = (1.0, 1.0)
        if kind.endswith("allreduce") and dtype[0] == "f" and rng.random() < 0.3:
            scale = (rng.choice([0.5, 1.0, 2.0]), rng.choice([0.25, 1.0, 4.0]))
        bad = -1
        if faults and len(sets[s]) > 1 and rng.random() < 0.1:
            bad = rng.randrange(len(sets[s]))
        n = len(sets[s])
        if (adasum.random() < 0.3 and kind.endswith("allreduce") and dtype[0] == "f"
                and n & (n - 1) == 0 and bad < 0):
            op = "Adasum"
        ops.append(Op(i, kind, f"mix.{i}", sets[s], s, dtype, sizes, op,
                      rng.randrange(len(sets[s])), scale, bad))
    return ops


def set_ranks(size: int) -> List[List[int]]:
    """The world; ranks {0, 1} (at np=2: rank 1 alone); from np=3 on, every rank but 0
    (overlapping the second set in rank 1)."""
    return [list(range(size)), [0, 1] if size >= 3 else [1]] + (
        [list(range(1, size))] if size >= 3 else [])


def _input(op: Op, rank: int, tensor: int) -> np.ndarray:
    """Small integers, so that sums and averages are exact in every dtype and order."""
    rng = np.random.default_rng([op.index, rank, tensor])
    n = op.sizes[tensor]
    if op.kind.endswith("allgather"):
        n = n * (1 + op.members.index(rank) % 2)  # ranks give different first dimensions
    if op.kind in ("alltoall", "reducescatter", "grouped_reducescatter"):
        n = n * len(op.members)
    if op.dtype == "bool":
        return rng.random(n) < 0.5
    low = 0 if op.dtype == "uint8" else -3
    return rng.integers(low, 4, n).astype(op.dtype)


def _expected(op: Op, rank: int) -> Any:
    me = op.members.index(rank)
    alls = [[_input(op, r, t) for r in op.members] for t in range(len(op.sizes))]
    if op.kind in ("allreduce", "grouped_allreduce"):
        out = [reference.adasum(arrays, *op.scale) if op.op == "Adasum"
               else reference.reduce(arrays, op.op, *op.scale) for arrays in alls]
        return out[0] if op.kind == "allreduce" else out
    if op.kind == "allgather":
        return np.concatenate(alls[0])
    if op.kind == "grouped_allgather":
        return [np.concatenate(arrays) for arrays in alls]
    if op.kind == "grouped_reducescatter":
        return [reference.reduce(arrays, op.op)[me * k:(me + 1) * k]
                for arrays, k in zip(alls, op.sizes)]
    if op.kind == "broadcast":
        return alls[0][op.root]
    if op.kind == "alltoall":
        k = op.sizes[0]
        return np.concatenate([a[me * k:(me + 1) * k] for a in alls[0]])
    k = op.sizes[0]  # reducescatter: this rank's equal part of the reduction
    return reference.reduce(alls[0], op.op)[me * k:(me + 1) * k]


def _submit(op: Op, rank: int, process_sets: List[Any]) -> Any:
    ps = process_sets[op.set_index]
    xs = [_input(op, rank, t) for t in range(len(op.sizes))]
    if op.bad >= 0 and rank == op.members[op.bad]:
        xs = [x.astype(np.int32 if x.dtype == np.float64 else np.float64) for x in xs]
    reduce_op = getattr(hvd, op.op)
    pre, post = op.scale
    if op.kind == "allreduce":
        return hvd.allreduce_async(xs[0], op=reduce_op, prescale_factor=pre,
                                   postscale_factor=post, name=op.name, process_set=ps)
    if op.kind == "grouped_allreduce":
        return hvd.grouped_allreduce_async(xs, op=reduce_op, prescale_factor=pre,
                                           postscale_factor=post, name=op.name, process_set=ps)
    if op.kind == "allgather":
        return hvd.allgather_async(xs[0], name=op.name, process_set=ps)
    if op.kind == "grouped_allgather":
        return hvd.grouped_allgather_async(xs, name=op.name, process_set=ps)
    if op.kind == "grouped_reducescatter":
        return hvd.grouped_reducescatter_async(xs, op=reduce_op, name=op.name, process_set=ps)
    if op.kind == "broadcast":
        return hvd.broadcast_async(xs[0], root_rank=op.members[op.root], name=op.name,
                                   process_set=ps)
    if op.kind == "alltoall":
        return hvd.alltoall_async(xs[0], name=op.name, process_set=ps)
    return hvd.reducescatter_async(xs[0], op=reduce_op, name=op.name, process_set=ps)


def _same(got: Any, want: Any, close: bool = False) -> bool:
    """Equal (``close``: within the dtype's rounding, for Adasum's dot products)."""
    if isinstance(want, list):
        return len(got) == len(want) and all(_same(g, w, close) for g, w in zip(got, want))
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not close:
        return np.array_equal(got, want)
    tol = {8: 1e-12, 4: 1e-5}.get(want.dtype.itemsize, 1e-2)
    w = want.astype(np.float64)
    return np.allclose(got.astype(np.float64), w, rtol=tol,
                       atol=tol * max(1.0, float(np.abs(w).max(initial=0.0))))


def run(seed: int, count: int = 60, threads: int = 3, faults: bool = False) -> Dict[str, Any]:
    """Submit the mix in a rank-dependent order from ``threads`` threads (each its own share,
    also rank-dependent), every tenth op of a thread followed by a blocking all-reduce of the
    world that every rank makes in the same order; wait in another order. An op with a bad
    member must raise CollectiveMismatchError naming that rank on every member. Returns what
    went wrong (nothing, when all is well) and how many results were checked."""
    rank, size = hvd.rank(), hvd.size()
    ops = plan(seed, size, count, faults)
    sets = [hvd.global_process_set] + [hvd.add_process_set(r) for r in set_ranks(size)[1:]]
    mine = [op for op in ops if rank in op.members]
    random.Random(seed * 1000 + rank).shuffle(mine)
    shares: List[List[Op]] = [mine[t::threads] for t in range(threads)]
    handles: Dict[int, Any] = {}
    errors: List[str] = []
    lock = threading.Lock()
    # the blocking calls: made by thread 0 only, in the same order on every rank
    blocking = [np.full(4, float(rank + b)) for b in range(count // 10)]
    blocking_got: List[Optional[np.ndarray]] = [None] * len(blocking)

    def work(t: int) -> None:
        try:
            b = 0
            for k, op in enumerate(shares[t]):
                handle = _submit(op, rank, sets)
                with lock:
                    handles[op.index] = handle
                if t == 0 and k % 10 == 9 and b < len(blocking):
                    blocking_got[b] = hvd.allreduce(blocking[b], op=hvd.Sum, name=f"mix.b{b}")
                    b += 1
            while t == 0 and b < len(blocking):
                blocking_got[b] = hvd.allreduce(blocking[b], op=hvd.Sum, name=f"mix.b{b}")
                b += 1
        except Exception as exc:  # noqa: BLE001 - reported with the results
            with lock:
                errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    waits = sorted(handles, key=lambda i: random.Random(seed + i + 7 * rank).random())
    checked = 0
    for i in waits:
        op = ops[i]
        try:
            got = handles[i].synchronize()
            if op.kind == "alltoall":  # the async form always gives the splits too
                got, splits = got
                if splits.tolist() != [op.sizes[0]] * len(op.members):
                    errors.append(f"{op}: received splits {splits.tolist()}")
        except Exception as exc:  # noqa: BLE001
            named = f"rank {op.members[op.bad]} has" in str(exc) if op.bad >= 0 else False
            if not (isinstance(exc, hvd.CollectiveMismatchError) and named):
                errors.append(f"{op}: {type(exc).__name__}: {exc}")
            checked += 1
            continue
        if op.bad >= 0:
            errors.append(f"{op}: no error, got {got!r}")
        elif not _same(got, _expected(op, rank), op.op == "Adasum"):
            errors.append(f"{op}: got {got!r}, want {_expected(op, rank)!r}")
        checked += 1
    for b, got in enumerate(blocking_got):
        want = np.full(4, float(sum(r + b for r in range(size))))
        if got is None or not np.array_equal(got, want):
            errors.append(f"blocking mix.b{b}: got {got!r}, want {want!r}")
        checked += 1
    for ps in sets[1:]:
        hvd.remove_process_set(ps)
    return dict(errors=errors, checked=checked, expected=len(mine) + len(blocking))


def run_seeds(first: int, count: int, faults: bool = False) -> Dict[str, Any]:
    """``run`` for seeds first..first+count-1, one after the other in one job (each seed
    gives its names new metadata: cached names are negotiated again)."""
    errors: List[str] = []
    checked = expected = 0
    for seed in range(first, first + count):
        result = run(seed, faults=faults)
        errors += [f"seed {seed}: {e}" for e in result["errors"]]
        checked += result["checked"]
        expected += result["expected"]
    return dict(errors=errors, checked=checked, expected=expected)


def uneven_steps(seed: int) -> Dict[str, Any]:
    """A training loop with a rank-dependent number of steps, then ``join``: each step
    submits named Sum and Average all-reduces (one grouped) async in a rank-dependent order;
    a rank that has joined counts as zeros. Returns what went wrong and what join returned."""
    rank, size = hvd.rank(), hvd.size()
    rng = random.Random(seed)
    steps = [rng.randint(1, 6) for _ in range(size)]
    shapes = [rng.choice([1, 5, 300, 70000]) for _ in range(4)]
    order = random.Random(seed * 1000 + rank)
    errors: List[str] = []

    def value(r: int, step: int, t: int) -> np.ndarray:
        return np.random.default_rng([seed, r, step, t]).integers(-3, 4, shapes[t]).astype(
            np.float32)

    for step in range(steps[rank]):
        calls = list(range(3))
        order.shuffle(calls)
        handles: Dict[int, Any] = {}
        for c in calls:
            if c == 0:
                handles[c] = hvd.allreduce_async(value(rank, step, 0), op=hvd.Sum, name="u.0")
            elif c == 1:
                handles[c] = hvd.allreduce_async(value(rank, step, 1), op=hvd.Average,
                                                 name="u.1")
            else:
                handles[c] = hvd.grouped_allreduce_async(
                    [value(rank, step, 2), value(rank, step, 3)], op=hvd.Sum, name="u.g")
        live = [r for r in range(size) if steps[r] > step]
        want = {0: sum(value(r, step, 0) for r in live),
                1: sum(value(r, step, 1) for r in live) * np.float32(1.0 / size),
                2: [sum(value(r, step, t) for r in live) for t in (2, 3)]}
        for c in sorted(handles, key=lambda _: order.random()):
            got = handles[c].synchronize()
            if not _same(got, [w.astype(np.float32) for w in want[c]] if c == 2
                         else want[c].astype(np.float32)):
                errors.append(f"step {step} call {c}: got {got!r}, want {want[c]!r}")
    last = hvd.join()
    most = max(steps)
    if steps[last] != most:
        errors.append(f"join returned {last}, which ran {steps[last]} steps; steps: {steps}")
    return dict(errors=errors, last=last)


def uneven_steps_seeds(first: int, count: int) -> Dict[str, Any]:
    """``uneven_steps`` for seeds first..first+count-1 in one job."""
    errors: List[str] = []
    lasts = []
    for seed in range(first, first + count):
        result = uneven_steps(seed)
        errors += [f"seed {seed}: {e}" for e in result["errors"]]
        lasts.append(result["last"])
    return dict(errors=errors, lasts=lasts)
