"""The engine seen from each rank: requests matched by name in any order, async calls that
return before the peers arrive, repeated names, several threads, changed metadata."""
import threading
import time
from typing import Any, Dict, List

import numpy as np

import hvdlike as hvd


def _value(name: str, rank: int) -> np.ndarray:
    return np.full(5, 10.0 * (sum(map(ord, name)) % 97) + rank, np.float64)


def any_order(names: List[str]) -> Dict[str, Any]:
    """Every rank submits the same named async all-reduces in its own order (rotated by
    rank, reversed on odd ranks), then waits for them in yet another order."""
    rank = hvd.rank()
    k = rank % len(names)
    order = names[k:] + names[:k]
    if rank % 2:
        order = order[::-1]
    handles = {n: hvd.allreduce_async(_value(n, rank), op=hvd.Sum, name=n) for n in order}
    gathered = hvd.allgather_async(np.full((rank + 1, 2), rank), name="gather")
    return dict(order=order, sums={n: handles[n].synchronize().tolist() for n in sorted(names)},
                gathered=gathered.synchronize()[:, 0].tolist())


def async_returns_before_peers(delay: float) -> Dict[str, Any]:
    """The last rank submits ``delay`` seconds late; the others' handles are not done right
    after submitting (so submitting did not wait for the peer) and complete correctly."""
    rank, size = hvd.rank(), hvd.size()
    if rank == size - 1:
        time.sleep(delay)
    handle = hvd.allreduce_async(np.full(3, rank + 1.0), op=hvd.Sum, name="late")
    done_at_once = handle.poll()
    return dict(done_at_once=done_at_once, result=handle.synchronize().tolist())


def blocking_pairs_with_async() -> List[float]:
    """A blocking call on one rank and the async form on another share a name: they pair."""
    x = np.full(2, hvd.rank() + 1.0)
    if hvd.rank() % 2:
        return hvd.allreduce_async(x, op=hvd.Sum, name="mixed").synchronize().tolist()
    return hvd.allreduce(x, op=hvd.Sum, name="mixed").tolist()


def repeated_name(times: int) -> List[float]:
    """One name submitted several times before any is waited for: instance i pairs with
    instance i on every rank."""
    rank = hvd.rank()
    handles = [hvd.allreduce_async(np.array([float(i * 100 + rank)]), op=hvd.Sum, name="step")
               for i in range(times)]
    return [h.synchronize()[0] for h in handles]


def threads(names: List[str]) -> Dict[str, Any]:
    """One thread per name makes blocking calls; thread start order depends on the rank."""
    rank = hvd.rank()
    out: Dict[str, Any] = {}
    order = names if rank % 2 == 0 else names[::-1]

    def work(name: str) -> None:
        out[name] = [hvd.allreduce(_value(name, rank), op=hvd.Sum, name=name).tolist()
                     for _ in range(3)]

    workers = [threading.Thread(target=work, args=(n,)) for n in order]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    return out


def metadata_changes() -> List[Any]:
    """A cached name comes back with another shape, then the old one again: each pairs."""
    rank = hvd.rank()
    out = []
    for n in (3, 3, 5, 3):
        out.append(hvd.allreduce(np.full(n, rank + 1.0), op=hvd.Sum, name="grad").tolist())
    return out


def grouped_shared_memory_from_many_tensors(sizes: List[int]) -> Dict[str, Any]:
    """A grouped all-reduce of many tensors, reduced straight from their memory: results equal
    the per-tensor NumPy sums and the inputs are untouched."""
    rank = hvd.rank()
    xs = [np.arange(n, dtype=np.float32) * (rank + 1) for n in sizes]
    before = [x.copy() for x in xs]
    got = hvd.grouped_allreduce(xs, op=hvd.Sum, name="many")
    avg = hvd.grouped_allreduce(xs, op=hvd.Average, name="many-avg")
    return dict(sum=[g.tolist() for g in got], avg=[a.tolist() for a in avg],
                inputs_intact=all(np.array_equal(a, b) for a, b in zip(xs, before)))


def unnamed_loop(calls: int) -> Dict[str, Any]:
    """``calls`` unnamed all-reduces (more than the engine's names for them): every result
    right, and the names the engine cycles through stay in its cache."""
    from hvdlike import runtime
    from hvdlike.engine.engine import NONAME_NAMES

    rank = hvd.rank()
    wrong = [i for i in range(calls)
             if hvd.allreduce(np.full(4, float(i + rank)), op=hvd.Sum)[0] != 2 * i + 1]
    cached = [k for k in runtime.state().engine._neg._cache if k[1].startswith("noname.")]
    return dict(wrong=wrong, cached=len(cached), names=NONAME_NAMES)


def join_after_many_unnamed(steps: int) -> Dict[str, Any]:
    """Rank 0 runs ``steps`` unnamed all-reduces while rank 1 has joined after 2; afterwards
    both number their unnamed calls alike, so their next unnamed calls pair up."""
    rank = hvd.rank()
    for i in range(steps if rank == 0 else 2):
        hvd.allreduce(np.ones(3), op=hvd.Sum)
    hvd.join()
    after = [hvd.allreduce(np.full(2, float(rank + i)), op=hvd.Sum).tolist() for i in range(3)]
    return dict(after=after)


def blocking_calls_in_rounds_of_their_own(steps: int) -> Dict[str, Any]:
    """Blocking calls that run in a round of their own on the calling thread (the latency
    path), next to the cases where it cannot: a late peer, a peer announcing a new name in the
    same round, other kinds of collective, a process set, unnamed calls. Every result is
    checked against NumPy by the test."""
    from hvdlike import runtime

    rank, size = hvd.rank(), hvd.size()
    engine = runtime.state().engine
    before = engine.direct_runs
    sums = [hvd.allreduce(np.full(3, float(i * size + rank)), op=hvd.Sum, name="a")[0]
            for i in range(steps)]
    direct = engine.direct_runs - before
    if rank == size - 1:
        time.sleep(0.2)  # the others' calls find this rank not ready, and wait
    late = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, name="a").tolist()
    if rank == 0:  # a new name announced in the round where the others run "a" directly
        handle = hvd.allreduce_async(np.full(2, 1.0), op=hvd.Sum, name="fresh")
        mixed = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, name="a").tolist()
    else:
        mixed = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, name="a").tolist()
        handle = hvd.allreduce_async(np.full(2, 1.0), op=hvd.Sum, name="fresh")
    fresh = handle.synchronize().tolist()
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    in_set = None
    if rank % 2 == 0:
        in_set = [hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, name="s",
                                process_set=evens).tolist() for _ in range(3)]
    others = []
    for _ in range(3):
        hvd.barrier()
        others.append(dict(
            bcast=hvd.broadcast(np.full(2, float(rank)), root_rank=size - 1, name="b").tolist(),
            gather=hvd.allgather(np.full((1, 2), float(rank)), name="g")[:, 0].tolist(),
            unnamed=hvd.allreduce(np.full(2, float(rank)), op=hvd.Average).tolist(),
            obj=hvd.broadcast_object({"r": rank}, root_rank=0)))
    return dict(sums=sums, direct=direct, late=late, mixed=mixed, fresh=fresh, in_set=in_set,
                others=others)


def without_response_cache(steps: int) -> Dict[str, Any]:
    """HVDLIKE_CACHE_CAPACITY=0: a loop of blocking named calls, then the random mix of
    engine_mix_cases; the engine must remember no request and run none on the latency path
    (which needs a cached name)."""
    import engine_mix_cases
    from hvdlike import runtime

    rank, size = hvd.rank(), hvd.size()
    engine = runtime.state().engine
    sums = [hvd.allreduce(np.full(3, float(i * size + rank)), op=hvd.Sum, name="a")[0]
            for i in range(steps)]
    mix = engine_mix_cases.run_seeds(first=0, count=3)
    return dict(sums=sums, mix_errors=mix["errors"], direct=engine.direct_runs,
                cached=len(engine._neg._cache))


def async_steps(steps: int, pause: float) -> Dict[str, Any]:
    """A training loop's pattern: every rank submits one async all-reduce a step, computes
    (``pause``), waits for it, computes again. Returns the sums, the rounds the engine ran,
    and the least time from a round to a round after it in which no rank had anything."""
    from hvdlike import runtime

    rank, size = hvd.rank(), hvd.size()
    engine = runtime.state().engine
    # announced once: from here the name is cached. A round that publishes is followed by a
    # tick; a step like the loop's then ends in a round that ran all the work there was
    hvd.allreduce(np.zeros(4), op=hvd.Sum, name="g")
    hvd.allreduce_async(np.zeros(4), op=hvd.Sum, name="g").synchronize()
    before = engine._round_no
    engine._idle_gap = float("inf")
    sums = []
    for i in range(steps):
        handle = hvd.allreduce_async(np.full(4, float(i * size + rank)), op=hvd.Sum, name="g")
        time.sleep(pause)
        sums.append(handle.synchronize().tolist())
        time.sleep(pause)
    return dict(sums=sums, rounds=engine._round_no - before, idle_gap=engine._idle_gap,
                cycle=engine._cycle)


def set_with_an_idle_rank(steps: int, pause: float) -> Dict[str, Any]:
    """Ranks 0 and 1 run blocking all-reduces on a set of their own, ``pause`` apart, while
    rank 2, in no set with work, only keeps them company: what its engine did meanwhile
    (sampled every 5 ms), the rounds run during the set's loop, the sums."""
    from hvdlike import runtime

    rank = hvd.rank()
    engine = runtime.state().engine
    pair = hvd.add_process_set([0, 1])
    hvd.barrier()
    before = engine._round_no
    sums, samples = [], []
    if rank in (0, 1):
        for i in range(steps):
            sums.append(hvd.allreduce(np.full(2, float(10 * i + rank)), op=hvd.Sum, name="s",
                                      process_set=pair).tolist())
            time.sleep(pause)
    else:
        time.sleep(0.1)
        for _ in range(40):
            now = time.monotonic()
            samples.append((engine._company_until > now, engine._helper))
            time.sleep(0.005)
    rounds = engine._round_no - before
    hvd.barrier()
    return dict(sums=sums, samples=samples, rounds=rounds)
